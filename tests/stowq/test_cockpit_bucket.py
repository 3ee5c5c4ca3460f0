"""The Cockpit page's commands on a bucket queue named by its configuration (issue 34: "works on
filesystem and bucket queues alike"), against the live SeaweedFS.

Why: the page (cockpit/steadq.js) is a client of ``steadq --json`` run as the logged-in user in
Cockpit's session, whose environment is the login's, not the units'. A bucket queue is configured
the way docs/stowq.md says: ``render.yaml`` names the URL, the credentials file and the store
profile; ``render.env`` (the units' ``EnvironmentFile=``) the endpoint and region. So every
command here runs with no ``AWS_*`` variable at all, only ``STEADQ_CONFIG_DIR``, and names the
queue by NAME, exactly as the page spawns it; each JSON document is checked for the keys the page
reads (tests/cockpit/test_page.py's lists, one place for both kinds of queue).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from steadqd.errors import ErrorKind, SteadQError
from steadqd.s3.store.s3 import _check_credentials_file
from tests.cli.test_history import _journal, _verdicts
from tests.cli.test_permission_exit import NOBODY
from tests.cockpit.test_page import (
    COUNT_KEYS,
    FRAME_KEYS,
    HISTORY_KEYS,
    HISTORY_MINUTE_KEYS,
    LIST_KEYS,
    LIST_QUEUE_KEYS,
    LS_DEAD_KEYS,
    LS_KEYS,
    PAUSED_KEYS,
    PURGE_KEYS,
    SHOW_KEYS,
)
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed
from tests.stowq.test_cli_bucket import STEADQ, aws_env, create, field

NAME = "render"
WATCH_TIMEOUT_S = 30.0


class Page:
    """``steadq`` as the page runs it: ``--json`` first, the queue by name, the login's environment."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [STEADQ, *args], input=stdin, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )

    def json(self, *args: str, code: int = 0) -> object:
        done = self.run("--json", *args)
        assert done.returncode == code, f"steadq --json {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        return json.loads(done.stdout)


@pytest.fixture
def page(seaweed: Seaweed, live_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Page, str]:
    """(the page's runner, the queue's URL): a new queue in the live bucket, configured as ``render``."""
    seaweed.store(LIVE_BUCKET).close()
    url = f"s3://{LIVE_BUCKET}/{live_prefix}q"
    create(aws_env(tmp_path, **seaweed.environment()), url, monkeypatch)
    for name in list(os.environ):  # create() set them for the library: the commands below get none
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    config = tmp_path / "queues"
    config.mkdir()
    s3 = {"credentials_file": str(seaweed.credentials_file), "store_profile": "seaweedfs"}
    doc = {"queue": url, "s3": s3, "worker": {"command": ["/bin/true"]}}
    (config / f"{NAME}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (config / f"{NAME}.env").write_text(
        f'# the units\' EnvironmentFile=\nAWS_ENDPOINT_URL={seaweed.endpoint}\nAWS_REGION="us-east-1"\n'
    )
    # The login's own endpoint (for some other store) does not decide where a configured queue is.
    env = aws_env(tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9") | {"STEADQ_CONFIG_DIR": str(config)}
    return Page(env), url


def _put(p: Page, text: str, *options: str) -> str:
    done = p.run("put", NAME, "-", *options, stdin=text)
    assert done.returncode == 0, done.stderr
    return field(done.stdout, "job_id")


def _lease(p: Page, handle: Path) -> str:
    done = p.run("lease", NAME, "--handle-file", str(handle), "--duration", "10m")
    assert done.returncode == 0, done.stderr
    return field(done.stdout, "job_id")


def _counts(p: Page) -> dict[str, int]:
    listing = p.json("list")
    assert isinstance(listing, dict)
    (entry,) = listing["queues"]
    counts: dict[str, int] = entry["counts"]
    return counts


def test_every_command_of_the_page_works_on_a_configured_bucket_queue_by_name(
    page: tuple[Page, str], tmp_path: Path
) -> None:
    p, url = page
    dead_job = _put(p, "to be buried")
    assert _lease(p, tmp_path / "dead.json") == dead_job
    assert p.run("bury", NAME, "--handle-file", str(tmp_path / "dead.json"), "--reason", "1").returncode == 0
    running_job = _put(p, "running")
    assert _lease(p, tmp_path / "running.json") == running_job
    ready_job = _put(p, "ready")
    delayed_job = _put(p, "later", "--delay", "1h")

    # All queues: `list --json` (every 5 s while the overview is open).
    listing = p.json("list")
    assert isinstance(listing, dict) and LIST_KEYS <= listing.keys()
    (entry,) = listing["queues"]
    assert LIST_QUEUE_KEYS <= entry.keys() and entry["error"] is None, entry
    assert (entry["name"], entry["queue"]) == (NAME, url)
    assert entry["counts"] == {"ready": 1, "delayed": 1, "running": 1, "dead": 1}
    assert isinstance(entry["oldest_age_seconds"]["ready"], int) and entry["paused"] is None

    # One queue: one `watch --json` (the page asks 1 s; a bucket refreshes every 2 s), ended by closing its pipe.
    watch = subprocess.Popen(
        [STEADQ, "--json", "watch", NAME, "--interval", "1s"],
        env=p.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        frames = [json.loads(watch.stdout.readline()) for _ in range(2)]
        watch.stdout.close()  # the page left the view: the reader is gone
        assert watch.wait(timeout=WATCH_TIMEOUT_S) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.stderr is not None
    assert "--interval raised to 2s (the shortest for a bucket queue: each refresh lists the bucket)" in (
        watch.stderr.read()
    )
    for frame in frames:
        assert FRAME_KEYS <= frame.keys() and COUNT_KEYS <= frame["states"].keys()
        assert (frame["queue"], frame["interval_seconds"], frame["paused"], frame["progress"]) == (url, 2.0, None, {})
        assert {k: frame["states"][k]["objects"] for k in COUNT_KEYS} == entry["counts"]
    assert frames[1]["time_ns"] - frames[0]["time_ns"] >= 1.9e9

    # Its lists, one `ls --json` per state, and the running job's lease start (`show --no-journal`).
    listed = {state: p.json("ls", NAME, state) for state in ("running", "ready", "delayed", "dead")}
    assert {s: [j["job_id"] for j in jobs] for s, jobs in listed.items()} == {  # type: ignore[union-attr]
        "running": [running_job],
        "ready": [ready_job],
        "delayed": [delayed_job],
        "dead": [dead_job],
    }
    for state, jobs in listed.items():
        assert isinstance(jobs, list)
        assert (LS_DEAD_KEYS if state == "dead" else LS_KEYS) <= jobs[0].keys(), (state, jobs[0])
    assert listed["dead"][0]["reason_name"] == "unspecified" or listed["dead"][0]["reason"] == 1  # type: ignore[index]
    lease_story = p.json("show", NAME, running_job, "--no-journal")
    assert isinstance(lease_story, dict) and lease_story["state"] == "leased"
    assert isinstance(lease_story["in_state_since_ns"], int) and lease_story["in_state_since_ns"] <= time.time_ns()

    # One job: `show --json` with its journal (this machine may have none: the story says so).
    for job in (ready_job, dead_job):
        story = p.json("show", NAME, job)
        assert isinstance(story, dict) and SHOW_KEYS <= story.keys(), SHOW_KEYS - story.keys()
    assert story["state"] == "dead" and story["payload_head_text"] == "to be buried"

    # The actions: cancel (ready, running), requeue, purge with its dry run's count, pause and resume.
    assert p.json("cancel", NAME, ready_job) == [{"job_id": ready_job, "result": "cancelled", "was": "ready"}]
    (requested,) = p.json("cancel", NAME, running_job)  # type: ignore[misc]
    assert requested["result"] == "requested" and requested["was"] == "leased"  # its worker buries it
    # A bucket's requeue enqueues a new job and leaves the dead record (docs/stowq.md, `admin requeue`):
    # the dead row stays on the page, and pressing Requeue again while the new job waits adds nothing.
    requeued = p.run("--json", "admin", "requeue", NAME, dead_job)
    assert requeued.returncode == 0, requeued.stderr
    new_job = field(requeued.stdout, "requeued_as")
    assert field(p.run("--json", "admin", "requeue", NAME, dead_job).stdout, "requeued_as") == new_job
    assert _counts(p) == {"ready": 1, "delayed": 1, "running": 1, "dead": 2}  # + the cancelled one
    assert [j["job_id"] for j in p.json("ls", NAME, "ready")] == [new_job]  # type: ignore[union-attr]
    dry = p.json("admin", "purge", NAME, "dead", "--dry-run")
    assert isinstance(dry, dict) and PURGE_KEYS <= dry.keys() and (dry["dry_run"], dry["selected"]) == (True, 2)
    assert _counts(p)["dead"] == 2
    purged = p.run("--json", "admin", "purge", NAME, "dead")
    assert purged.returncode == 0, purged.stderr
    assert _counts(p)["dead"] == 0

    paused = p.json("pause", NAME, "--reason", "<b>bucket maintenance</b>")
    assert isinstance(paused, dict) and PAUSED_KEYS <= paused["paused"].keys()
    (entry,) = p.json("list")["queues"]  # type: ignore[index]
    assert entry["paused"]["reason"] == "<b>bucket maintenance</b>"
    (frame,) = [json.loads(line) for line in p.run("--json", "watch", NAME, "--count", "1").stdout.splitlines()]
    assert frame["paused"]["reason"] == "<b>bucket maintenance</b>" and frame["interval_seconds"] == 2.0
    resumed = p.json("resume", NAME)
    assert resumed == {"resumed": True, "was": paused["paused"]}
    (entry,) = p.json("list")["queues"]  # type: ignore[index]
    assert entry["paused"] is None


def test_the_sparkline_history_of_a_bucket_queue_is_read_by_name_from_the_journal(
    page: tuple[Page, str], tmp_path: Path
) -> None:
    """`history NAME --since 1h` reads the journal only, never the bucket: the same for both kinds of queue."""
    p, _ = page
    now_us = time.time_ns() // 1000
    journal = _journal(tmp_path, _verdicts(NAME, now_us - 120_000_000))
    history = p.json("history", NAME, "--since", "1h", "--directory", str(journal))
    assert isinstance(history, dict) and HISTORY_KEYS <= history.keys() and history["queue"] == NAME
    assert all(HISTORY_MINUTE_KEYS <= row.keys() for row in history["minutes"])
    assert (history["totals"]["acked"], history["totals"]["buried"]) == (2, 2)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_a_user_who_may_not_read_the_daemons_credentials_file_is_told_so_exit_5(tmp_path: Path) -> None:
    """A queue group's member on the page cannot read the service user's 0600 credentials file. botocore
    skips a file it cannot read, so the member got "no AWS credentials found" (exit 1), which the page
    showed as is and never retried with administrative access; it is a refusal (exit 5) naming whose
    file it is, which the page turns into its sentence, or shows with administrative access."""
    for parent in tmp_path.parents:  # pytest's base is 0700: let nobody reach the file, as a member can
        parent.chmod(parent.stat().st_mode | 0o011)
    tmp_path.chmod(0o755)
    secret = tmp_path / "render.aws"
    secret.write_text("[default]\naws_access_key_id = a\naws_secret_access_key = b\n")
    secret.chmod(0o600)
    assert _check_credentials_file(str(secret)) == str(secret)  # its owner reads it
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                _check_credentials_file(str(secret))
                code = 0
            except SteadQError as e:
                os.write(w, e.message.encode())
                code = e.exit_code
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == ErrorKind.PERMISSION_DENIED.exit_code == 5, message
    assert message == (
        f"credentials file {secret}: this user may not read it (it belongs to root, mode 0600, as the queue's "
        "daemons need it): run the command as root"
    )
