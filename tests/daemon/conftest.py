"""Helpers for daemon tests: config directories, a recording job command, and
``steadqd`` roles run as real subprocesses.

Why subprocesses: the daemon's contract is with the outside world (signals,
inotify, process groups, stderr/journald, the notify socket), and only a
real process exercises it. Every wait here is a deadline on an observable
fact (a file, a log line), never a fixed sleep, so a loaded box only makes
tests slower, not flaky.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from steadqd import Queue

STEADQD = os.path.join(os.path.dirname(sys.executable), "steadqd")
DEADLINE = 30.0  # generous: a 2-core CI box under load

# The job command. Instructions come in the payload (stdin, or the
# STEADQ_PAYLOAD_FILE copy) as JSON; what it saw is written atomically to
# <results>/<job_id>.<attempt>.json, and <...>.start marks that it began.
JOB_SCRIPT = r"""
import json, os, signal, stat, subprocess, sys, time

results = sys.argv[1]
env = dict(os.environ)
job, attempt = env.get("STEADQ_JOB_ID", "nojob"), env.get("STEADQ_ATTEMPT", "0")
base = os.path.join(results, f"{job}.{attempt}")
started = time.time()
info = {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "start": started, "cwd": os.getcwd()}
pf = env.get("STEADQ_PAYLOAD_FILE")
if pf:
    st = os.stat(pf)
    info["payload_file"] = {"mode": stat.S_IMODE(st.st_mode), "path": pf}
    with open(pf, "rb") as f:
        raw = f.read()
    info["stdin"] = sys.stdin.buffer.read().decode("latin-1")
else:
    raw = sys.stdin.buffer.read()
info["payload"] = raw.decode("latin-1")
try:
    spec = json.loads(raw or b"{}")
except ValueError:
    spec = {}
if spec.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if spec.get("grandchild"):
    gc = subprocess.Popen(["sleep", "1000"])
    info["grandchild"] = gc.pid
with open(base + ".start.tmp", "w") as f:
    json.dump(info, f)
os.rename(base + ".start.tmp", base + ".start")
for line in spec.get("print", []):
    print(line, flush=True)
for line in spec.get("stderr", []):
    print(line, file=sys.stderr, flush=True)
barrier = spec.get("barrier")
if barrier:
    open(os.path.join(results, f"{barrier['tag']}-{job}.here"), "w").close()
    # wait until `n` jobs of this barrier have started (or give up at the deadline)
    deadline = started + barrier["timeout"]
    while time.time() < deadline:
        if len([n for n in os.listdir(results) if n.startswith(barrier["tag"]) and n.endswith(".here")]) >= barrier["n"]:
            break
        time.sleep(0.05)
pause = spec.get("sleep", 0)
time.sleep(pause.get(attempt, 0) if isinstance(pause, dict) else pause)
info["end"] = time.time()
info["env"] = env
with open(base + ".json.tmp", "w") as f:
    json.dump(info, f)
os.rename(base + ".json.tmp", base + ".json")
code = spec.get("exit", 0)
if isinstance(code, dict):
    code = code.get(attempt, code.get("default", 0))
sys.exit(code)
"""


def job_spec(**spec: Any) -> bytes:
    """A payload telling the job script what to do."""
    return json.dumps(spec).encode()


class Env:
    """One test's world: a queue, a config dir, a results dir, the job script."""

    def __init__(self, tmp: Path, queue_path: str) -> None:
        self.tmp = tmp
        self.queue_path = queue_path
        self.config_dir = tmp / "config"
        self.results = tmp / "results"
        self.jobtmp = tmp / "jobtmp"
        self.config_dir.mkdir()
        self.results.mkdir()
        self.jobtmp.mkdir()
        self.script = tmp / "job.py"
        self.script.write_text(JOB_SCRIPT)
        self.name = "testq"

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), str(self.results)]

    def write_config(self, queue: str | None = None, **worker: Any) -> Path:
        """Write <name>.yaml; ``worker`` keys override the defaults here."""
        w: dict[str, Any] = {"command": self.command(), "concurrency": 1, "lease": "10s"}
        w.update(worker)
        path = self.config_dir / f"{self.name}.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"queue": queue or self.queue_path, "worker": w}, sort_keys=False))
        os.rename(tmp, path)  # atomic: a SIGHUP never reads half a file
        return path

    # -- results ------------------------------------------------------------

    def result(self, job_id: str, attempt: int, *, timeout: float = DEADLINE) -> dict[str, Any]:
        path = self.results / f"{job_id}.{attempt}.json"
        wait_for(path.exists, timeout, f"result of {job_id} attempt {attempt}")
        return json.loads(path.read_text())

    def started(self, job_id: str, attempt: int, *, timeout: float = DEADLINE) -> dict[str, Any]:
        path = self.results / f"{job_id}.{attempt}.start"
        wait_for(path.exists, timeout, f"start of {job_id} attempt {attempt}")
        return json.loads(path.read_text())

    def results_of(self, job_id: str) -> dict[int, dict[str, Any]]:
        out = {}
        for p in self.results.glob(f"{job_id}.*.json"):
            out[int(p.name.split(".")[1])] = json.loads(p.read_text())
        return out


def wait_for(pred: Callable[[], Any], timeout: float = DEADLINE, what: str = "condition", every: float = 0.05) -> Any:
    """Poll a condition (test side only) until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def payload_copies_removed(env: Env) -> None:
    """Wait until every per-job payload copy is gone.

    The settling thread removes a job's copy after it has reported the
    verdict (steadqd/daemon/worker/settle.py), so a settled tree and a "finished"
    line can come before the removal.
    """
    wait_for(lambda: not any(env.jobtmp.iterdir()), what=f"every payload copy under {env.jobtmp} to be removed")


def traversable(path: Path) -> None:
    """pytest's base directories are 0700: let the test users (and a job run as ``worker.user``) reach ``path``."""
    parent = str(path)
    while parent != "/":
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)


class Daemon:
    """A ``steadqd <role> <queue>`` subprocess with its stderr captured to a file."""

    def __init__(
        self, env: Env, role: str = "worker", extra_env: dict[str, str] | None = None, wrapper: tuple[str, ...] = ()
    ) -> None:
        """``wrapper`` is a command line the daemon's is appended to (setpriv, to run it with fewer capabilities)."""
        self.env = env
        self.log_path = env.tmp / f"{role}-{time.monotonic_ns()}.log"
        child_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "SECRET": "1",  # must never reach a job
            # per-job payload copies go under the test's tmp (a SIGKILLed worker cannot remove them)
            "TMPDIR": str(env.jobtmp),
        }
        if "PYTHONPATH" in os.environ:  # e.g. running the suite from an uninstalled tree
            child_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if "STEADQ_SPAWN" in os.environ:  # STEADQ_SPAWN=popen: the suite on the spawn's fallback (fastspawn.py)
            child_env["STEADQ_SPAWN"] = os.environ["STEADQ_SPAWN"]
        child_env.update(extra_env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*wrapper, STEADQD, "--config-dir", str(env.config_dir), role, env.name],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = DEADLINE, count: int = 1) -> list[re.Match[str]]:
        rx = re.compile(pattern, re.M)

        def found() -> list[re.Match[str]] | None:
            if self.proc.poll() is not None and len(rx.findall(self.log())) < count:
                raise AssertionError(
                    f"daemon exited ({self.proc.returncode}) before logging {pattern!r}:\n{self.log()}"
                )
            ms = list(rx.finditer(self.log()))
            return ms if len(ms) >= count else None

        try:
            return wait_for(found, timeout, f"log {pattern!r}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- daemon log ---\n{self.log()}") from None

    def ready(self) -> None:
        self.wait_log(r"^<5>(?:worker|run)\[.*\]: started")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"daemon did not exit within {timeout:g}s:\n{self.log()}") from None

    def stop(self) -> None:
        """Teardown: SIGTERM, then SIGKILL; never leaves the daemon running."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes in a process group (zombies may linger: PID 1 may not reap)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            out.append(int(d))
    return out


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def worker_in_process(
    queue: Queue, queue_path: str, *, jobs: int, concurrency: int, lease: bool = False
) -> Iterator[tuple[Any, Any, io.StringIO]]:
    """A WorkerRole on a running loop in this process, its journal lines in a StringIO.

    ``queue`` (closed here) gets ``jobs`` jobs first. Without ``lease`` the role is drained at once, so it claims
    nothing of its own and the test hands it jobs; with it the role leases as a daemon would.
    """
    from steadqd.daemon import process
    from steadqd.daemon.config import parse_config
    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Loop
    from steadqd.daemon.worker.role import WorkerRole

    with queue as q:
        for i in range(jobs):
            q.enqueue(f"job {i}".encode())
    settings = parse_config(
        f"queue: {queue_path}\nworker:\n  command: ['true']\n  concurrency: {concurrency}\n", path="t.yaml", name="t"
    )
    out = io.StringIO()
    loop = Loop()
    role = WorkerRole(settings, Log("worker", "t", journal=False, stream=out))
    role.start(loop)
    if not lease:
        role.drain()
    try:
        yield role, loop, out
    finally:
        role.close()
        loop.close()
        # The role made this test process a child subreaper: orphans of later tests would come to it and stay
        # zombies, which a later kill_escaped() then counts (test_escaped_sweep).
        process.prctl(process.PR_SET_CHILD_SUBREAPER, 0)


@pytest.fixture
def denv(tmp_path: Path, make_queue: Callable[..., Queue], queue_path: str) -> Env:
    # 1 s delayed buckets: recovery promotes a backed-off retry within ~1 s, not ~10 s
    make_queue(delayed_width_ns=10**9).close()
    return Env(tmp_path, queue_path)


@pytest.fixture
def daemons() -> Iterator[Callable[..., Daemon]]:
    """Factory of daemons that are always stopped at teardown."""
    started: list[Daemon] = []

    def start(env: Env, role: str = "worker", extra_env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(env, role, extra_env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
    for d in started:
        reap_job_processes(d.env)


def reap_job_processes(env: Env) -> None:
    """Kill job commands a failed test left behind (e.g. of a SIGKILLed worker).

    Only processes in a recorded job's process group whose environment names
    that job are killed, so a reused group id can never hit anything else.
    """
    for start in env.results.glob("*.start"):
        job = start.name.split(".")[0]
        try:
            pgid = json.loads(start.read_text())["pgid"]
        except (OSError, ValueError, KeyError):
            continue
        for pid in live_group_members(pgid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"STEADQ_JOB_ID={job}".encode() in environ:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
