"""SIGKILL rig for crash lab lanes 3 and 5: real processes, real filesystems, random kills.

Why real processes: lane 1 proves the protocol against computed crash states;
this rig proves the *implementation as deployed* (producer processes using the
library, ``steadqd run`` with its worker spawner, sweeper and promoter, and
the job commands it spawns) survives SIGKILL of any of them at any moment on
ext4, XFS and btrfs. Nothing is trusted: producers journal (outside the queue,
line-buffered, so a SIGKILL loses nothing already written) which serial they
*began* and which enqueue *returned*; every job is *scripted* (its payload says
what its command does at each attempt: an exit status, or killing itself), and
the command appends a line when a run starts and another just before it ends;
the rig records every run it kills; the final tree is read by the independent
walker in ``tests/invariants.py`` and the payload of every object is read back
to learn its serial. Then every job's final state must be one that its script,
the exit policy of the rig's YAML and the kills allow (:func:`judge`).

Command line (docs/crash-lab.md)::

    .venv/bin/python -m tests.lab.killrig kill [--fs ext4 --fs xfs --fs btrfs]
        [--rounds 60] [--jobs 200] [--seed N]
    .venv/bin/python -m tests.lab.killrig soak [--fs ext4] [--seconds 3600]
    .venv/bin/python -m tests.lab.killrig producer ROOT JOURNAL FIRST STEP COUNT|until:STOPFILE   (internal)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:  # producer mode runs this file in a fresh interpreter
    sys.path.insert(0, REPO)

from steadqd import NotCommitted, OutcomeUnknown, Queue  # noqa: E402
from tests.lab.lazyfs import mark  # noqa: E402

STEADQD = os.path.join(os.path.dirname(sys.executable), "steadqd")
LAZYFS_ENV = "STEADQ_RIG_LAZYFS"  # producers: the LazyFS mountpoint to mark committed enqueues in
DAEMON_ENV = "RIG_DAEMON"  # the incarnation of `steadqd run` (1, 2, ...), passed through to job commands
SETTLE_TIMEOUT = 60.0  # seconds for the queue to drain after the last kill; a hang fails
SETTLED_WALKS = 3  # consecutive walks that find no active job before the daemon is stopped
STOP_TIMEOUT = 2.0  # seconds for a job command to stop on SIGSTOP before the rig gives up killing it

# The rig worker's exit policy (its YAML's ``worker.exit_status``). The rig reads
# it itself, by docs/configuration.md, never through steadqd.daemon.worker.policy: the
# check must not inherit a bug of the code it checks.
EXIT_POLICY: dict[str, Any] = {"ack": [0], "retry": [75], "bury": [100], "other": "retry", "bury_reason": 300}
UNSETTLED = "unsettled"  # a possible end of a claim: its daemon died first, the lease expired and was reaped

# Scripts: what a job's command does at attempt 1, 2, ... (the last step
# repeats): an exit status, K (kill itself with SIGKILL) or T (SIGTERM); and
# the job's max_attempts. A job's script is a function of its serial.
Script = tuple[tuple[str, ...], int]
SCRIPTS: tuple[Script, ...] = (
    (("0",), 1),  # one attempt: a kill of its run (or of its daemon) leaves it dead, attempts exhausted
    (("75", "0"), 6),  # the retry status once, then success
    (("100",), 6),  # the bury status: dead with bury_reason at once
    (("K", "0"), 6),  # killed by a signal once: retried, never acked
    (("T", "0"), 6),  # the same with SIGTERM
    (("75",), 2),  # the retry status every time: attempts exhausted
    (("75", "3", "0", "75"), 4),  # success only at attempt 3 (3 is in no list: "other")
    (("K",), 2),  # killed every time: attempts exhausted
) + ((("0",), 6),) * 12  # most jobs simply succeed, so the kills land on a busy worker

# The job command. It reads its script from the payload (stdin) and logs
# "S job serial attempt daemon" when it starts and "E job attempt step" just
# before it acts, stays alive briefly so that it can be killed, then exits or
# kills itself. printf is a shell builtin and one short O_APPEND write is
# atomic, so concurrent runs never interleave their lines and a kill loses
# nothing already written. Nothing but sleep forks.
JOB_SHELL = (
    'read -r p; s=${{p#*;script=}}; s=${{s%%;*}}; i=1; while [ "$i" -lt "$STEADQ_ATTEMPT" ]'
    ' && [ "${{s#*,}}" != "$s" ]; do s=${{s#*,}}; i=$((i+1)); done; a=${{s%%,*}};'
    ' printf "S %s %s %s %s\\n" "$STEADQ_JOB_ID" "$STEADQ_META_SERIAL" "$STEADQ_ATTEMPT" "${daemon}" >> {log};'
    ' /bin/sleep {pause}; printf "E %s %s %s\\n" "$STEADQ_JOB_ID" "$STEADQ_ATTEMPT" "$a" >> {log};'
    ' case $a in K) kill -KILL $$;; T) kill -TERM $$;; *) exit "$a";; esac'
)


# --------------------------------------------------------------------------- payloads and scripts


def script_of(serial: int) -> Script:
    """The script of the job carrying ``serial``: its steps and max_attempts."""
    return SCRIPTS[serial % len(SCRIPTS)]


def step(script: Script, attempt: int) -> str:
    """What the command does at ``attempt`` (1-based; the last step repeats)."""
    steps = script[0]
    return steps[min(attempt, len(steps)) - 1]


def make_payload(serial: int) -> bytes:
    """A payload that proves its own integrity: the serial, its script, and a hash of both."""
    steps = ",".join(script_of(serial)[0]).encode()
    check = hashlib.sha256(b"steadq-kill:%d:%s" % (serial, steps)).hexdigest()[:16]
    return b"serial=%07d;script=%s;check=%s" % (serial, steps, check.encode())


def parse_payload(data: bytes) -> int:
    """The serial of a payload made by :func:`make_payload`; raises ValueError on anything else."""
    m = re.fullmatch(rb"serial=(\d{7});script=[0-9KT,]+;check=[0-9a-f]{16}", data)
    if m is None or make_payload(int(m.group(1))) != data:
        raise ValueError(f"not a rig payload: {data[:80]!r}")
    return int(m.group(1))


def object_serial(path: str) -> int:
    """Serial of a job file or full receipt, read without going through the queue handle."""
    from steadqd.constants import MAX_PAYLOAD_LENGTH  # noqa: PLC0415
    from steadqd.fs.verify import read_envelope  # noqa: PLC0415

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        env = read_envelope(fd, MAX_PAYLOAD_LENGTH, st)
        return parse_payload(os.pread(fd, st.st_size - env.payload_offset, env.payload_offset))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- producer process


def run_producer(root: str, journal: str, first: int, step: int, count: str, pace: float = 0.0) -> None:
    """Enqueue serials first, first+step, ...; journal ``B serial`` before and ``C serial job`` after.

    A restarted producer resumes after the last serial it *began*: the
    in-flight one of the killed incarnation is never re-enqueued, so a serial
    found under two job ids is a real duplicate. ``count`` is a number of
    serials, or ``until:PATH``: run until that file exists (the soak), with
    ``pace`` seconds between enqueues so that producers do not outrun the
    worker for hours (a backlog would only measure throughput).
    """
    lazyfs = os.environ.get(LAZYFS_ENV)  # the power-cut lane: a FUSE queue, marks in its journal
    begun: list[int] = []
    if os.path.exists(journal):
        with open(journal) as f:
            begun = [int(line.split()[1]) for line in f if line.startswith("B ")]
    serial = max(begun) + step if begun else first
    stop = count[len("until:") :] if count.startswith("until:") else None
    limit = None if stop else first + step * int(count)
    with open(journal, "a", buffering=1) as j, Queue.open(root, allow_unsupported_fs=bool(lazyfs)) as q:
        while (limit is None or serial < limit) and not (stop and os.path.exists(stop)):
            j.write(f"B {serial}\n")
            j.flush()
            job = q.enqueue(make_payload(serial), max_attempts=script_of(serial)[1], metadata={"serial": serial})
            j.write(f"C {serial} {job}\n")
            j.flush()
            if lazyfs:
                mark(lazyfs, f"enq:{job}")
            serial += step
            if pace:
                time.sleep(pace)


# --------------------------------------------------------------------------- the final-state check


@dataclasses.dataclass
class Run:
    """What the job log and the rig's kills say about one claim (job, attempt)."""

    daemon: int | None = None  # the `steadqd run` incarnation whose worker ran it
    started: bool = False  # its "S" line is in the log
    did: str | None = None  # its "E" line: the step it took just before it ended
    killed: bool = False  # the rig stopped it while it still ran, then SIGKILLed it


def policy_outcome(did: str) -> str:
    """The verdict the exit policy (:data:`EXIT_POLICY`, docs/configuration.md) gives a run that did ``did``."""
    if did in ("K", "T"):  # death by a signal
        return str(EXIT_POLICY["other"])
    for outcome in ("ack", "bury", "retry"):
        if int(did) in EXIT_POLICY[outcome]:
            return outcome
    return str(EXIT_POLICY["other"])


def run_outcomes(run: Run | None, killed_daemons: set[int], daemon_kills: int) -> set[str]:
    """How this claim may have ended, as the protocol allows: set of verdicts and/or UNSETTLED.

    No run at all (no "S" line, no kill by the rig) is a claim whose daemon
    died before the command started. A run whose daemon the rig killed may
    have been settled or not (the kill may have come at any moment). Empty:
    nothing could explain what the log shows.
    """
    if run is None:
        return {UNSETTLED} if daemon_kills else set()
    if run.killed:  # stopped before it could end: whatever it logged, it died by SIGKILL
        ways = {policy_outcome("K")}
    elif run.did is not None:
        ways = {policy_outcome(run.did)}
    elif run.daemon in killed_daemons:
        # Its daemon was SIGKILLed mid-run, and the daemon's guard killed the job's process
        # group with it (steadqd.daemon.worker.run.guard): it ended unsettled, without an "E" line.
        return {UNSETTLED}
    else:  # started, never reached its end, and neither its daemon nor the rig was killed: impossible
        return set()
    if run.daemon in killed_daemons:
        ways.add(UNSETTLED)
    return ways


def judge(
    state: str,
    attempt: int,
    reason: int | None,
    script: Script,
    runs: dict[int, Run],
    killed_daemons: set[int],
    daemon_kills: int,
) -> str | None:
    """Why a job's final state (``receipt``/``dead``, its attempt, dead reason) cannot follow
    from its script, the exit policy, its logged runs and the rig's kills; None if it can.

    Every claim before the final one must have ended without finishing the job
    (retry, or unsettled); the final one must have produced the final state:
    a receipt only from a run that exited with an ack status and was not
    killed; dead with ``bury_reason`` only from a run that exited with a bury
    status; dead with attempts-exhausted only at the last attempt, from a run
    that was retried or never settled.
    """
    from steadqd.constants import DeadReason  # noqa: PLC0415

    later = [a for a in runs if a > attempt]
    if later:
        return f"{state} at attempt {attempt}, but attempt {max(later)} ran (or was killed) after that"
    for a in range(1, attempt + 1):
        run = runs.get(a)
        if run is not None and run.did is not None and run.did != step(script, a):
            return f"attempt {a} did {run.did!r}, its script says {step(script, a)!r}"
        ways = run_outcomes(run, killed_daemons, daemon_kills)
        if not ways:
            if run is None:
                return f"attempt {a} was claimed but never ran, and no daemon was killed"
            return f"attempt {a} started and never ended, and the rig did not kill it"
        if a < attempt and not ways & {"retry", UNSETTLED}:
            return f"attempt {a} could only end the job ({'/'.join(sorted(ways))}), yet attempt {attempt} followed"
    ways = run_outcomes(runs.get(attempt), killed_daemons, daemon_kills)
    if state == "receipt":
        ok = "ack" in ways
    elif reason == EXIT_POLICY["bury_reason"]:
        ok = "bury" in ways
    elif reason == DeadReason.ATTEMPTS_EXHAUSTED:
        ok = attempt == script[1] and bool(ways & {"retry", UNSETTLED})
    else:
        ok = False
    if ok:
        return None
    run = runs.get(attempt)
    seen = "no run" if run is None else ("killed by the rig" if run.killed else f"did {run.did!r}")
    final = state if reason is None else f"{state} (reason 0x{reason:04x})"
    return f"{final} at attempt {attempt}, but that attempt ({seen}) could only end as {'/'.join(sorted(ways))}"


# --------------------------------------------------------------------------- the rig


@dataclasses.dataclass
class Report:
    """What one run checked (printed by the tests and the lab command)."""

    fs: str
    kills: dict[str, int] = dataclasses.field(default_factory=lambda: {"producer": 0, "daemon": 0, "job": 0})
    committed: int = 0
    inflight_lost: int = 0  # killed mid-enqueue, not in the tree (allowed)
    inflight_kept: int = 0  # killed mid-enqueue, in the tree (allowed)
    receipts: int = 0
    dead: int = 0
    buried: int = 0  # dead with bury_reason (of those dead)
    exhausted: int = 0  # dead with attempts exhausted (of those dead)
    executions: int = 0  # job-command starts recorded
    self_killed: int = 0  # runs that killed themselves (SIGKILL or SIGTERM), as scripted
    seconds: float = 0.0

    def line(self) -> str:
        k = self.kills
        return (
            f"{self.fs:6} kills: {sum(k.values()):3} (producer {k['producer']}, daemon {k['daemon']}, job {k['job']})"
            f"  jobs committed {self.committed}, receipts {self.receipts},"
            f" dead {self.dead} (buried {self.buried}, exhausted {self.exhausted}),"
            f" in-flight kept/lost {self.inflight_kept}/{self.inflight_lost}, executions {self.executions}"
            f" (self-killed {self.self_killed})  {self.seconds:.1f}s  gates OK"
        )


class Rig:
    """A queue on ``mount``, its config dir, producers, one ``steadqd run``, and a killer."""

    def __init__(
        self,
        mount: str,
        work: str,
        *,
        fs: str,
        producers: int,
        concurrency: int,
        seed: int,
        lazyfs: bool = False,
    ) -> None:
        """``lazyfs``: ``mount`` is a LazyFS (FUSE) mount: allow its type everywhere and have
        producers mark each committed enqueue in its journal (the power-cut lane)."""
        self.mount = mount
        self.lazyfs = lazyfs
        self.root = os.path.join(mount, "queue")
        self.work = Path(work)
        self.name = "crashq"
        self.config_dir = self.work / "config"
        self.config_dir.mkdir()
        self.joblog = self.work / "jobs.log"
        self.joblog.touch()
        self.rng = random.Random(seed)
        self.report = Report(fs)
        self.nprod = producers
        self.pace = 0.0  # seconds between a producer's enqueues
        self.probe_jobs: set[str] = set()  # enqueued by check_works(), not by a producer
        # Lane 3's producers finish within seconds: favour them while they run.
        # The soak's run all along: equal odds for producers, daemon and jobs.
        self.producer_weight = 2
        self.producers: dict[int, subprocess.Popen[bytes] | None] = {}
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_number = 0  # incarnations of `steadqd run` started so far; job commands log theirs
        self.killed_daemons: set[int] = set()
        self.killed_runs: dict[tuple[str, int], int] = {}  # (job, attempt) the rig killed -> its daemon
        self.concurrency = concurrency
        self._logs: list[object] = []
        Queue.init(self.root, shards=8, delayed_width_ns=10**9, allow_unsupported_fs=lazyfs).close()
        cfg: dict[str, Any] = {
            "queue": self.root,
            "worker": {
                "command": JOB_SHELL.format(log=self.joblog, pause="0.05", daemon=DAEMON_ENV),
                "shell": True,
                "concurrency": concurrency,
                "pass_environment": ["PATH", "LANG", DAEMON_ENV],
                "exit_status": EXIT_POLICY,
                "lease": "3s",
                "renew_every": "1s",
                "kill_grace": "1s",
                "retry": {"backoff_base": "100ms", "backoff_max": "500ms"},
            },
            "sweeper": {"interval": "1s"},
            "promoter": {"max_sleep": "1s"},
        }
        if lazyfs:
            cfg["allow_unsupported_fs"] = True
        (self.config_dir / f"{self.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    # -- processes --------------------------------------------------------------

    def journal(self, i: int) -> Path:
        return self.work / f"producer-{i}.journal"

    def start_producer(self, i: int, count: str) -> None:
        log = open(self.work / f"producer-{i}.log", "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        argv = [
            sys.executable,
            "-m",
            "tests.lab.killrig",
            "producer",
            self.root,
            str(self.journal(i)),
            str(i),
            str(self.nprod),
            count,
            str(self.pace),
        ]
        env = dict(os.environ, **({LAZYFS_ENV: self.mount} if self.lazyfs else {}))
        self.producers[i] = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)

    def start_daemon(self) -> None:
        log = open(self.work / "daemon.log", "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        self.daemon_number += 1
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": str(self.work)}
        env[DAEMON_ENV] = str(self.daemon_number)
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.daemon = subprocess.Popen(
            [STEADQD, "--config-dir", str(self.config_dir), "run", self.name],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def job_pids(self) -> list[int]:
        """Live job commands of *this* queue: their environment names our queue path."""
        return [int(d) for d in os.listdir("/proc") if d.isdigit() and self.job_env(int(d)) is not None]

    def job_env(self, pid: int) -> dict[str, str] | None:
        """The environment of ``pid`` if it is a job command of this queue (or its child), else None."""
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return None
        env = dict(v.decode(errors="replace").partition("=")[::2] for v in raw.split(b"\0") if v)
        return env if env.get("STEADQ_QUEUE_PATH") == self.root else None

    def kill_job(self) -> bool:
        """SIGKILL one running job command (with its process group); False if none could be.

        The command is stopped first and killed only once it is stopped, so the
        run certainly dies by SIGKILL whatever its log shows (it may have
        written its "E" line and not yet exited) and a command that had already
        exited is not counted as killed. The pidfd pins the process, so a reused
        pid is never signalled.
        """
        leaders = [p for p in self.job_pids() if _group_leader(p)]
        if not leaders:
            return False
        pid = self.rng.choice(leaders)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            env = self.job_env(pid)
            if env is None:
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
            if not _stopped(pid, pidfd):
                return False
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        finally:
            os.close(pidfd)
        self.killed_runs[(env["STEADQ_JOB_ID"], int(env["STEADQ_ATTEMPT"]))] = int(env[DAEMON_ENV])
        return True

    def kill_one(self) -> str:
        """SIGKILL one random live process (producer, daemon or job command); restart it if it is ours."""
        choices: list[str] = ["daemon"]
        # One look at the producers: one that ends between two looks left the second one empty.
        live = [i for i, p in self.producers.items() if p is not None and p.poll() is None]
        if live:
            choices += ["producer"] * self.producer_weight
        if self.job_pids():
            choices.append("job")
        what = self.rng.choice(choices)
        if what == "producer":
            i = self.rng.choice(live)  # ended since: the kill below finds it finished ("none")
            p = self.producers[i]
            assert p is not None
            p.kill()
            p.wait()
            if p.returncode != -signal.SIGKILL:  # finished just before the kill: not a kill
                return "none"
            self.start_producer(i, self._count)
        elif what == "daemon":
            assert self.daemon is not None
            self.daemon.kill()
            self.daemon.wait()
            self.killed_daemons.add(self.daemon_number)
            self.start_daemon()
        elif not self.kill_job():
            return "none"
        self.report.kills[what] += 1
        return what

    def run(
        self,
        count: str,
        *,
        rounds: int | None = None,
        seconds: float | None = None,
        gap: tuple[float, float] = (0.1, 0.6),
        stopfile: str | None = None,
    ) -> None:
        """Start everything, kill for ``rounds`` rounds or ``seconds``, then let producers finish."""
        self._count = count
        t0 = time.monotonic()
        self.start_daemon()
        for i in range(self.nprod):
            self.start_producer(i, count)
        n = 0
        while (rounds is not None and n < rounds) or (seconds is not None and time.monotonic() - t0 < seconds):
            time.sleep(self.rng.uniform(*gap))
            self.check_alive()
            if self.kill_one() != "none":
                n += 1
        if stopfile:
            Path(stopfile).touch()
        deadline = time.monotonic() + SETTLE_TIMEOUT
        for i, p in self.producers.items():
            assert p is not None
            while True:
                rc = p.wait(max(1.0, deadline - time.monotonic()))
                if rc == 0:
                    break
                raise AssertionError(f"producer {i} failed ({rc}):\n{(self.work / f'producer-{i}.log').read_text()}")
        self.report.seconds = time.monotonic() - t0

    def check_alive(self) -> None:
        """A daemon or producer that died on its own (not killed by us) is a failure."""
        assert self.daemon is not None
        if self.daemon.poll() is not None:
            raise AssertionError(f"steadqd run exited {self.daemon.returncode}:\n{self.daemon_log()}")
        for i, p in self.producers.items():
            if p is not None and p.poll() not in (None, 0):
                raise AssertionError(
                    f"producer {i} failed ({p.returncode}):\n{(self.work / f'producer-{i}.log').read_text()}"
                )

    def daemon_log(self) -> str:
        return (self.work / "daemon.log").read_text(errors="replace")[-4000:]

    def active_files(self) -> int:
        """Job files still in ready/ (ready or leased) or delayed/: 0 means settled."""
        n = 0
        for top in ("ready", "delayed"):
            for _, _, files in os.walk(os.path.join(self.root, top)):
                n += len(files)
        return n

    def settle(self) -> None:
        """Keep ``steadqd run`` going until nothing is ready, leased or delayed; then stop it."""
        assert self.daemon is not None
        deadline = time.monotonic() + SETTLE_TIMEOUT
        # A walk is not a snapshot: a job renamed between delayed/ and ready/ while
        # they are walked (a promotion, a retry) is seen in neither. Settled means
        # empty on several walks in a row, not on one.
        empty_walks = 0
        while empty_walks < SETTLED_WALKS:
            self.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"queue did not drain in {SETTLE_TIMEOUT:g}s:\n{self.daemon_log()}")
            empty_walks = 0 if self.active_files() else empty_walks + 1
            time.sleep(0.2)
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(30)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
            raise AssertionError(f"steadqd run ignored SIGTERM:\n{self.daemon_log()}") from None
        deadline = time.monotonic() + 10
        while self.job_pids() and time.monotonic() < deadline:  # orphans of a killed daemon finish on their own
            time.sleep(0.1)

    def close(self) -> None:
        """Teardown: never leave a process of this rig running (only ours: tracked or marked)."""
        for p in [*self.producers.values(), self.daemon]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for pid in self.job_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.job_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for log in self._logs:
            log.close()  # type: ignore[attr-defined]

    # -- the gates --------------------------------------------------------------

    def check(self) -> Report:
        """Recover, then check every gate; raises AssertionError naming what broke."""
        from tests.invariants import check_tree  # noqa: PLC0415
        from tests.spec_oracle import State  # noqa: PLC0415

        with Queue.open(self.root, allow_unsupported_fs=self.lazyfs) as q:
            for _ in range(5):  # until a pass finds nothing to do (budget generous: one pass suffices)
                rep = q.recover(budget_ops=100_000, budget_ms=10_000)
                if rep.errors:
                    raise AssertionError(f"recovery errors: {rep.errors}")
                if not rep.budget_exhausted and not (rep.leases_reaped or rep.delayed_promoted or rep.quarantined):
                    break
            if rep.temp_files_deleted or rep.quarantined or rep.leases_reaped:
                pass  # counted by the walker below: temps/quarantine/active leases left would fail it
            result = q.fsck()
            if result.errors:
                raise AssertionError("fsck ERROR findings:\n" + "\n".join(map(str, result.errors)))
        ts = check_tree(self.root, allow_temps=False, allow_quarantine=False)  # no duplicates, no temps
        active = {j: o.state.value for j, o in ts.objects.items() if o.state not in (State.RECEIPT, State.DEAD)}
        if active:
            raise AssertionError(f"jobs still active after settling: {active}")

        committed: dict[int, str] = {}
        begun: set[int] = set()
        for i in range(self.nprod):
            for line in self.journal(i).read_text().splitlines():
                parts = line.split()
                if parts[0] == "B":
                    begun.add(int(parts[1]))
                elif parts[0] == "C":
                    committed[int(parts[1])] = parts[2]
        # Serial of every object: read from its payload, or for a compact receipt
        # (the sweeper compacts receipts: no payload left) from the job command's
        # record, which came from the job's metadata.
        ran, runs = self.read_runs()
        serial_of: dict[str, int] = {}
        seen: dict[int, str] = {}
        for j, o in ts.objects.items():
            if j in self.probe_jobs:  # check_works()'s own job of an earlier check
                if o.state != State.RECEIPT:
                    raise AssertionError(f"probe job {j} is {o.state.value}, not a receipt")
                continue
            if o.compact:
                if j not in ran:
                    raise AssertionError(f"compact receipt of a job whose command never ran: {o.path}")
                s = ran[j]
            else:
                s = object_serial(os.path.join(self.root, o.path))
            if s in seen:
                raise AssertionError(f"serial {s} enqueued twice: jobs {seen[s]} and {j}")
            seen[s] = j
            serial_of[j] = s
        lost = {s: j for s, j in committed.items() if ts.state_of(j) is None}
        if lost:
            raise AssertionError(f"{len(lost)} committed enqueues lost: {sorted(lost.items())[:10]}")
        wrong = {s: (j, serial_of[j]) for s, j in committed.items() if serial_of[j] != s}
        if wrong:
            raise AssertionError(f"job ids carry the wrong serial: {wrong}")
        inflight = begun - set(committed)
        phantoms = {s: j for s, j in seen.items() if s not in committed and s not in inflight}
        if phantoms:
            raise AssertionError(f"objects for serials never begun (phantoms): {phantoms}")
        for j, s in ran.items():
            if serial_of.get(j) != s:
                raise AssertionError(f"job command ran job {j} (serial {s}) that is not in the tree as that serial")
        self.check_final_states(ts, serial_of, runs)

        self.check_works()
        r = self.report
        r.committed = len(committed)
        r.inflight_kept = len(inflight & set(seen))
        r.inflight_lost = len(inflight - set(seen))
        r.receipts = len(ts.receipts - self.probe_jobs)
        r.dead = len(ts.dead)
        r.buried = sum(1 for j in ts.dead if ts.objects[j].name.reason == EXIT_POLICY["bury_reason"])
        r.exhausted = r.dead - r.buried  # check_final_states() allows no third reason
        r.executions = sum(run.started for by_attempt in runs.values() for run in by_attempt.values())
        r.self_killed = sum(
            run.did in ("K", "T") and not run.killed for by_attempt in runs.values() for run in by_attempt.values()
        )
        return r

    def read_runs(self) -> tuple[dict[str, int], dict[str, dict[int, Run]]]:
        """The job log and the rig's kills: ``{job: serial}`` and ``{job: {attempt: Run}}``."""
        ran: dict[str, int] = {}
        runs: dict[str, dict[int, Run]] = {}
        for line in self.joblog.read_text().splitlines():
            parts = line.split()
            try:
                if parts[0] == "S" and len(parts) == 5:
                    job, serial, attempt, daemon = parts[1], int(parts[2]), int(parts[3]), int(parts[4])
                    if ran.setdefault(job, serial) != serial:
                        raise ValueError("a second serial")
                    run = runs.setdefault(job, {}).setdefault(attempt, Run())
                    if run.started:
                        raise ValueError("a second run of the same attempt")
                    run.daemon, run.started = daemon, True
                elif parts[0] == "E" and len(parts) == 4:
                    run = runs.get(parts[1], {}).get(int(parts[2])) or Run()
                    if not run.started or run.did is not None:
                        raise ValueError("an end without its start")
                    run.did = parts[3]
                else:
                    raise ValueError("not a record")
            except (ValueError, IndexError) as e:
                raise AssertionError(f"malformed or inconsistent job-command record ({e}): {line!r}") from None
        for (job, attempt), daemon in self.killed_runs.items():
            run = runs.setdefault(job, {}).setdefault(attempt, Run(daemon=daemon))
            run.killed = True
        return ran, runs

    def check_final_states(self, ts: Any, serial_of: dict[str, int], runs: dict[str, dict[int, Run]]) -> None:
        """Every job ended as its script, the exit policy, its runs and the kills allow (:func:`judge`).

        A claim whose run never started is allowed only to a killed daemon, and
        each can have held at most ``concurrency`` leases when it died.
        """
        bad: list[str] = []
        unstarted = 0
        for j, s in sorted(serial_of.items(), key=lambda item: item[1]):
            o = ts.objects[j]
            script = script_of(s)
            mine = runs.get(j, {})
            unstarted += sum(1 for a in range(1, o.attempt + 1) if a not in mine)
            if o.name.max_attempts != script[1]:
                why: str | None = f"max_attempts {o.name.max_attempts}, its script says {script[1]}"
            else:
                why = judge(
                    o.state.value,
                    o.attempt,
                    o.name.reason,
                    script,
                    mine,
                    self.killed_daemons,
                    self.report.kills["daemon"],
                )
            if why is not None:
                bad.append(f"job {j} (serial {s}, script {','.join(script[0])} x{script[1]}): {why}")
        if bad:
            raise AssertionError(f"{len(bad)} jobs in a final state their runs do not allow:\n" + "\n".join(bad[:20]))
        if unstarted > self.concurrency * self.report.kills["daemon"]:
            raise AssertionError(
                f"{unstarted} claims never ran, more than {self.concurrency} for each of the"
                f" {self.report.kills['daemon']} daemons killed"
            )

    def check_works(self) -> None:
        """The queue works afterwards: enqueue, lease, ack, and the tree is still clean."""
        from steadqd.fs.settle import AckResult  # noqa: PLC0415
        from tests.invariants import check_tree  # noqa: PLC0415

        with Queue.open(self.root, allow_unsupported_fs=self.lazyfs) as q:
            job = q.enqueue(b"after the storm")
            self.probe_jobs.add(job)
            lease = q.lease()
            if lease is None or lease.job_id != job or lease.payload() != b"after the storm":
                raise AssertionError(f"queue does not work after recovery: leased {lease}")
            if q.ack(lease) is not AckResult.ACKED:
                raise AssertionError("ack after recovery did not ack")
        check_tree(self.root, allow_temps=False, allow_quarantine=False)


def _group_leader(pid: int) -> bool:
    """A job command's own process (the worker starts each in a session of its own), not its child."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _stopped(pid: int, pidfd: int) -> bool:
    """Wait until ``pid`` is stopped (True) or has exited (False); on a timeout let it go on (False)."""
    import select  # noqa: PLC0415

    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        if select.select([pidfd], [], [], 0)[0]:  # readable: it exited
            return False
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return False
        if state in ("T", "t"):
            return True
        if state in ("Z", "X"):
            return False
        time.sleep(0.001)
    signal.pidfd_send_signal(pidfd, signal.SIGCONT)
    return False


@contextlib.contextmanager
def rig(fs: str, *, producers: int, concurrency: int, seed: int, size_mb: int | None = None) -> Iterator[Rig]:
    """A :class:`Rig` on a fresh loop-device ``fs``; processes, mount and loop device are always cleaned up."""
    from tests.loopfs import loop_filesystem  # noqa: PLC0415

    work = tempfile.mkdtemp(prefix=f"steadq-kill-{fs}-", dir="/tmp")
    try:
        with loop_filesystem(fs, size_mb) as mnt:
            r = Rig(mnt, work, fs=fs, producers=producers, concurrency=concurrency, seed=seed)
            try:
                yield r
            finally:
                r.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kill_lane(fs: str, *, jobs: int, rounds: int, seed: int) -> Report:
    """Lane 3: 2 producers x ``jobs``, ``steadqd run`` (concurrency 4), ``rounds`` SIGKILLs; gates."""
    with rig(fs, producers=2, concurrency=4, seed=seed) as r:
        r.run(str(jobs), rounds=rounds)
        r.settle()
        return r.check()


def soak(fs: str, *, seconds: float, seed: int, size_mb: int | None = None, pace: float = 0.05) -> Report:
    """Lane 5: 3 producers until stopped, ``steadqd run`` (concurrency 8), kills for ``seconds``; gates."""
    with rig(fs, producers=3, concurrency=8, seed=seed, size_mb=size_mb) as r:
        stop = str(r.work / "stop")
        r.pace = pace
        r.producer_weight = 1
        r.run("until:" + stop, seconds=seconds, gap=(0.2, 1.0), stopfile=stop)
        r.settle()
        return r.check()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab.killrig", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kill", help="lane 3: SIGKILL runs on loop-device filesystems")
    k.add_argument("--fs", action="append", choices=["ext4", "xfs", "btrfs"])
    k.add_argument("--rounds", type=int, default=60)
    k.add_argument("--jobs", type=int, default=200, help="jobs per producer (2 producers)")
    k.add_argument("--seed", type=int, default=None)
    s = sub.add_parser("soak", help="lane 5: mixed run with random kills for a long time")
    s.add_argument("--fs", action="append", choices=["ext4", "xfs", "btrfs"])
    s.add_argument("--seconds", type=float, default=3600.0)
    s.add_argument("--size-mb", type=int, default=None, help="image size (receipts stay 7 days: size it for the run)")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--pace", type=float, default=0.05, help="seconds between a producer's enqueues")
    p = sub.add_parser("producer")
    p.add_argument("root")
    p.add_argument("journal")
    p.add_argument("first", type=int)
    p.add_argument("step", type=int)
    p.add_argument("count")
    p.add_argument("pace", type=float, nargs="?", default=0.0)
    ns = ap.parse_args(argv)
    if ns.cmd == "producer":
        try:
            run_producer(ns.root, ns.journal, ns.first, ns.step, ns.count, ns.pace)
        except (NotCommitted, OutcomeUnknown) as e:  # a storage error is a finding, not a crash of the rig
            print(f"producer: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        return 0
    seed = ns.seed if ns.seed is not None else random.randrange(1 << 30)
    failed = 0
    for fs in ns.fs or (["ext4", "xfs", "btrfs"] if ns.cmd == "kill" else ["ext4"]):
        try:
            if ns.cmd == "kill":
                rep = kill_lane(fs, jobs=ns.jobs, rounds=ns.rounds, seed=seed)
            else:
                rep = soak(fs, seconds=ns.seconds, seed=seed, size_mb=ns.size_mb, pace=ns.pace)
            print(rep.line(), f"seed {seed}", flush=True)
        except AssertionError as e:
            failed += 1
            print(f"{fs:6} FAILED (seed {seed}): {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
