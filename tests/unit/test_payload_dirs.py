"""Payload copies a killed worker left in the temp directory are removed by the next one,
and nothing else is: not a live worker's, not another pid namespace's, not a stranger's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.daemon.worker import payload
from steadqd.daemon.worker.run import fastspawn


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no such process (pid reuse within this test is not a concern)


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    return tmp_path


@pytest.fixture(params=["python", "compiled"])
def remover(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """payload.remove in Python, and through run/spawn.c's steadq_remove_copy (the worker's, where built)."""
    if request.param == "compiled":
        compiled = fastspawn.remove_copy()
        if compiled is None:
            pytest.skip("the spawn module is not built")
        monkeypatch.setattr(payload, "_compiled_remove", compiled)
    else:
        monkeypatch.setattr(payload, "_compiled_remove", None)
    return str(request.param)


def test_make_names_the_creator_and_is_private(tmp: Path) -> None:
    d = Path(payload.make("0123456789abcdef0123456789abcdef"))
    assert d.parent == tmp
    ns = os.stat("/proc/self/ns/pid").st_ino
    assert d.name.startswith(f"steadqd-{ns}-{os.getpid()}-0123456789ab-")
    assert oct(d.stat().st_mode & 0o777) == oct(0o700)


def test_copies_are_made_in_the_temp_dir_absolute_and_follow_a_change_of_it(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """temp_dir is tempfile's directory made absolute, asked again when it changes (its memo is not stale)."""
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    monkeypatch.chdir(tmp)
    monkeypatch.setattr("tempfile.tempdir", "a")
    assert payload.temp_dir() == str(tmp / "a")
    d = payload.make("0123456789abcdef")
    assert os.path.dirname(d) == str(tmp / "a")
    monkeypatch.setattr("tempfile.tempdir", "b/")
    d = payload.make("0123456789abcdef")
    assert os.path.dirname(d) == str(tmp / "b")
    assert payload.remove_stale() == []  # scans b, where only this live worker's copy is


def test_remove_stale_takes_only_dead_workers_of_this_namespace(tmp: Path) -> None:
    ns = os.stat("/proc/self/ns/pid").st_ino
    dead = tmp / f"steadqd-{ns}-{_dead_pid()}-0123456789ab-x1"
    live = tmp / f"steadqd-{ns}-{os.getppid()}-0123456789ab-x2"
    mine = Path(payload.make("ab" * 16))
    other_ns = tmp / f"steadqd-{ns + 1}-{_dead_pid()}-0123456789ab-x3"
    old_style = tmp / "steadqd-0123456789ab-x4"
    stranger = tmp / "unrelated-dir"
    for d in (dead, live, other_ns, old_style, stranger):
        d.mkdir()
    (dead / "payload").write_bytes(b"secret")
    os.chmod(dead / "payload", 0o400)
    if os.geteuid() == 0:
        os.chmod(dead, 0o500)  # as when the job ran as another user (only root removes that)
    removed = payload.remove_stale()
    assert removed == [str(dead)]
    assert not dead.exists()
    for d in (live, mine, other_ns, old_style, stranger):
        assert d.exists(), d


def _filled(tmp: Path, *, readonly: bool) -> str:
    """A job's directory as the claim leaves it: its payload copy (0400) and progress file."""
    d = payload.make("ab" * 16)
    payload.make_progress(d)
    payload.write_copy(d, lambda f: f.write(b"payload"))
    if readonly:
        os.chmod(d, 0o500)  # as for a command run as another user (write_copy with an owner)
    return d


@pytest.mark.parametrize("readonly", [False, True])
def test_remove_takes_the_directory_with_its_own_files(tmp: Path, readonly: bool, remover: str) -> None:
    d = _filled(tmp, readonly=readonly)
    payload.remove(d)
    assert not os.path.lexists(d)


@pytest.mark.parametrize("what", ["a file", "a tree", "progress replaced by a directory", "a symlink out"])
def test_remove_takes_whatever_the_command_left_there_too_and_nothing_outside(
    tmp: Path, what: str, remover: str
) -> None:
    """A command run as the daemon's user may write into its directory: all of it goes, nothing it points to."""
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    d = Path(_filled(tmp, readonly=False))
    if what == "a file":
        (d / "out.txt").write_text("x")
    elif what == "a tree":
        (d / "sub" / "deeper").mkdir(parents=True)
        (d / "sub" / "deeper" / "f").write_text("x")
    elif what == "progress replaced by a directory":
        (d / "progress").unlink()
        (d / "progress").mkdir()
        (d / "progress" / "f").write_text("x")
    else:
        (d / "link").symlink_to(outside)
    payload.remove(str(d))
    assert not os.path.lexists(d)
    assert (outside / "keep").read_text() == "x"


def test_remove_of_a_missing_or_empty_name_does_nothing(tmp: Path, remover: str) -> None:
    payload.remove("")
    payload.remove(str(tmp / "never-made"))
    assert list(tmp.iterdir()) == []


def test_remove_of_a_directory_swapped_for_a_symlink_touches_nothing_it_points_to(tmp: Path, remover: str) -> None:
    """A command that owns its directory (user: with input: file) may rename it and plant a symlink."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    for name in ("payload", "progress", "other"):
        (elsewhere / name).write_text("keep")
    d = payload.make("cd" * 16)
    os.rename(d, tmp / "moved")
    os.symlink(elsewhere, d)
    payload.remove(d)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["other", "payload", "progress"]
    assert oct(elsewhere.stat().st_mode & 0o777) == oct(0o755)


_AS_USER = r"""
import os, sys
from steadqd.daemon.worker import payload
from steadqd.daemon.worker.run import fastspawn
if sys.argv[4] == "compiled":
    payload.use_compiled(fastspawn.remove_copy())
os.umask(int(sys.argv[2], 8))
if sys.argv[3] != "-":
    os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[3]))
d = payload.make("ab" * 16)
payload.make_progress(d)
path = payload.write_copy(d, lambda f: f.write(b"x" * 300000))
mode = os.stat(path).st_mode & 0o777
with open(path, "rb") as f:
    size = len(f.read())
if sys.argv[1] == "readonly":
    os.chmod(d, 0o500)  # as a command run as the daemon's user may leave it
payload.remove(d)
print(oct(mode), size, os.path.lexists(d))
"""


def _as_user(tmp: Path, how: str, umask: str, uid: str = "-", remover: str = "python") -> list[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = subprocess.run(
        [sys.executable, "-c", _AS_USER, how, umask, uid, remover], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("umask", ["022", "007", "477"])
def test_the_copy_is_0400_whatever_the_umask(tmp: Path, umask: str) -> None:
    """The copy is created 0400 (no fchmod) unless the umask would cut its owner's read bit, then fchmod'ed."""
    assert _as_user(tmp, "plain", umask) == ["0o400", "300000", "False"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
@pytest.mark.parametrize("how", ["plain", "readonly"])
def test_a_daemon_not_root_removes_its_directory_even_made_unwritable(tmp: Path, how: str, remover: str) -> None:
    """Not root, the daemon's unlink in a 0500 directory is refused: it makes the directory writable then."""
    os.chmod(tmp, 0o1777)
    assert _as_user(tmp, how, "007", "65534", remover) == ["0o400", "300000", "False"]


class _Tails:
    """A random source that hands out the given tails in order (payload.make draws 32 bits, 8 hex digits)."""

    def __init__(self, *tails: str) -> None:
        self.tails = list(tails)

    def getrandbits(self, k: int) -> int:
        assert k == 32
        return int(self.tails.pop(0), 16)


def test_a_forked_child_names_its_copies_with_its_own_pid(tmp: Path) -> None:
    payload.make("ab" * 16)  # this process's prefix is made
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(w, os.path.basename(payload.make("cd" * 16)).encode())
        finally:
            os._exit(0)
    os.close(w)
    name = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert name.split("-")[2] == str(pid)


@pytest.fixture
def compiled_make(monkeypatch: pytest.MonkeyPatch) -> None:
    maker = fastspawn.make_copy()
    if maker is None:
        pytest.skip("the spawn module is not built")
    monkeypatch.setattr(payload, "_compiled_make", maker)


def _modes(d: str) -> tuple[str, str, str, bytes, bytes]:
    def mode(p: str) -> str:
        return oct(os.stat(p).st_mode & 0o777)

    with open(f"{d}/payload", "rb") as f, open(f"{d}/progress", "rb") as g:
        return mode(d), mode(f"{d}/progress"), mode(f"{d}/payload"), f.read(), g.read()


@pytest.mark.usefixtures("compiled_make")
def test_the_compiled_copy_is_made_as_the_three_python_steps_make_it(tmp: Path) -> None:
    """make_with_files (run/spawn.c): the same name pattern, directory, progress file and payload file modes."""
    by_python = payload.make("ab" * 16)
    payload.make_progress(by_python)
    payload.write_copy(by_python, lambda f: f.write(b"x" * 200000))
    made = payload.make_with_files("ab" * 16)
    assert made is not None
    d, progress, fd = made
    assert progress == f"{d}/progress" and os.path.dirname(d) == str(tmp)
    assert os.path.basename(d)[:-8] == os.path.basename(by_python)[:-8]
    assert payload.fill_copy(d, fd, lambda f: f.write(b"x" * 200000)) == f"{d}/payload"
    assert _modes(d) == _modes(by_python) == ("0o700", "0o600", "0o400", b"x" * 200000, b"")


def _made_by_python() -> str:
    return payload.make("0123456789abcdef0123456789abcdef")


def _made_compiled() -> str:
    made = payload.make_with_files("0123456789abcdef0123456789abcdef")
    assert made is not None
    os.close(made[2])
    return made[0]


@pytest.mark.parametrize("how", ["python", "compiled"])
def test_make_takes_another_name_when_one_exists_and_follows_no_symlink(
    how: str, tmp: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    """payload.make and its compiled twin (run/spawn.c): a planted symlink or directory is skipped, not used."""
    if how == "compiled":
        request.getfixturevalue("compiled_make")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    prefix = f"steadqd-{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}-"
    request.getfixturevalue("monkeypatch").setattr(
        payload, "_made", (prefix, _Tails("aaaaaaaa", "bbbbbbbb", "0000000c"))
    )
    (tmp / f"{prefix}0123456789ab-aaaaaaaa").symlink_to(elsewhere)  # planted: mkdir fails, nothing followed
    (tmp / f"{prefix}0123456789ab-bbbbbbbb").mkdir()
    d = _made_compiled() if how == "compiled" else _made_by_python()
    assert d == str(tmp / f"{prefix}0123456789ab-0000000c")
    assert oct(os.stat(d).st_mode & 0o777) == oct(0o700)
    assert list(elsewhere.iterdir()) == [] and list((tmp / f"{prefix}0123456789ab-bbbbbbbb").iterdir()) == []


_MAKE_FAILS = r"""
import os, sys
from steadqd.daemon.worker import payload
from steadqd.daemon.worker.run import fastspawn
payload.use_compiled(None, fastspawn.make_copy())
os.setgid(65534); os.setuid(65534)
os.umask(0o777)  # the directory is made 0000: its files cannot be created in it
try:
    payload.make_with_files("ab" * 16)
except PermissionError:
    print("refused", sorted(os.listdir(sys.argv[1])))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
@pytest.mark.usefixtures("compiled_make")
def test_a_compiled_copy_that_fails_halfway_leaves_nothing() -> None:
    """The directory was made but its files cannot be (uid 65534 under umask 777): nothing is left."""
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(dir="/tmp")  # reachable by uid 65534 (pytest's own tmp_path is not)
    try:
        os.chmod(shared, 0o1777)
        env = {**os.environ, "TMPDIR": shared}
        r = subprocess.run(
            [sys.executable, "-c", _MAKE_FAILS, shared], capture_output=True, text=True, env=env, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["refused", "[]"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
