"""The compiled spawn (issue 35): one vfork and one exec per job, with everything Popen and steadq-exec did.

Each guarantee of the fallback is checked here on the compiled path against
Popen itself where Popen defines it (the start failures ``hold.py`` keys on,
the environment and argument checks) and against the kernel's own view of
the child otherwise (/proc: descriptors, signals, session, ids, the
parent-death signal). The privilege order is what these checks pin: groups
and gid can only change before the uid does (else EPERM, a start failure),
and the parent-death signal survives only if it was set after the uid change.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.worker.run import child, fastspawn, guard

from .conftest import DEADLINE
from .test_exec_helper import _CASES, bins, case_command  # noqa: F401 - bins is the fixture _CASES needs

ENV = {"PATH": "/usr/bin:/bin"}
PDEATHSIG_PROBE = (
    "import ctypes\nv = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\nprint(v.value)\n"
)
NOBODY = 65534


@pytest.fixture(autouse=True)
def _built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fastspawn.SWITCH, raising=False)
    assert fastspawn.available(), f"the compiled spawn is not built ({fastspawn.path()}): ./dev.sh setup builds it"


def run(argv: list[str], *, env: dict[str, str] = ENV, cwd: str | None = None, **kw: Any) -> tuple[int, bytes, bytes]:
    p = fastspawn.spawn(
        argv, env=env, cwd=cwd, stdin_fd=kw.pop("stdin_fd", None), credentials=kw.pop("creds", {}), **kw
    )
    assert p.stdout is not None and p.stderr is not None
    with p.stdout, p.stderr:
        out, err = p.stdout.read(), p.stderr.read()
    return p.wait(timeout=DEADLINE), out, err


def test_path_says_which_spawn_runs_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fastspawn.path().startswith("compiled")
    monkeypatch.setenv(fastspawn.SWITCH, "popen")
    assert not fastspawn.available()
    assert fastspawn.path() == "Popen and steadq-exec (two execs per job): STEADQ_SPAWN=popen is set"


def test_the_worker_spawns_through_the_compiled_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    payload = tmp_path / "payload"
    payload.write_bytes(b"")
    proc, report = child.launch(WorkerConfig(command=("/bin/true",)), ENV, str(payload), {})
    try:
        assert report is None and proc.wait(timeout=DEADLINE) == 0
        assert isinstance(proc, fastspawn.Spawned)
        assert not [argv for argv in seen if "/bin/true" in argv]  # Popen started the guard at most
    finally:
        guard.process_guard().forget(proc.pid)
        guard.process_guard().close()


@pytest.mark.parametrize("case", sorted(_CASES))
def test_an_exec_failure_is_the_error_popen_raises(bins: dict[str, Path], case: str) -> None:  # noqa: F811
    argv, env = case_command(bins, case)

    def outcome(start: Any) -> tuple[Any, ...]:
        try:
            p = start(argv, env)
        except OSError as e:
            return (type(e), e.errno, e.filename, str(e))
        out = p.stdout.read()
        p.stdout.close()
        p.stderr.close()
        return ("ran", p.wait(timeout=DEADLINE), out)

    def popen(argv: list[str], env: dict[str, str]) -> Any:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def compiled(argv: list[str], env: dict[str, str]) -> Any:
        return fastspawn.spawn(argv, env=env, cwd=None, stdin_fd=None, credentials={})

    assert outcome(compiled) == outcome(popen)


@pytest.mark.parametrize("cwd", ["missing", "a-file"])
def test_a_bad_working_directory_is_the_error_popen_raises(tmp_path: Path, cwd: str) -> None:
    (tmp_path / "a-file").write_text("")
    where = str(tmp_path / cwd)
    with pytest.raises(OSError) as popen:
        subprocess.Popen(["/bin/true"], cwd=where, env=ENV)
    with pytest.raises(OSError) as compiled:
        fastspawn.spawn(["/bin/true"], env=ENV, cwd=where, stdin_fd=None, credentials={})
    assert (type(compiled.value), compiled.value.errno, compiled.value.filename) == (
        type(popen.value), popen.value.errno, popen.value.filename,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["/bin/echo", "a\0b"], ENV), (["/bin/true"], {**ENV, "A": "x\0y"}), (["/bin/true"], {**ENV, "A=B": "x"})],
)
def test_a_nul_or_a_bad_variable_name_is_a_value_error_as_with_popen(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        subprocess.Popen(argv, env=env)
    with pytest.raises(ValueError):
        fastspawn.spawn(argv, env=env, cwd=None, stdin_fd=None, credentials={})


def test_a_failed_start_leaves_no_process_and_no_descriptor(tmp_path: Path) -> None:
    def children() -> set[str]:
        return {
            c for t in os.listdir("/proc/self/task") for c in Path(f"/proc/self/task/{t}/children").read_text().split()
        }

    fastspawn.spawn(["/bin/true"], env=ENV, cwd=None, stdin_fd=None, credentials={}).wait()  # /dev/null, once
    before_fds, before_children = set(os.listdir("/proc/self/fd")), children()
    with pytest.raises(FileNotFoundError):
        fastspawn.spawn([str(tmp_path / "nothing")], env=ENV, cwd=None, stdin_fd=None, credentials={})
    assert set(os.listdir("/proc/self/fd")) <= before_fds
    assert children() <= before_children  # reaped, not a zombie


def test_the_command_gets_its_environment_its_directory_and_only_its_three_descriptors(tmp_path: Path) -> None:
    leak = os.open("/dev/null", os.O_RDONLY)  # inheritable: close_fds must close it anyway
    try:
        code, out, err = run(
            ["/bin/sh", "-c", "echo out; echo err >&2; pwd; env; ls /proc/self/fd"], env={**ENV, "X": "1"},
            cwd=str(tmp_path),
        )  # fmt: skip
    finally:
        os.close(leak)
    lines = out.decode().split("\n")
    assert code == 0 and err == b"err\n"
    assert lines[:2] == ["out", str(tmp_path)]
    assert "X=1" in lines and not any(line.startswith("SECRET=") for line in lines)
    assert sorted(line for line in lines[2:] if line.isdigit()) == ["0", "1", "2", "3"]  # 3: ls's own


def test_stdin_is_null_or_the_given_file(tmp_path: Path) -> None:
    assert run(["/bin/cat"])[1] == b""
    f = tmp_path / "payload"
    f.write_bytes(b"the payload")
    with open(f, "rb") as fh:
        assert run(["/bin/cat"], stdin_fd=fh.fileno())[1] == b"the payload"


def test_a_session_and_process_group_of_its_own() -> None:
    code, out, _ = run(["/bin/sh", "-c", "echo $$; ps -o pgid= -o sid= -p $$"])
    pid, pgid, sid = (int(x) for x in out.split())
    assert code == 0 and pid == pgid == sid


def test_signals_the_worker_catches_or_ignores_are_default_and_none_blocked() -> None:
    old_usr1 = signal.signal(signal.SIGUSR1, lambda *_: None)
    old_pipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        code, out, _ = run(["/bin/grep", "-E", "^Sig(Blk|Ign|Cgt)", "/proc/self/status"])
        mine = {k: int(v, 16) for k, v in (x.split(":\t") for x in Path("/proc/self/status").read_text().splitlines()
                                           if x.startswith(("SigCgt", "SigIgn")))}  # fmt: skip
    finally:
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGPIPE, old_pipe)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    fields = dict(line.split(":\t") for line in out.decode().splitlines())
    masks = {k: int(v, 16) for k, v in fields.items()}
    bit = {s: 1 << (s - 1) for s in (signal.SIGUSR1, signal.SIGPIPE, signal.SIGUSR2)}
    assert code == 0
    assert masks["SigCgt"] & bit[signal.SIGUSR1] == 0  # exec resets it anyway; the point is the window before
    assert masks["SigIgn"] & bit[signal.SIGPIPE] == 0  # Popen's restore_signals
    assert masks["SigBlk"] & bit[signal.SIGUSR2] == bit[signal.SIGUSR2]  # the caller's mask, as Popen's fork keeps
    assert masks["SigBlk"] & ~bit[signal.SIGUSR2] == 0  # and nothing the spawn blocked for its own vfork
    # the vfork'd child reset its own copy of the handlers, not the worker's
    assert mine["SigCgt"] & bit[signal.SIGUSR1] and mine["SigIgn"] & bit[signal.SIGPIPE]


def test_the_parent_death_signal_is_set() -> None:
    code, out, _ = run(["/usr/bin/python3", "-c", PDEATHSIG_PROBE])
    assert code == 0 and int(out) == signal.SIGKILL


@pytest.fixture
def as_root() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("run as another user: needs root")
    yield


@pytest.mark.usefixtures("as_root")
def test_run_as_another_user_gets_exactly_its_uid_gid_and_groups_then_the_parent_death_signal() -> None:
    """setgroups and setregid need the privilege setreuid drops, and the uid change clears the parent-death
    signal: these values are only possible in the order groups, gid, uid, then the signal."""
    creds = {"user": NOBODY, "group": NOBODY, "extra_groups": [NOBODY, 100]}
    code, out, err = run(
        ["/usr/bin/python3", "-c", "import os\n" + PDEATHSIG_PROBE + "print(os.getresuid())\nprint(os.getresgid())\nprint(sorted(os.getgroups()))"],
        cwd="/", creds=creds,
    )  # fmt: skip
    assert (code, err) == (0, b"")
    sig, uids, gids, groups = out.decode().splitlines()
    assert int(sig) == signal.SIGKILL
    assert uids == f"({NOBODY}, {NOBODY}, {NOBODY})" and gids == f"({NOBODY}, {NOBODY}, {NOBODY})"
    assert groups == "[100, 65534]"


@pytest.mark.usefixtures("as_root")
def test_a_group_alone_keeps_the_workers_user_and_supplementary_groups_as_popen_does() -> None:
    creds = {"group": NOBODY}
    probe = "import os; print(os.getresuid(), os.getresgid(), sorted(os.getgroups()))"
    code, out, _ = run(["/usr/bin/python3", "-c", probe], creds=creds)
    popen = subprocess.run(["/usr/bin/python3", "-c", probe], group=NOBODY, capture_output=True, check=True)
    assert code == 0 and out == popen.stdout


@pytest.mark.usefixtures("as_root")
def test_a_command_the_user_may_not_execute_is_popens_permission_error(tmp_path: Path) -> None:
    script = tmp_path / "root-only"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o700)
    creds = {"user": NOBODY, "group": NOBODY, "extra_groups": [NOBODY]}
    with pytest.raises(PermissionError) as popen:
        subprocess.Popen([str(script)], env=ENV, cwd="/", **creds)
    with pytest.raises(PermissionError) as compiled:
        fastspawn.spawn([str(script)], env=ENV, cwd="/", stdin_fd=None, credentials=creds)
    assert (compiled.value.errno, compiled.value.filename) == (popen.value.errno, popen.value.filename)


def test_a_child_whose_parent_is_not_the_worker_runs_nothing(tmp_path: Path) -> None:
    """The parent check: a parent-death signal set after the parent died would never come."""
    marker = tmp_path / "ran"
    code, _, _ = run(["/bin/sh", "-c", f"touch {marker}"], parent=1)
    assert code == 255 and not marker.exists()


def test_a_forked_process_spawns_as_itself_not_as_the_process_it_was_forked_from() -> None:
    """The pid the parent check compares with is read once per process: a forked child reads its own
    (else every command it spawned would find an unexpected parent and run nothing: exit 255)."""
    assert run(["true"])[0] == 0  # this process's pid is known now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child reports through its exit status
        try:
            os._exit(run(["true"])[0])
        finally:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_wait_with_a_timeout_and_poll_behave_as_popens() -> None:
    p = fastspawn.spawn(["/bin/sleep", "5"], env=ENV, cwd=None, stdin_fd=None, credentials={})
    try:
        assert p.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.05)
    finally:
        os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=DEADLINE) == -signal.SIGKILL and p.poll() == -signal.SIGKILL
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    p.stderr.close()


@pytest.mark.usefixtures("as_root")
def test_run_as_another_user_from_a_threaded_worker_changes_only_the_child(tmp_path: Path) -> None:
    """The worker has threads, and the vfork'd child shares its memory: the C library's setuid family would
    broadcast the change to the threads it believes are its own (the worker's). The child's own ids only."""
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        creds = {"user": NOBODY, "group": NOBODY, "extra_groups": [NOBODY]}
        for _ in range(3):
            code, out, _ = run(["/usr/bin/id", "-u"], cwd="/", creds=creds)
            assert (code, out) == (0, f"{NOBODY}\n".encode())
        for tid in os.listdir("/proc/self/task"):
            status = Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
            ids = [line.split()[1:] for line in status if line.startswith(("Uid:", "Gid:"))]
            assert ids == [["0"] * 4, ["0"] * 4], (tid, ids)
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_a_worker_started_with_its_standard_descriptors_closed_still_wires_the_command(tmp_path: Path) -> None:
    """With 0, 1 and 2 closed the output pipes themselves get those numbers: the child must not clobber one
    with another (Popen's care, CPython #12607)."""
    result = tmp_path / "result"
    probe = (
        "import os, sys\n"
        "from steadqd.daemon.worker.run import fastspawn\n"
        "p = fastspawn.spawn(['/bin/sh', '-c', 'echo out; echo err >&2; ls /proc/self/fd | wc -l'],"
        " env={'PATH': '/usr/bin:/bin'}, cwd=None, stdin_fd=None, credentials={})\n"
        "fds = (p.stdout.fileno(), p.stderr.fileno())\n"
        "out, err = p.stdout.read(), p.stderr.read()\n"
        f"open({str(result)!r}, 'w').write(repr((fds, out, err, p.wait())))\n"
    )
    subprocess.run(
        ["/bin/sh", "-c", 'exec 0<&- 1>&- 2>&- "$0" -c "$1"', sys.executable, probe], check=True, timeout=DEADLINE
    )
    fds, out, err, code = eval(result.read_text())  # noqa: S307 - our own repr of plain values
    assert 0 in fds or 1 in fds, f"the pipes did not land on the closed descriptors: {fds}"
    assert (out, err, code) == (b"out\n4\n", b"err\n", 0)  # 0, 1, 2 and ls's own


def test_the_environment_reaches_the_command_exactly_entry_by_entry() -> None:
    """The environment is passed as one buffer of NUL-terminated entries: each one whole, none run together."""
    env = {**ENV, "EMPTY": "", "A": "x", "LONG": "y" * 5000, "UTF": "é€", "EQ": "a=b=c", "RAW": "\udcff", "Z": "last"}
    code, out, _err = run(["/usr/bin/env", "-0"], env=env)
    assert code == 0
    assert sorted(out.split(b"\0")[:-1]) == sorted(os.fsencode(f"{k}={v}") for k, v in env.items())
    for one in ({"ONLY": "1"}, {"B": "", "C": ""}):  # the first and the last entry's offsets, and empty values
        code, out, _err = run(["/usr/bin/env", "-0"], env=one)
        assert (code, sorted(out.split(b"\0")[:-1])) == (0, sorted(f"{k}={v}".encode() for k, v in one.items()))
    code, out, _err = run(["/usr/bin/env", "-0"], env={})
    assert (code, out) == (0, b"")


def test_a_bare_command_is_searched_on_each_jobs_own_path(tmp_path: Path) -> None:
    """The command's candidates are kept per command and PATH: a job with another PATH finds its own program."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        script = tmp_path / name / "which-one"
        script.write_text(f"#!/bin/sh\necho {name}\n")
        script.chmod(0o755)
    for name in ("one", "two", "one"):
        code, out, _err = run(["which-one"], env={"PATH": f"{tmp_path / name}:/usr/bin:/bin"})
        assert (code, out) == (0, f"{name}\n".encode())
