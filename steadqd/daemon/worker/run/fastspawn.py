"""One job spawn in one vfork and one exec: the compiled path (``spawn.c``, cffi API mode).

Popen with ``steadq-exec`` (steadqd.daemon.worker.run.exec_helper) takes two
execs per job, the helper's and the command's, and about 0.85 ms of the
child's CPU for the helper alone; a command run as another user makes
CPython fork the whole worker. ``spawn.c`` does in one vfork'd child what
Popen's child and the helper did together, in the same order (its header
comment lists it: descriptors, cwd, signals, session, groups/gid/uid, other
descriptors closed, the parent-death signal after the uid change, the parent
check, Popen's PATH search) and executes the command itself, for every job,
whoever it runs as.

A start failure stays exact: the vfork'd child shares the worker's memory
and the worker is suspended until its exec or exit, so :func:`spawn` knows
on return whether the exec worked and raises the ``OSError`` Popen would
(the command as its filename for an exec, the directory for a chdir), which
``steadqd.daemon.worker.run.hold`` relies on. No report pipe is needed.

The worker spawns through :class:`Pool`: a few C threads started once per
process that do the vfork, so its loop goes on while each child runs up to
its exec, and spawns overlap. They never end, because the child's
parent-death signal fires when the thread that forked it ends.

Without the built module (a source tree whose extension was never built, or
``STEADQ_SPAWN=popen`` in the worker's environment, the fallback's switch for
tests and for an operator who suspects the compiled path) the worker spawns
through Popen as before; :func:`path` says which path runs and why.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

try:
    from steadqd.daemon.worker.run import _fastspawn  # type: ignore[attr-defined]
except ImportError as e:  # not built: the Popen path
    _fastspawn = None
    _MISSING = f"the compiled spawn module is not built ({e})"
else:
    _MISSING = ""

__all__ = ["Pool", "Process", "Spawned", "available", "make_copy", "path", "pool", "remove_copy", "spawn"]

SWITCH = "STEADQ_SPAWN"  # "popen": the fallback even where the module is built


class Process(Protocol):
    """What the worker uses of a started command; ``subprocess.Popen`` is one."""

    @property
    def pid(self) -> int: ...

    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | Any

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def available() -> bool:
    """Does the worker spawn through the compiled path?"""
    return _fastspawn is not None and os.environ.get(SWITCH, "") != "popen"


def remove_copy() -> Callable[[str], int] | None:
    """spawn.c's removal of a job's payload copy directory (``payload.use_compiled``), None where not built.

    Not tied to the spawn path: with ``STEADQ_SPAWN=popen`` too, the settling thread drops the GIL once for
    the five syscalls instead of once each."""
    if _fastspawn is None:
        return None
    lib = _fastspawn.lib

    def remove(directory: str) -> int:
        # os.fsencode of a str, as _cstr encodes one (its fspath and isinstance were two calls a job more)
        raw = directory.encode(_FS_ENCODING, _FS_ERRORS) if type(directory) is str else os.fsencode(directory)
        return int(lib.steadq_remove_copy(raw))

    return remove


def make_copy() -> Callable[[str], int] | None:
    """spawn.c's making of a job's payload copy directory with its two files (``payload.use_compiled``):
    the payload's descriptor or -errno; None where not built."""
    if _fastspawn is None:
        return None
    lib = _fastspawn.lib

    def make(directory: str) -> int:
        raw = directory.encode(_FS_ENCODING, _FS_ERRORS) if type(directory) is str else os.fsencode(directory)
        return int(lib.steadq_make_copy(raw, len(raw)))

    return make


def path() -> str:
    """Which spawn path the worker uses and why, one line (for ``steadq doctor`` and ``--version``)."""
    if available():
        return "compiled (one vfork and one exec per job: steadqd/daemon/worker/run/spawn.c)"
    why = f"{SWITCH}=popen is set" if _fastspawn is not None else _MISSING
    return f"Popen and steadq-exec (two execs per job): {why}"


class PipeEnd:
    """The worker's end of a command's output pipe: what the worker uses of a file (``fileno``, ``close``,
    ``read``), without the ``fstat`` a Python file object makes at its creation (two a job)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on closed pipe")
        return self._fd

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (one read), or everything up to EOF (``size`` < 0), waiting for them when the
        end is non-blocking (the worker's loop reads its descriptor itself: this is for tools and tests)."""
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(self.fileno(), 65536 if size < 0 else size)
            except BlockingIOError:
                select.select([self._fd], [], [])
                continue
            if size >= 0:
                return chunk
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> PipeEnd:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # as a file object: a pipe end dropped unclosed does not leak its descriptor
        if self._fd >= 0:  # the worker closes both of a job's: no call then
            self.close()


class Spawned:
    """A command :func:`spawn` started: the part of ``subprocess.Popen`` the worker uses (pid, pipes, reaping).

    ``pipes_nonblocking``: the spawn pool's thread made the pipes' read ends non-blocking already."""

    def __init__(
        self,
        args: Sequence[str],
        pid: int,
        stdout: IO[bytes] | PipeEnd | None,
        stderr: IO[bytes] | PipeEnd | None,
        *,
        pipes_nonblocking: bool = False,
    ) -> None:
        self.args = list(args)
        self.pid = pid  # an attribute, as Popen's: the loop reads it a dozen times a job
        self.stdin: IO[bytes] | None = None
        # What Popen's are, to the worker (typing.cast is a call, twice a job on the loop's thread: not used).
        self.stdout: IO[bytes] | None = stdout  # type: ignore[assignment]
        self.stderr: IO[bytes] | None = stderr  # type: ignore[assignment]
        self.returncode: int | None = None
        self.pipes_nonblocking = pipes_nonblocking

    def poll(self) -> int | None:
        """Reap it if it has exited (Popen's poll: a child someone else reaped counts as exit 0)."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for its exit (``subprocess.TimeoutExpired`` after ``timeout`` seconds, as Popen)."""
        if timeout is None:
            while self.returncode is None:
                try:
                    _, status = os.waitpid(self.pid, 0)
                except ChildProcessError:
                    self.returncode = 0
                else:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, remaining, 0.05))
            delay *= 2
        return code


# os.fsencode's encoding and error handler, read once as os reads them: a str is encoded here without its
# fspath and isinstance (a job's few environment entries not in _entry's cache: four strings a job).
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def _cstr(text: str | bytes, what: str) -> bytes:
    raw = text.encode(_FS_ENCODING, _FS_ERRORS) if type(text) is str else os.fsencode(text)
    if b"\0" in raw:
        raise ValueError(f"embedded null byte in the {what}")
    return raw


def _executables(program: str, env: Mapping[str, str]) -> list[bytes]:
    """Popen's candidates: the program itself when it names a directory, else each entry of the job's PATH."""
    prog = _cstr(program, "command")
    if os.path.dirname(prog):
        return [prog]
    return [os.path.join(os.fsencode(d), prog) for d in os.get_exec_path(env)]


@functools.lru_cache(maxsize=256)
def _entry(name: str, value: str) -> bytes:
    """One ``NAME=value`` entry (ValueError as Popen's). Cached: most of a job's entries are its
    configuration's and the queue's, the same for every job (a job's own few push out the oldest)."""
    return _entry_key(name) + _cstr(value, "environment")


@functools.lru_cache(maxsize=256)
def _entry_key(name: str) -> bytes:
    """``NAME=`` (ValueError as Popen's). Cached apart: a job's own entries miss _entry's cache, not this one."""
    key = _cstr(name, "environment")
    if not key or b"=" in key:
        raise ValueError(f"illegal environment variable name {name!r}")
    return key + b"="


@functools.lru_cache(maxsize=32)
def _command(argv: tuple[str, ...], path: str | None) -> tuple[Any, int, Any, object]:
    """The C arrays of a command's candidate paths and arguments, the candidates' count, and the strings
    the arrays point into (to keep them alive).

    The same for every job of a configuration, so built once per command and PATH (spawn.c only reads them).
    """
    assert _fastspawn is not None
    ffi = _fastspawn.ffi
    execs = [ffi.new("char[]", p) for p in _executables(argv[0], {} if path is None else {"PATH": path})]
    args = [ffi.new("char[]", _cstr(a, "command")) for a in argv]
    c_execs = ffi.new("char *[]", execs)
    c_argv = ffi.new("char *[]", [*args, ffi.NULL])
    return c_execs, len(execs), c_argv, (execs, args)


def _environment_block(env: Mapping[str, str]) -> tuple[Any, Any]:
    """The environment as one buffer of NUL-terminated entries and the array pointing into it (keep both)."""
    assert _fastspawn is not None
    ffi = _fastspawn.ffi
    entries = [_entry(k, v) for k, v in env.items()]
    block = ffi.new("char[]", b"\0".join(entries))
    base = ffi.cast("char *", block)
    # Each entry's offset in the block (the lengths before it, each with its NUL), in C loops (map, accumulate)
    # rather than a len and an append an entry; the last offset is the block's end: the array's NULL instead.
    pointers = [base + o for o in itertools.accumulate(map(_PLUS_ONE, map(len, entries)), initial=0)]
    pointers[-1] = ffi.NULL
    return block, ffi.new("char *[]", pointers)


_PLUS_ONE = (1).__add__


_devnull: int | None = None


def _stdin_null() -> int:
    """One /dev/null for every job's stdin (Popen opens one per job), opened at the first spawn."""
    global _devnull
    if _devnull is None:
        _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _devnull


# This process's pid and descriptor limit, read at the first spawn instead of one getpid and one prlimit64 a
# job; a forked child reads its own again. (The limit only bounds the descriptor-closing loop of a kernel
# without close_range; steadqd never changes it.)
_process: tuple[int, int] | None = None


def _forget_process() -> None:
    global _process
    _process = None


os.register_at_fork(after_in_child=_forget_process)


def _pid_and_max_fd() -> tuple[int, int]:
    global _process
    if _process is None:
        _process = (os.getpid(), os.sysconf("SC_OPEN_MAX"))
    return _process


def _error(stage: int, err: int, program: str, cwd: str | None) -> OSError:
    """The ``OSError`` Popen raises for the same failed step."""
    lib = _fastspawn.lib
    if stage == lib.STEADQ_SPAWN_EXEC:
        return OSError(err, os.strerror(err), program)
    if stage == lib.STEADQ_SPAWN_CHDIR:
        return OSError(err, os.strerror(err), cwd)
    return OSError(err, os.strerror(err))


def _build(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    stdin_fd: int | None,
    credentials: Mapping[str, Any],
    parent: int | None,
    guard_fd: int,
    guard_tail: bytes,
    out_w: int,
    err_w: int,
) -> tuple[Any, object]:
    """spawn.c's arguments, and what they point into (alive until the spawn is done)."""
    ffi = _fastspawn.ffi
    c_execs, n_execs, c_argv, strings = _command(tuple(argv), env.get("PATH"))
    block, c_envp = _environment_block(env)
    c_cwd = ffi.new("char[]", _cstr(cwd, "working directory")) if cwd is not None else ffi.NULL
    # A job run as the worker's own user has no credentials: three lookups fewer a job.
    groups = credentials.get("extra_groups") if credentials else None
    c_groups = ffi.new("gid_t[]", list(groups)) if groups is not None else ffi.NULL
    c_tail = ffi.new("char[]", guard_tail)
    a = ffi.new("struct steadq_spawn_args *")
    a.executables, a.n_executables = c_execs, n_execs
    a.argv, a.envp, a.cwd = c_argv, c_envp, c_cwd
    a.stdin_fd = _stdin_null() if stdin_fd is None else stdin_fd
    a.stdout_fd, a.stderr_fd = out_w, err_w
    a.groups, a.ngroups = c_groups, (len(groups) if groups is not None else -1)
    if credentials:
        a.gid = credentials.get("group", -1)
        a.uid = credentials.get("user", -1)
    else:
        a.gid = a.uid = -1
    pid, max_fd = _pid_and_max_fd()
    a.parent = pid if parent is None else parent
    a.max_fd = max_fd
    a.guard_fd, a.guard_tail = guard_fd, c_tail
    return a, (c_execs, c_argv, strings, block, c_envp, c_cwd, c_groups, c_tail)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    stdin_fd: int | None,
    credentials: Mapping[str, Any],
    parent: int | None = None,
    guard_fd: int = -1,
    guard_tail: bytes = b"\n",
) -> Spawned:
    """Start ``argv`` in a session of its own, stdout and stderr on pipes, stdin from ``stdin_fd`` (None:
    /dev/null), as ``credentials`` say (:func:`steadqd.daemon.worker.run.child.identity`'s keywords).

    Returns once its exec worked; raises Popen's ``OSError`` when a step failed, ``ValueError`` for a NUL
    in an argument or the environment (as Popen does). ``parent``: the pid the child must find as its parent
    before it executes anything (default: this process; a test passes another to see it refuse).
    ``guard_fd``: the guard's pipe (close-on-exec, >= 3; -1: none), to which the child writes
    ``+PID`` and ``guard_tail`` before it runs anything, and ``-PID`` if it then fails.
    The child's parent-death signal follows the calling thread: :class:`Pool` spawns from threads that never end.
    """
    assert _fastspawn is not None, "spawn() without the compiled module: check available() first"
    ffi, lib = _fastspawn.ffi, _fastspawn.lib
    if not argv:
        raise ValueError("empty command")
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        a, _keep = _build(argv, env, cwd, stdin_fd, credentials, parent, guard_fd, guard_tail, out_w, err_w)
        stage, err = ffi.new("int *"), ffi.new("int *")
        pid = lib.steadq_spawn(a, stage, err)
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    if pid < 0:
        os.close(out_r)
        os.close(err_r)
        raise _error(stage[0], err[0], argv[0], cwd)
    return Spawned(argv, pid, PipeEnd(out_r), PipeEnd(err_r))


SPAWN_THREADS = 4  # the pool's threads: at concurrency 4 no spawn waits for another


def _above_standard(fd: int) -> int:
    """``fd`` moved to 3 or above (a daemon may run with 0, 1 and 2 closed: a pipe there would be written to
    as stdout or stderr)."""
    if fd >= 3:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


class Pending:
    """A spawn handed to the :class:`Pool`: what it needs kept alive until the pool's thread is done with it."""

    __slots__ = ("argv", "cwd", "err_r", "job", "keep", "out_r")

    def __init__(self, argv: Sequence[str], cwd: str | None, job: Any, keep: object, out_r: int, err_r: int) -> None:
        self.argv, self.cwd, self.job, self.keep, self.out_r, self.err_r = list(argv), cwd, job, keep, out_r, err_r

    def result(self) -> Spawned | OSError:
        """The started command, or the ``OSError`` :func:`spawn` would have raised."""
        if self.job.pid < 0:
            os.close(self.out_r)
            os.close(self.err_r)
            return _error(self.job.stage, self.job.err, self.argv[0], self.cwd)
        return Spawned(
            self.argv,
            self.job.pid,
            PipeEnd(self.out_r),
            PipeEnd(self.err_r),
            pipes_nonblocking=bool(self.job.nonblocking),
        )


class Pool:
    """Spawns in a few C threads (spawn.c), so the worker's loop does not wait in vfork for a child's exec.

    :meth:`submit` hands a spawn over and returns its token at once; the
    pool's descriptor (:meth:`fileno`) becomes readable when spawns are done,
    and :meth:`collect` returns their results. The threads never end (a
    child's parent-death signal fires when the thread that forked it ends,
    so they must outlive every job), so there is one pool per process
    (:func:`pool`). The submitting thread's signal mask at the pool's start
    is every child's.
    """

    def __init__(self, threads: int = SPAWN_THREADS) -> None:
        assert _fastspawn is not None, "a spawn pool without the compiled module: check available() first"
        r, w = os.pipe2(os.O_CLOEXEC)
        r, w = _above_standard(r), _above_standard(w)
        os.set_blocking(r, False)
        rc = _fastspawn.lib.steadq_pool_start(threads, w)
        if rc != 0:
            os.close(r)
            os.close(w)
            raise OSError(rc, f"cannot start the spawn threads: {os.strerror(rc)}")
        self._r = r  # the write end stays open for the process's life: the threads write there
        self._pending: dict[int, Pending] = {}
        self._done: dict[int, Spawned | OSError] = {}  # read from the descriptor, not collected yet
        self._tokens = itertools.count(1)
        self._partial = b""

    def fileno(self) -> int:
        return self._r

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        stdin_fd: int | None,
        credentials: Mapping[str, Any],
        guard_fd: int = -1,
        guard_tail: bytes = b"\n",
    ) -> int:
        """:func:`spawn`'s work in a pool thread; its token. ``stdin_fd`` is the pool's from here: closed
        once the spawn is done (also when this raises ``ValueError`` for a NUL or a bad variable name)."""
        ffi, lib = _fastspawn.ffi, _fastspawn.lib
        out_r = out_w = err_r = err_w = -1
        try:
            if not argv:
                raise ValueError("empty command")
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            a, keep = _build(argv, env, cwd, stdin_fd, credentials, None, guard_fd, guard_tail, out_w, err_w)
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w, -1 if stdin_fd is None else stdin_fd):
                if fd >= 0:
                    os.close(fd)
            raise
        token = next(self._tokens)
        job = ffi.new("struct steadq_spawn_job *")
        job.args, job.token = a, token
        job.close_fds = [out_w, err_w, -1 if stdin_fd is None else stdin_fd]
        job.nonblock_fds = [out_r, err_r]
        self._pending[token] = Pending(argv, cwd, job, (a, keep), out_r, err_r)
        lib.steadq_pool_submit(job)
        return token

    def collect(self) -> list[tuple[int, Spawned | OSError]]:
        """The spawns done since the last call, by token (never blocks)."""
        self._read()
        done = list(self._done.items())
        self._done.clear()
        return done

    @property
    def uncollected(self) -> bool:
        """Spawns are done that :meth:`collect` has not returned (their tokens are read: the descriptor is quiet)."""
        return bool(self._done)

    def started_pids(self, timeout: float) -> list[int] | None:
        """The pids of the commands started but not collected yet, once no spawn is in flight (waiting up to
        ``timeout`` seconds for those that are); None if one still is (its child's pid is not known yet)."""
        deadline = time.monotonic() + timeout
        self._read()
        while self._pending and (left := deadline - time.monotonic()) > 0:
            self.wait(left)
            self._read()
        if self._pending:
            return None
        return [r.pid for r in self._done.values() if isinstance(r, Spawned)]

    def _read(self) -> None:
        """Move the spawns whose tokens came back from pending to done."""
        raw = self._partial
        try:  # once a loop pass with spawns: no context manager's calls
            while chunk := os.read(self._r, 4096):
                raw += chunk
                if len(chunk) < 4096:
                    break
        except BlockingIOError:
            pass
        whole = len(raw) & ~7  # whole tokens (8 bytes each)
        self._partial = raw[whole:]
        for (token,) in struct.iter_unpack("=Q", raw[:whole]):
            pending = self._pending.pop(token, None)
            if pending is not None:
                self._done[token] = pending.result()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pool's descriptor (a stop waiting for spawns in flight)."""
        return bool(select.select([self._r], [], [], max(0.0, timeout))[0])


_pool: Pool | None = None


def pool() -> Pool:
    """This process's spawn pool, started at the first call (``OSError`` if its threads cannot be started)."""
    global _pool
    if _pool is None:
        _pool = Pool()
    return _pool
