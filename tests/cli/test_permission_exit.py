"""Exit 5 (permission denied) from OS permission errors, as cli.md maps them.

The console script cannot run as another user here (the interpreter lives
under /root), so a forked child drops to an unprivileged uid and calls the
CLI's entry point in-process: the same code path, real permission checks.
"""

from __future__ import annotations

import contextlib
import io
import os

import pytest

from steadqd import Queue
from steadqd.cli.main import main
from steadqd.version import installed_version

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def run_as_nobody(argv: list[str]) -> tuple[int, str]:
    installed_version()  # imports what importlib.metadata imports lazily, which nobody could not read under /root
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            os.write(w, err.getvalue().encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


@pytest.fixture
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("perm")
    parent = str(d)
    while parent != "/":
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)
    os.chmod(d, 0o755)
    return str(d)


def test_unreadable_input_file_exits_5(world):
    path = os.path.join(world, "q")
    Queue.init(path, shards=2).close()
    secret = os.path.join(world, "secret.bin")
    with open(secret, "wb") as f:
        f.write(b"x")
    os.chmod(secret, 0o600)
    code, err = run_as_nobody(["put", path, secret])
    assert code == 5, err
    assert "secret.bin" in err and "ermission denied" in err


def test_unreadable_handle_file_exits_5(world):
    path = os.path.join(world, "q2")
    os.mkdir(path)
    os.chown(path, 0, NOBODY)  # a shared queue nobody's group may use: only the handle is denied
    Queue.init(path, shards=2, shared=True).close()
    handle = os.path.join(world, "h.json")
    with open(handle, "w") as f:
        f.write("{}")
    os.chmod(handle, 0o600)
    code, err = run_as_nobody(["ack", path, "--handle-file", handle])
    assert code == 5, err
    assert "h.json" in err, err


def test_init_in_a_directory_without_write_permission_exits_5(world):
    locked = os.path.join(world, "locked")
    os.mkdir(locked, 0o755)
    code, err = run_as_nobody(["init", os.path.join(locked, "q")])
    assert code == 5, err
    assert not os.path.exists(os.path.join(locked, "q"))


def test_a_queue_of_another_user_is_refused_naming_its_owner(world):
    path = os.path.join(world, "private")
    Queue.init(path, shards=2).close()
    code, err = run_as_nobody(["ls", path])
    assert code == 5, err
    assert err.splitlines() == [
        f"cannot open queue {path}: {path}: Permission denied (the queue belongs to root, mode 0700: run the "
        "command as root, or as a member of its group if the queue was made with init --shared)"
    ]
