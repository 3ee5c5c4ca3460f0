"""A bucket queue under real systemd: ``systemctl enable --now steadq-worker@bucket`` on ``queue: s3://...``.

The SeaweedFS it talks to is started by the test *inside* the root's own
network namespace (a transient unit, every port on 127.0.0.1 there), so
nothing listens outside it. The queue's YAML names a credentials file
readable only by ``steadq``; the endpoint comes from the queue's ``.env``
file, as docs/stowq.md tells an administrator. A job put by the producer runs
and is acked, the journal has the usual MESSAGE texts, ``systemctl status``
is readable, and a credentials file others can read fails the start once
with exit 78 and no restart.
"""

from __future__ import annotations

import json

import pytest

from steadqd.demo import seaweed as launcher
from tests.stowq import seaweed

from .conftest import VENV, events, journal, runs, runtime_paths, wait_for
from .sysroot import SystemdRoot

pytestmark = pytest.mark.system

# botocore and what it imports: an extra (steadqd[s3]) that install_project does not copy.
S3_MODULES = ("botocore", "jmespath", "dateutil", "urllib3", "six")
NAME = "bucket"
BUCKET = "steadq-sys"
URL = f"s3://{BUCKET}/render"
DATA = "/var/lib/steadq-weed"  # on the root's tmpfs upper layer: gone with the root
PORTS = dict(zip(launcher.PORT_NAMES, range(18330, 18330 + len(launcher.PORT_NAMES)), strict=True))
ENDPOINT = f"http://127.0.0.1:{PORTS['s3']}"
CREDENTIALS = f"/etc/steadq/{NAME}.aws"
UNIT = f"steadq-worker@{NAME}.service"
AWS_KEYS = {"AWS_ACCESS_KEY_ID": seaweed.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": seaweed.SECRET_KEY}
AWS_PLACE = {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_REGION": "us-east-1"}

YAML = f"""# written by tests/system/test_bucket_units_e2e.py
queue: {URL}
s3:
  credentials_file: {CREDENTIALS}
  store_profile: seaweedfs
worker:
  command: ["/usr/local/bin/steadq-test-job"]
  lease: 4s
sweeper:
  interval: 1s
"""


def _python(root: SystemdRoot, code: str) -> str:
    return root.run(f"{VENV}/bin/python3", "-c", code, env={**AWS_PLACE, **AWS_KEYS}, check=False).stdout


def _start_store(root: SystemdRoot) -> None:
    """botocore for the root's venv, then ``weed server`` as a transient unit, then the bucket."""
    site = root.run(f"{VENV}/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # Copied, as install_project copies the rest: the units' PrivateTmp= hides a venv under /tmp (CI's clone).
    root.run("cp", "-a", *runtime_paths(S3_MODULES), site.stdout.strip())
    weed = seaweed.weed_binary()
    assert weed is not None
    identities = {
        "identities": [
            {
                "name": "steadq-test",
                "credentials": [{"accessKey": seaweed.ACCESS_KEY, "secretKey": seaweed.SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    root.run("install", "-d", "-m", "0700", f"{DATA}/data")
    root.run("install", "-m", "0600", "/dev/stdin", f"{DATA}/s3-identities.json", input=json.dumps(identities))
    command = launcher.server_command(
        weed, DATA, PORTS, f"{DATA}/s3-identities.json", volume_max=seaweed.VOLUME_MAX, auto_create_bucket=False
    )
    root.run("systemd-run", "--unit=steadq-test-weed", "--collect", *command)
    probe = (
        "from steadqd.s3.store.s3 import S3Settings, S3Store\n"
        f"s = S3Store(S3Settings(bucket={BUCKET!r}))\n"
        "s.create_bucket(); print('ready')\n"
    )
    wait_for("weed server inside the root", lambda: "ready" in _python(root, probe))


def _install_queue(root: SystemdRoot) -> None:
    root.run("install", "-m", "0600", "-o", "steadq", "-g", "steadq", "/dev/stdin", CREDENTIALS,
             input=f"[default]\naws_access_key_id = {seaweed.ACCESS_KEY}\n"
                   f"aws_secret_access_key = {seaweed.SECRET_KEY}\n")  # fmt: skip
    env = "".join(f"{k}={v}\n" for k, v in AWS_PLACE.items())
    root.run("install", "-m", "0644", "/dev/stdin", f"/etc/steadq/queues/{NAME}.env", input=env)
    root.run("install", "-m", "0644", "/dev/stdin", f"/etc/steadq/queues/{NAME}.yaml", input=YAML)
    root.run("systemctl", "daemon-reload")
    # The library makes the queue (steadq init cannot name the SeaweedFS profile); certified here once.
    made = _python(
        root,
        "from steadqd.backend import init_queue\n"
        f"init_queue({URL!r}, shards=4, store_profile='seaweedfs', credentials_file={CREDENTIALS!r}).close()\n"
        "print('made')\n",
    )
    assert "made" in made, made


def _put(root: SystemdRoot, payload: str) -> str:
    r = root.run("/usr/bin/steadq", "put", URL, "-", user="producer", input=payload, env={**AWS_PLACE, **AWS_KEYS})
    for line in r.stdout.splitlines():
        if line.startswith("job_id: "):
            return line.split()[1]
    raise AssertionError(f"no job_id in: {r.stdout!r} {r.stderr!r}")


def test_a_bucket_queue_under_systemd(system_root: SystemdRoot) -> None:
    root = system_root
    try:
        _start_store(root)
        _install_queue(root)
        root.run("systemctl", "enable", "--now", UNIT)
        wait_for(
            f"{UNIT} active", lambda: root.run("systemctl", "is-active", UNIT, check=False).stdout.strip() == "active"
        )
        job = _put(root, "ok:from a bucket")
        wait_for("the job to run and be acked", lambda: events(root, job, "done"))
        finished = wait_for(
            "job finished: ack in the journal",
            lambda: [
                e
                for e in journal(root, f"STEADQ_QUEUE={NAME}", f"STEADQ_JOB_ID={job}")
                if str(e.get("MESSAGE", "")).startswith(f"job {job[:8]} finished: ack")
            ],  # fmt: skip
        )
        assert isinstance(finished, list) and finished[0].get("_SYSTEMD_UNIT") == UNIT
        messages = [str(e.get("MESSAGE", "")) for e in journal(root, f"STEADQ_JOB_ID={job}")]
        assert any(m.startswith(f"job {job[:8]} started (attempt 1/3") for m in messages), messages
        assert [r for r in runs(root) if r[1] == job and r[3] == "start"] == [(NAME, job, "1", "start")]
        status = root.run("systemctl", "status", "--no-pager", UNIT, check=False).stdout
        assert 'Status: "worker: ' in status and "? ready" in status, status
        promoter = f"steadq-promoter@{NAME}.service"
        assert root.run("systemctl", "show", "-P", "Result", promoter).stdout.strip() == "success"
        promoted = [str(e.get("MESSAGE", "")) for e in journal(root, f"_SYSTEMD_UNIT={promoter}")]
        assert any("promoter not needed on a bucket queue" in m for m in promoted), promoted
        # The stock sweeper unit reaches the store (no drop-in): a pass is made and nothing restarted.
        sweeper = f"steadq-sweeper@{NAME}.service"
        wait_for(
            "the sweeper's first pass over the bucket",
            lambda: "last pass" in root.run("systemctl", "show", "-P", "StatusText", sweeper).stdout,
        )
        assert root.run("systemctl", "show", "-P", "NRestarts", sweeper).stdout.strip() == "0"

        # A credentials file others can read: the start fails once, exit 78, one line, no restart.
        root.run("chmod", "0644", CREDENTIALS)
        assert root.run("systemctl", "restart", UNIT, check=False).returncode != 0
        wait_for(
            f"{UNIT} failed", lambda: root.run("systemctl", "is-failed", UNIT, check=False).stdout.strip() == "failed"
        )
        assert root.run("systemctl", "show", "-P", "ExecMainStatus", UNIT).stdout.strip() == "78"
        assert root.run("systemctl", "show", "-P", "NRestarts", UNIT).stdout.strip() == "0"
        refused = [
            str(e.get("MESSAGE", ""))
            for e in journal(root, f"_SYSTEMD_UNIT={UNIT}")
            if "cannot start" in str(e.get("MESSAGE", ""))
        ]
        assert len(refused) == 1 and f"s3.credentials_file {CREDENTIALS}" in refused[0], refused
        assert "chmod 600" in refused[0]
    finally:
        root.run("systemctl", "disable", "--now", UNIT, check=False)
        root.run("systemctl", "stop", f"steadq-sweeper@{NAME}.service", f"steadq-promoter@{NAME}.service", check=False)
        root.run("systemctl", "reset-failed", check=False)
        root.run("systemctl", "stop", "steadq-test-weed.service", check=False)
