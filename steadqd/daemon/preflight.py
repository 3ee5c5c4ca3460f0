"""What must hold before a role starts, said in one line an operator can act on.

Why a preflight at all
    The usual first-hour mistakes (a queue made by root and never handed to
    the service user, a symlinked or missing queue, a ``command`` that is not
    installed or not executable, a ``user`` or ``working_directory`` that does
    not exist, an unwritable TMPDIR) otherwise surface as a Python traceback
    and a restart loop, or worse, as every job of the backlog failing to
    start and using up its attempts. Each check here names the thing, the
    user it was checked as, the owner and mode where they matter, and the
    fix; the service turns a problem into exit 78, which the units do not
    restart on.

As whom
    Permissions are only meaningful for the user who will use them. The
    daemon checks as itself (the queue, TMPDIR) and as the job's user (the
    command, the working directory). ``steadqd check-config --open`` runs as
    root or as an operator: it checks in a forked child that switched to the
    service's user (:func:`as_account`), and says which user that was.

Transient problems
    A full TMPDIR is not a configuration error: no restart is needed, only
    room. It is reported with ``transient=True``, and the worker holds its
    leasing until it is gone instead of exiting.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from steadqd import backend
from steadqd.constants import STATE_DIRS
from steadqd.daemon.config import QueueSettings, WorkerConfig, open_options
from steadqd.errors import SteadQError
from steadqd.text import printable

__all__ = [
    "SERVICE_USER",
    "Account",
    "LaunchCheck",
    "Problem",
    "as_account",
    "command_problems",
    "credentials_problems",
    "describe_os_error",
    "job_account",
    "queue_problems",
    "service_account",
    "start_problems",
    "tmpdir_problems",
    "worker_problems",
]

SERVICE_USER = "steadq"  # the units' User= (units/steadq-worker@.service, steadq.sysusers.conf)
_PROBE_BYTES = 4096  # what a TMPDIR probe writes: one block, enough to meet a full disk
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Account:
    """A user the checks run as: the numbers decide, the name is for the message."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def current(cls) -> Account:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(name, uid, os.getegid(), tuple(os.getgroups()))

    @classmethod
    def named(cls, user: str, group: str | None = None) -> Account:
        """The account of a user name or number (KeyError if this machine has no such user)."""
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        gid = pw.pw_gid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        return cls(pw.pw_name, pw.pw_uid, gid, tuple(os.getgrouplist(pw.pw_name, gid)))


@dataclass(frozen=True)
class Problem:
    """One thing that keeps a role from working; ``text`` is the whole line, fix included."""

    text: str
    transient: bool = False  # room or time cures it (a full disk): wait, do not exit


def _owner(st: os.stat_result) -> str:
    def name(get: Callable[[int], object], n: int, attr: str) -> str:
        try:
            return str(getattr(get(n), attr))
        except KeyError:
            return str(n)

    return f"{name(pwd.getpwuid, st.st_uid, 'pw_name')}:{name(grp.getgrgid, st.st_gid, 'gr_name')}"


def _where(path: str) -> str:
    """``owner:group mode 0NNN`` of a path, as ``ls -l`` would let a person check it."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"({e.strerror})"
    return f"owner {_owner(st)}, mode {stat.S_IMODE(st.st_mode):04o}"


def _blocked_parent(path: str) -> str | None:
    """The first directory on the way to ``path`` this process may not search, if any."""
    parts = os.path.abspath(path).split("/")[1:-1]
    here = "/"
    for part in parts:
        here = os.path.join(here, part)
        if os.path.isdir(here) and not os.access(here, os.X_OK):
            return here
    return None


def credentials_problems(settings: QueueSettings, account: Account) -> list[Problem]:
    """A bucket queue's credentials file (``s3.credentials_file``): there, readable by ``account``, and by nobody else.

    Why so strict: the file holds the secret key of the store, and the
    queue's group includes every producer; the store would accept them as the worker.
    """
    path = settings.s3.credentials_file if settings.s3 is not None else None
    if path is None:
        return []  # the AWS environment's chain (AWS_* variables, AWS_PROFILE) is the store client's to check
    shown = printable(path)
    fix = f"chown {account.name} {shown}; chmod 600 {shown}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return [
            Problem(
                f"s3.credentials_file {shown} does not exist; write the AWS shared-credentials file there "
                f"([default] aws_access_key_id = ..., aws_secret_access_key = ...), then {fix}"
            )
        ]
    except OSError as e:
        return [Problem(f"s3.credentials_file {shown}: user {account.name} cannot look at it: {e.strerror}; {fix}")]
    if not stat.S_ISREG(st.st_mode):
        return [Problem(f"s3.credentials_file {shown} is not a regular file; name the AWS shared-credentials file")]
    if st.st_mode & 0o077:
        return [
            Problem(
                f"s3.credentials_file {shown} is {_where(path)}: it holds a secret key, so only the service user "
                f"may read it; run: {fix}"
            )
        ]
    if not os.access(path, os.R_OK):
        return [Problem(f"s3.credentials_file {shown} is {_where(path)}: user {account.name} cannot read it; {fix}")]
    return []


def queue_problems(settings: QueueSettings, account: Account) -> list[Problem]:
    """Can ``account`` (the process's own user) use the configured queue directory (or its bucket's credentials)?"""
    if settings.bucket:
        return credentials_problems(settings, account)
    path = settings.queue
    shown = printable(path)
    init = f"runuser -u {account.name} -- steadq init --shared {shown}"
    blocked = _blocked_parent(path)
    if blocked is not None:
        return [
            Problem(
                f"queue {shown}: user {account.name} cannot reach it: {printable(blocked)} is not searchable "
                f"({_where(blocked)}); let the user through (e.g. chmod o+x {printable(blocked)}) or move the queue"
            )
        ]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return [Problem(f"queue {shown} does not exist; create it as the service user: {init}")]
    except OSError as e:
        return [Problem(f"queue {shown}: user {account.name} cannot look at it: {e.strerror}")]
    if stat.S_ISLNK(st.st_mode):
        try:
            target = printable(os.path.realpath(path))
        except OSError:
            target = "?"
        return [
            Problem(
                f"queue {shown} is a symlink (to {target}); queues are never opened through a symlink: "
                f"set `queue:` in {printable(settings.source)} to the real directory"
            )
        ]
    if not stat.S_ISDIR(st.st_mode):
        return [Problem(f"queue {shown} is not a directory; set `queue:` to a queue made with: {init}")]
    for sub in ("", *STATE_DIRS):
        p = os.path.join(path, sub) if sub else path
        if sub and not os.path.isdir(p):
            continue  # not a queue at all, or an old layout: opening the queue says which
        if not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            what = f"queue {shown}" if not sub else f"queue {shown}: {sub}/"
            return [
                Problem(
                    f"{what} is {_where(p)}: user {account.name} cannot read and write it (made by root with "
                    f"`steadq init` and no runuser?); for a queue several users produce into, make it anew "
                    f"while it is empty: {init}; to keep this one: chown -R {account.name}: {shown}"
                )
            ]
    return []


def job_account(cfg: WorkerConfig) -> Account:
    """Who the command runs as: ``worker.user``/``worker.group``, else the daemon's own user."""
    if cfg.user:
        return Account.named(cfg.user, cfg.group)
    here = Account.current()
    if cfg.group:
        gid = int(cfg.group) if cfg.group.isdigit() else grp.getgrnam(cfg.group).gr_gid
        return Account(here.name, here.uid, gid, here.groups)
    return here


def _job_path(cfg: WorkerConfig, parent_env: Mapping[str, str]) -> str:
    """The PATH the command is looked up in: the job's environment decides (subprocess does the same)."""
    if "PATH" in cfg.environment:
        return cfg.environment["PATH"]
    if "PATH" in cfg.pass_environment and "PATH" in parent_env:
        return parent_env["PATH"]
    return os.defpath


def command_problems(cfg: WorkerConfig, account: Account, source: str, parent_env: Mapping[str, str]) -> list[Problem]:
    """Can ``account`` (the process's own user) run the command, in its working directory?"""
    problems: list[Problem] = []
    wd = cfg.working_directory
    if wd is not None:
        if not os.path.isdir(wd):
            problems.append(
                Problem(
                    f"worker.working_directory {printable(wd)} does not exist or is not a directory; create it: "
                    f"install -d -o {account.name} {printable(wd)} (or fix it in {printable(source)})"
                )
            )
        elif not os.access(wd, os.X_OK):
            problems.append(
                Problem(
                    f"worker.working_directory {printable(wd)} is {_where(wd)}: user {account.name} cannot enter "
                    f"it; run: chmod o+x {printable(wd)} or chown {account.name} {printable(wd)}"
                )
            )
    program = "/bin/sh" if cfg.shell else cfg.command[0]
    shown = printable(program)
    full = _program_path(cfg, parent_env)
    if "/" not in program:
        if full is None:
            path = _job_path(cfg, parent_env)
            problems.append(
                Problem(
                    f"worker.command {shown!r} is not found in the job's PATH ({printable(path)}) for user "
                    f"{account.name}; give its absolute path in {printable(source)}, or install it"
                )
            )
        return problems
    assert full is not None
    if not os.path.exists(full):
        fix = f"install it, or fix `worker.command` in {printable(source)}"
        problems.append(Problem(f"worker.command {printable(full)} does not exist; {fix}"))
    elif not os.path.isfile(full):
        problems.append(Problem(f"worker.command {printable(full)} is not a file; fix `worker.command`"))
    elif not os.access(full, os.X_OK):
        blocked = _blocked_parent(full)
        if blocked is not None:
            why = f"{printable(blocked)} is not searchable ({_where(blocked)})"
        else:
            why = f"it is {_where(full)}"
        problems.append(
            Problem(
                f"worker.command {printable(full)} is not executable by user {account.name}: {why}; "
                f"run: chmod a+rx {printable(full)}"
            )
        )
    else:
        problems += _interpreter_problems(full, account)
    return problems


def _program_path(cfg: WorkerConfig, parent_env: Mapping[str, str]) -> str | None:
    """The file the command's exec runs: an absolute path, one under the working directory, or PATH's find."""
    program = "/bin/sh" if cfg.shell else cfg.command[0]
    if "/" not in program:
        return shutil.which(program, path=_job_path(cfg, parent_env))
    wd = cfg.working_directory
    return program if os.path.isabs(program) or wd is None else os.path.join(wd, program)


def _script_interpreter(path: str) -> str | None:
    """The absolute interpreter a script's ``#!`` line names; None for a binary, an unreadable file or a
    relative interpreter (the kernel reads at most the first 256 bytes, and so do we)."""
    try:  # O_NONBLOCK: a FIFO swapped in for the file after its stat must not block the worker's loop
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, 256) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words or not words[0].startswith(b"/"):
        return None
    return os.fsdecode(words[0])


def _interpreter_problems(script: str, account: Account) -> list[Problem]:
    """A script whose ``#!`` interpreter is missing fails its exec with ENOENT as if the script were."""
    interp = _script_interpreter(script)
    if interp is None:
        return []
    head = f"worker.command {printable(script)} is a script for {printable(interp)}, which"
    if not os.path.exists(interp):
        return [Problem(f"{head} does not exist; install it, or fix the script's first line")]
    if not os.access(interp, os.X_OK):
        return [
            Problem(
                f"{head} is not executable by user {account.name}: it is {_where(interp)}; "
                f"run: chmod a+rx {printable(interp)}"
            )
        ]
    return []


class LaunchCheck:
    """The check before each claim (issue 33 #9): will the command's exec find an executable file?

    SteadQ/1 counts an attempt when a job is claimed and no operation gives
    it back (protocol.md, "Identity changes per transition"), so a command
    that cannot start must be found *before* the claim, not by its failed
    exec. This runs before every claim batch and costs a few ``stat``
    calls: the program (after the PATH search for a bare name), whether it
    may be executed, and for a script the interpreter on its ``#!`` line
    (that line is read once per version of the file, cached by its stat).
    It only looks for what surely fails (nothing there, not a file, no
    execute bit anyone could use; for the daemon's own user, ``access``);
    the caller then runs the full checks (:func:`worker_problems`, as the
    job's user) for the line to hold on, so a false alarm costs a check,
    never a hold. What it cannot see: a permission change that only the
    job's user (not the daemon's) is refused by, and anything that happens
    between this check and the exec (the claim and the payload copy); a
    start that fails there still costs its claim's attempt
    (daemon/worker/run/hold.py).
    """

    def __init__(self) -> None:
        self._scripts: dict[tuple[int, int, int, int, int], str | None] = {}

    def looks_startable(self, cfg: WorkerConfig, parent_env: Mapping[str, str] = os.environ) -> bool:
        """False when the command surely cannot start now; True is no promise (see the class)."""
        wd = cfg.working_directory
        if wd is not None and not os.path.isdir(wd):
            return False
        own = not (cfg.user or cfg.group)
        full = _program_path(cfg, parent_env)
        st = None if full is None else _executable(full, own=own)
        if full is None or st is None:
            return False
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in self._scripts:
            if len(self._scripts) >= 16:  # older versions of the file: forget them
                self._scripts.clear()
            self._scripts[key] = _script_interpreter(full)
        interp = self._scripts[key]
        return interp is None or _executable(interp, own=own) is not None


def _executable(path: str, *, own: bool) -> os.stat_result | None:
    """The file's stat if it may be executable, None if it surely is not. The daemon's own user asks
    ``access``; for another, a regular file without any execute bit is executable by no one (with an
    ACL, the group bits are its mask)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    ok = os.access(path, os.X_OK) if own else st.st_mode & 0o111 != 0
    return st if ok else None


def tmpdir_problems(account: Account) -> list[Problem]:
    """Can a payload copy be written where the worker makes them (TMPDIR, else /tmp)?"""
    wanted = os.environ.get("TMPDIR")
    if wanted:
        # tempfile.gettempdir() would quietly fall back to /tmp: say what is wrong with the one asked for.
        if not os.path.isdir(wanted):
            return [Problem(f"TMPDIR {printable(wanted)} does not exist; create it or unset TMPDIR")]
        if not os.access(wanted, os.W_OK | os.X_OK):
            return [
                Problem(
                    f"TMPDIR {printable(wanted)} is {_where(wanted)}: user {account.name} cannot write payload "
                    f"copies there; run: chown {account.name} {printable(wanted)}, or point TMPDIR elsewhere"
                )
            ]
    try:
        base = wanted or tempfile.gettempdir()
    except FileNotFoundError:  # no usable directory among TMPDIR, /tmp, /var/tmp, /usr/tmp, the cwd
        return [Problem(f"no writable temporary directory for user {account.name}; set TMPDIR to one")]
    try:
        d = tempfile.mkdtemp(prefix="steadqd-probe-", dir=base)
    except OSError as e:
        return [_tmp_failure(base, account, e)]
    try:
        with open(os.path.join(d, "probe"), "wb") as f:
            f.write(b"\0" * _PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return [_tmp_failure(base, account, e)]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return []


def _tmp_failure(base: str, account: Account, e: OSError) -> Problem:
    if e.errno in _FULL:
        return Problem(
            f"payload copies cannot be written in {printable(base)}: {e.strerror}; free space there (jobs wait, "
            "nothing is leased until then)",
            transient=True,
        )
    return Problem(
        f"payload copies cannot be written in {printable(base)} ({_where(base)}) by user {account.name}: "
        f"{e.strerror}; make it writable or set TMPDIR to a directory that is"
    )


def worker_problems(settings: QueueSettings, parent_env: Mapping[str, str] = os.environ) -> list[Problem]:
    """Everything a worker needs besides the queue: the job's user, command and room for payloads."""
    cfg = settings.worker
    if cfg is None:
        return []
    try:
        account = job_account(cfg)
    except (KeyError, ValueError):
        who = f"worker.user {cfg.user!r}" if cfg.user else f"worker.group {cfg.group!r}"
        return [
            Problem(
                f"{printable(who)} does not exist on this machine; create it (useradd --system NAME) or fix it in "
                f"{printable(settings.source)}"
            )
        ]
    here = Account.current()
    problems: list[Problem] = []
    if account.uid != here.uid and here.uid != 0:
        problems.append(
            Problem(
                f"worker.user {account.name} needs the worker to start as root to switch users, but it runs as "
                f"{here.name}; add the drop-in of docs/security-units.md (User= and CapabilityBoundingSet=) "
                "or remove `worker.user`"
            )
        )
        return problems
    problems += as_account(account, lambda: command_problems(cfg, account, settings.source, parent_env))
    problems += tmpdir_problems(here)
    return problems


def as_account(account: Account, check: Callable[[], list[Problem]]) -> list[Problem]:
    """Run ``check`` with ``account``'s permissions: directly if that is us, else in a forked child.

    A fork, not a thread: the user change must not touch the daemon's own
    credentials. Only root can switch; anyone else checks as itself (the
    caller says which user that was).
    """
    if account.uid == os.geteuid() or os.geteuid() != 0:
        return check()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: switch, check, report as JSON, never return
        code = 1
        try:
            os.close(r)
            os.setgroups(list(account.groups))
            os.setgid(account.gid)
            os.setuid(account.uid)
            found = check()
            os.write(w, json.dumps([[p.text, p.transient] for p in found]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return [Problem(f"the checks as user {account.name} could not run (the user switch or a check failed)")]
    return [Problem(text, bool(transient)) for text, transient in json.loads(raw)]


def describe_os_error(e: OSError, settings: QueueSettings, account: Account) -> str:
    """The one line for an OS error that stopped a start where no check expected one."""
    name = printable(str(e.filename)) if e.filename is not None else printable(settings.queue)
    line = f"{name}: {e.strerror or e} (as user {account.name}"
    with contextlib.suppress(OSError):
        if e.filename is not None and os.path.lexists(str(e.filename)):
            line += f"; {_where(str(e.filename))}"
    return line + ")"


def service_account(user: str | None) -> Account:
    """Whom ``check-config --open`` checks as: ``user``, else the units' user when run as root, else us."""
    if user:
        return Account.named(user)
    if os.geteuid() == 0:
        with contextlib.suppress(KeyError):
            return Account.named(SERVICE_USER)
    return Account.current()


def start_problems(settings: QueueSettings) -> list[Problem]:
    """Every check a start makes, as the process's own user, including opening the queue."""
    account = Account.current()
    problems = queue_problems(settings, account)
    if problems:
        return problems
    try:  # a bucket queue's store is certified here, as the worker does at start
        backend.open_queue(settings.queue, **open_options(settings, certify=True)).close()
    except SteadQError as e:
        return [Problem(f"queue {printable(settings.queue)}: {e}")]
    except OSError as e:
        return [Problem(describe_os_error(e, settings, account))]
    return worker_problems(settings)
