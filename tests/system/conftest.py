"""The system tier: one real systemd, booted once per session in a throwaway root.

``system_root`` boots it (tests/system/sysroot.py) and installs the project
into it the way an administrator would; every test in this directory is
marked ``system`` and shares that root, so each test uses its own job
payloads and only asserts on its own jobs.

When the machine cannot provide the test bed (not root, no overlayfs, no
namespaces, no systemd) the tests are SKIPPED with the reason, unless
``STEADQ_SYSTEM_TESTS=require`` is set: then they FAIL with it (for CI, which
must not silently lose this tier). ``STEADQ_SYSTEM_TESTS=skip`` skips the
tier on purpose.

Teardown proves the root left nothing behind: the namespace's processes are
gone, no mount or cgroup of the harness remains, and a canary file created
in the host's /tmp before the boot still exists (systemd-tmpfiles on the
wrong root would have removed it). A leak fails the session's last test.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.prereq import opted_out

from . import sysroot
from .sysroot import SystemdRoot

PROJECT = Path(__file__).resolve().parents[2]
# The root's /tmp and /run are fresh tmpfs instances: a checkout or venv there
# (e.g. a CI clone under /tmp) is bind-mounted read-only at the same path.
HIDDEN_PREFIXES = ("/tmp/", "/run/", "/dev/")
EXTRA_BINDS = tuple(sorted({p for p in (str(PROJECT), os.path.realpath(sys.prefix)) if p.startswith(HIDDEN_PREFIXES)}))

VENV = "/opt/steadq/venv"  # the venv the test root "installs" (see install_project)
RESULTS = "/var/lib/steadq/results"
DEADLINE = 60.0  # generous: a loaded 2-core CI box; waits end as soon as the fact holds

# The job command. Instructions come in the payload (stdin):
#   ok[:TEXT]      print a line, exit 0
#   fail[:TEXT]    print "boom: TEXT" on stderr, exit 100 (bury)
#   block:NAME     wait until $RESULTS/release-NAME exists, then exit 0
#   write:PATH     try to create PATH (hardening checks), exit 100 if that fails
# Every run appends "<queue> <job_id> <attempt> start|done" to $RESULTS/runs.log
# (short O_APPEND writes: atomic between concurrent jobs).
JOB_SCRIPT = r"""#!/bin/sh
set -u
R=/var/lib/steadq/results
payload=$(cat)
echo "$STEADQ_QUEUE $STEADQ_JOB_ID $STEADQ_ATTEMPT start" >> "$R/runs.log"
case "$payload" in
  fail*)
    echo "boom: ${payload#fail}" >&2
    exit 100 ;;
  block:*)
    name=${payload#block:}
    i=0
    while [ ! -e "$R/release-$name" ]; do
      sleep 0.1
      i=$((i + 1))
      [ "$i" -lt 1200 ] || { echo "never released: $name" >&2; exit 75; }
    done ;;
  write:*)
    target=${payload#write:}
    if ! echo x 2>/dev/null > "$target"; then
      echo "cannot write $target" >&2
      echo "$STEADQ_QUEUE $STEADQ_JOB_ID $STEADQ_ATTEMPT denied $target" >> "$R/runs.log"
      exit 100
    fi
    echo "$STEADQ_QUEUE $STEADQ_JOB_ID $STEADQ_ATTEMPT wrote $target" >> "$R/runs.log" ;;
esac
echo "done job=$STEADQ_JOB_ID attempt=$STEADQ_ATTEMPT payload=$payload"
echo "$STEADQ_QUEUE $STEADQ_JOB_ID $STEADQ_ATTEMPT done" >> "$R/runs.log"
"""


def queue_yaml(name: str, concurrency: int = 2) -> str:
    """The test queues' configuration: short leases and sweeps keep recovery fast."""
    return f"""# written by tests/system/conftest.py
queue: /var/lib/steadq/{name}
worker:
  command: ["/usr/local/bin/steadq-test-job"]
  concurrency: {concurrency}
  lease: 4s
  kill_grace: 2s
  exit_status:
    ack: [0]
    retry: [75]
    bury: [100]
  retry:
    backoff_base: 100ms
    backoff_max: 500ms
sweeper:
  interval: 500ms
promoter:
  max_sleep: 1s
"""


def _unavailable(reason: str) -> None:
    mode = os.environ.get("STEADQ_SYSTEM_TESTS", "")
    if mode == "require":
        pytest.fail(f"system tests required (STEADQ_SYSTEM_TESTS=require) but unavailable: {reason}", pytrace=False)
    pytest.skip(f"system tests unavailable: {reason}")


def _reap_stale_canaries() -> None:
    """Remove canaries of earlier sessions that were killed before their teardown (owner PID gone)."""
    for c in Path("/tmp").glob("steadq-canary-*-*"):
        try:
            owner = int(c.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if not os.path.exists(f"/proc/{owner}"):
            c.unlink(missing_ok=True)


def _ns_inode(pid: int, ns: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{ns}")
    except OSError:
        return None


def _processes_in(ns_link: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_inode(int(entry), "pid") == ns_link:
            pids.append(int(entry))
    return pids


RUNTIME_MODULES = ("steadqd", "cffi", "_cffi_backend", "pycparser", "systemd", "yaml", "_yaml", "inotify_simple")


def runtime_paths(names: tuple[str, ...] = RUNTIME_MODULES) -> list[str]:
    """Files and package dirs of steadqd and its runtime dependencies, as installed here.

    They are copied into the root's venv rather than referenced: the units'
    PrivateTmp= hides a checkout or venv under /tmp (where CI may clone) from
    the services, and a real installation does not point into a checkout.
    """
    import importlib.util

    paths = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue  # optional (e.g. yaml's C extension)
        origin = Path(spec.origin)
        paths.append(str(origin.parent if spec.submodule_search_locations else origin))
    return paths


def install_project(root: SystemdRoot) -> None:
    """Install steadqd into the root like an administrator would.

    The interpreter the project's venv was built with lives under /root here
    (pyenv), and ``ProtectHome=yes`` in the units hides /root from the
    daemons; boot.sh therefore bind-mounts that Python installation at
    /opt/steadq-python (read-only) and this registers its lib/ with ldconfig
    (its RUNPATH points into /root). A venv at /opt/steadq/venv built from
    that interpreter gets copies of steadqd and its runtime dependencies
    (:func:`runtime_paths`), so nothing of the host's venv is used or
    modified, and /usr/bin/steadqd and /usr/bin/steadq are the console
    entry points, as the docs' "symlink into /usr/bin" installation.
    """
    units = PROJECT / "units"
    root.sh(
        f"""
        echo /opt/steadq-python/lib > /etc/ld.so.conf.d/steadq-python.conf
        ldconfig
        /opt/steadq-python/bin/python3 -m venv --without-pip {VENV}
        site=$({VENV}/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        cp -a {" ".join(runtime_paths())} "$site/"
        for cmd in steadqd:daemon_main:steadqd.daemon.main steadq:main:steadqd.cli.main; do
            name=${{cmd%%:*}}; rest=${{cmd#*:}}; fn=${{rest%%:*}}; mod=${{rest#*:}}
            printf '#!{VENV}/bin/python3\\nimport sys\\nfrom %s import %s\\nsys.exit(%s())\\n' "$mod" "$fn" "$fn" \
                > {VENV}/bin/$name
            chmod 0755 {VENV}/bin/$name
            ln -sf {VENV}/bin/$name /usr/bin/$name
        done
        install -m 0644 {units}/*.service {units}/*.target /usr/lib/systemd/system/
        install -m 0644 {units}/steadq.sysusers.conf /usr/lib/sysusers.d/steadq.conf
        install -m 0644 {units}/steadq.tmpfiles.conf /usr/lib/tmpfiles.d/steadq.conf
        systemd-sysusers /usr/lib/sysusers.d/steadq.conf
        systemd-tmpfiles --create /usr/lib/tmpfiles.d/steadq.conf
        systemctl daemon-reload
        systemctl enable steadq.target
        """
    )
    root.run("install", "-m", "0755", "/dev/stdin", "/usr/local/bin/steadq-test-job", input=JOB_SCRIPT)
    root.sh(f"install -d -m 2770 -o steadq -g steadq {RESULTS}")
    # A producer that is not root, only a member of the steadq group.
    root.run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", "steadq", "producer")
    root.run("install", "-d", "-m", "0755", "/etc/steadq/queues")


def init_queue(root: SystemdRoot, name: str, concurrency: int = 2) -> None:
    """Create a shared queue and its config, as the docs tell an administrator to.

    ``steadq init`` has no flag for shared queues; a root directory that already
    grants its group access makes the library create everything inside
    group-accessible (constants.SHARED_MODES), so the directory is created
    2770 steadq:steadq first and then initialised as the steadq user.
    """
    path = f"/var/lib/steadq/{name}"
    root.run("install", "-d", "-m", "2770", "-o", "steadq", "-g", "steadq", path)
    root.run("/usr/bin/steadq", "init", path, "--shards", "4", user="steadq")
    write_config(root, name, queue_yaml(name, concurrency))


def write_config(root: SystemdRoot, name: str, text: str) -> None:
    root.run("install", "-m", "0644", "/dev/stdin", f"/etc/steadq/queues/{name}.yaml", input=text)


@pytest.fixture(scope="package")
def system_root() -> Iterator[SystemdRoot]:
    """The booted and installed root, torn down and leak-checked after the last test of tests/system.

    Package scope: it boots once per session (every system test lives in this
    package) and does not stay up idle while a full suite runs other tiers.
    """
    if os.environ.get("STEADQ_SYSTEM_TESTS") == "skip":
        opted_out("system tests disabled (STEADQ_SYSTEM_TESTS=skip)")
    try:
        sysroot.check_prerequisites()
    except sysroot.Unavailable as e:
        _unavailable(str(e))
    sysroot.reap_stale()
    _reap_stale_canaries()
    canary = Path("/tmp") / f"steadq-canary-{os.getpid()}-{secrets.token_hex(4)}"
    canary.write_text("systemd in the test root must never see this file\n")
    root = SystemdRoot(binds=EXTRA_BINDS)
    pid_ns = None
    problems: list[str] = []
    try:
        state = root.boot()
        pid_ns = _ns_inode(root.pid1, "pid") if root.pid1 else None
        if state != "running":
            raise AssertionError(f"the test root booted {state}; failed units:\n{root.failed_units()}")
        root.stop_foreign_units()
        install_project(root)
        init_queue(root, "demo")
        yield root
    finally:
        problems = root.cleanup()
        if pid_ns is not None:
            for _ in range(50):
                left = _processes_in(pid_ns)
                if not left:
                    break
                time.sleep(0.1)
            else:
                problems.append(f"processes left in the test root's PID namespace: {left}")
        if not canary.exists():
            problems.append(f"the host's /tmp canary {canary} disappeared")
        canary.unlink(missing_ok=True)
        if root.dir is not None and (os.path.exists(root.dir) or sysroot.host_mounts_under(root.dir)):
            problems.append(f"{root.dir} or a mount below it is still there")
    if problems:
        raise AssertionError("the system test root leaked:\n" + "\n".join(problems))


# -- helpers the tests share ----------------------------------------------------


def wait_for(what: str, fn: Callable[[], object], timeout: float = DEADLINE, interval: float = 0.1) -> object:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def runs(root: SystemdRoot) -> list[tuple[str, ...]]:
    """The job command's run log, read through the host's view of the spool."""
    try:
        text = Path(root.host_path(f"{RESULTS}/runs.log")).read_text()
    except FileNotFoundError:
        return []
    return [tuple(line.split()) for line in text.splitlines() if line.strip()]


def events(root: SystemdRoot, job_id: str, what: str) -> list[tuple[str, ...]]:
    return [r for r in runs(root) if r[1] == job_id and r[3] == what]


def release(root: SystemdRoot, name: str) -> None:
    root.run("touch", f"{RESULTS}/release-{name}", user="steadq")


def put(root: SystemdRoot, queue: str, payload: str, *extra: str, user: str = "producer") -> str:
    """Enqueue with the CLI as ``user``; returns the job id."""
    r = root.run("/usr/bin/steadq", "put", f"/var/lib/steadq/{queue}", "-", *extra, user=user, input=payload)
    for line in r.stdout.splitlines():
        if line.startswith("job_id: "):
            return line.split()[1]
    raise AssertionError(f"no job_id in: {r.stdout!r} {r.stderr!r}")


def journal(root: SystemdRoot, *matches: str) -> list[dict[str, object]]:
    """Journal entries (JSON) matching ``matches`` (FIELD=value or -u UNIT)."""
    r = root.run("journalctl", "--no-pager", "-o", "json", *matches, check=False)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def main_pid(root: SystemdRoot, unit: str) -> int:
    return int(root.run("systemctl", "show", "-P", "MainPID", unit).stdout.strip() or 0)


def queue_state(root: SystemdRoot, name: str) -> dict[str, set[str]]:
    """Job ids per state, by the independent tree walker (tests/invariants.py) on the host's view.

    The daemons may be moving a job while the walk runs (a walk is not a snapshot: an ack
    or bury caught between two directory listings shows the job twice), so a failed walk
    is repeated; a violation that persists still fails.
    """
    from tests.invariants import live_tree

    ts = live_tree(root.host_path(f"/var/lib/steadq/{name}"), attempts=20, interval=0.1)
    return {
        "ready": set(ts.ready),
        "leased": set(ts.leased),
        "delayed": set(ts.delayed),
        "dead": set(ts.dead),
        "receipts": set(ts.receipts),
    }
