"""The job spawn goes through ``steadq-exec`` so that Popen can vfork (issue 20, point 1).

A ``preexec_fn`` makes CPython fork the whole worker; the helper takes over
what it did (the parent-death signal after the uid change, the check that the
worker is still the parent) and must report a failed exec exactly as Popen
does, because the start-failure hold keys on the ``OSError``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.worker.run import child, exec_helper, fastspawn, guard

from .conftest import DEADLINE

_KW: dict[str, Any] = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)


@pytest.fixture(autouse=True)
def _fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper is the spawn's fallback: where the compiled spawn is built, these run with it switched off."""
    monkeypatch.setenv(fastspawn.SWITCH, "popen")


def test_the_helper_is_built_by_the_install() -> None:
    assert exec_helper.available(), f"{exec_helper.HELPER} missing: ./dev.sh setup (pip install -e .) builds it"


def _spawn_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, creds: dict[str, Any]
) -> list[tuple[Any, dict[str, Any]]]:
    """Spawn ``/bin/true`` as a job with ``creds`` and wait for it: (argv, keywords) of every Popen it took."""
    seen: list[tuple[Any, dict[str, Any]]] = []
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        seen.append((args[0], kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    payload = tmp_path / "payload"
    payload.write_bytes(b"")
    proc = child.spawn(WorkerConfig(command=("/bin/true",)), {"PATH": "/usr/bin:/bin"}, str(payload), creds)
    try:
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        guard.process_guard().forget(proc.pid)
        guard.process_guard().close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return seen


def test_the_spawner_does_not_fall_back_to_fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a preexec_fn (and without a uid change) CPython's Popen uses vfork."""
    seen = _spawn_true(tmp_path, monkeypatch, {})
    assert seen, "the spawn did not go through Popen"
    assert [kw.get("preexec_fn") for _, kw in seen] == [None] * len(seen)  # the job's, and the guard's if it started


def test_a_command_run_as_another_user_is_not_started_through_the_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPython forks for a uid change anyway, and that user may not be able to execute the helper.

    (A checkout under /root, with ``user: nobody``: every job would fail to start.)
    """
    creds = {"user": os.getuid(), "group": os.getgid(), "extra_groups": os.getgroups()}
    seen = _spawn_true(tmp_path, monkeypatch, creds)
    jobs = [kw for argv, kw in seen if argv == ["/bin/true"]]  # the guard's start may come first
    assert len(jobs) == 1 and jobs[0]["preexec_fn"] is not None


def _write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture()
def bins(tmp_path: Path) -> dict[str, Path]:
    """Directories for PATH searches: one with a command that runs, one where it may not be executed."""
    ok, noexec, empty = tmp_path / "ok", tmp_path / "noexec", tmp_path / "empty"
    for d in (ok, noexec, empty):
        d.mkdir()
    _write(ok / "cmd", "#!/bin/sh\necho ran\n", 0o755)
    _write(noexec / "cmd", "#!/bin/sh\necho ran\n", 0o644)
    _write(ok / "garbage", "\x7fELF not really\n", 0o755)
    return {"ok": ok, "noexec": noexec, "empty": empty, "tmp": tmp_path}


_CASES = {
    "absolute, missing": (["{tmp}/nothing"], "{ok}"),
    "absolute, not executable": (["{noexec}/cmd"], "{ok}"),
    "absolute, a directory": (["{ok}"], "{ok}"),
    "absolute, not a valid executable": (["{ok}/garbage"], "{ok}"),
    "searched, found": (["cmd"], "{empty}:{ok}"),
    "searched, missing": (["no-such-command"], "{empty}:{ok}"),
    "searched, found after a permission error": (["cmd"], "{empty}:{noexec}:{ok}"),
    "searched, not executable: that error, not the later ENOENT": (["cmd"], "{noexec}:{empty}"),
    "searched, a path entry that is a file": (["cmd"], "{ok}/cmd:{empty}"),
}


def case_command(bins: dict[str, Path], case: str) -> tuple[list[str], dict[str, str]]:
    """One of ``_CASES`` with the ``bins`` fixture's paths filled in: (argv, env with its PATH)."""
    argv_t, path_t = _CASES[case]
    fmt = {k: str(v) for k, v in bins.items()}
    return [a.format(**fmt) for a in argv_t], {"PATH": path_t.format(**fmt)}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_an_exec_failure_is_reported_exactly_as_popen_reports_it(bins: dict[str, Path], case: str) -> None:
    argv, env = case_command(bins, case)

    def outcome(start: Any) -> tuple[Any, ...]:
        try:
            p = start(argv, env=env, **_KW)
        except OSError as e:
            return (type(e), e.errno, e.filename)
        out, _ = p.communicate(timeout=DEADLINE)
        return ("ran", p.returncode, out)

    assert outcome(exec_helper.popen) == outcome(subprocess.Popen)


def test_a_failed_start_leaves_no_process_and_no_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recording)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        exec_helper.popen([str(tmp_path / "nothing")], **_KW)
    assert set(os.listdir("/proc/self/fd")) <= before
    assert [p.returncode for p in started] == [127]  # the helper, reaped


def test_the_helper_refuses_to_run_the_command_for_a_parent_that_is_gone(tmp_path: Path) -> None:
    """The getppid check: a parent-death signal set after the parent died would never come."""
    marker = tmp_path / "ran"
    r, w = os.pipe()
    try:
        p = subprocess.Popen(
            [str(exec_helper.HELPER), "1", str(w), "-1", "/bin/sh", "-c", f"touch {marker}"],
            pass_fds=(w,),
            close_fds=True,
        )
        assert p.wait(timeout=DEADLINE) == 255
    finally:
        os.close(w)
    assert os.read(r, 64) == b""
    os.close(r)
    assert not marker.exists()


def test_the_command_keeps_no_report_descriptor(tmp_path: Path) -> None:
    """The report pipe is close-on-exec in the command: only a failed exec can write to it."""
    p = exec_helper.popen(["/bin/sh", "-c", "ls /proc/self/fd"], **_KW)
    out, _ = p.communicate(timeout=DEADLINE)
    assert sorted(out.split()) == [b"0", b"1", b"2", b"3"]  # 3: ls's own directory handle


def test_without_the_helper_the_spawn_still_sets_the_parent_death_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uninstalled tree falls back to preexec_fn: slower, same guarantees."""
    monkeypatch.setattr(exec_helper, "HELPER", tmp_path / "not-built")
    probe = "import ctypes\nv = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\nprint(v.value)\n"
    payload = tmp_path / "payload"
    payload.write_bytes(b"")
    cfg = WorkerConfig(command=("/usr/bin/python3", "-c", probe))
    proc = child.spawn(cfg, {"PATH": "/usr/bin:/bin"}, str(payload), {})
    try:
        out, _ = proc.communicate(timeout=DEADLINE)
    finally:
        guard.process_guard().forget(proc.pid)
        guard.process_guard().close()
    assert int(out) == signal.SIGKILL
