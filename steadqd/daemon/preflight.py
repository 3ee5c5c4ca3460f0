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
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from steadqd import backend
from steadqd.constants import STATE_DIRS
from steadqd.daemon.command_check import LaunchCheck, command_problems
from steadqd.daemon.config import QueueSettings, WorkerConfig, open_options
from steadqd.daemon.metrics import directory_problem, textfile_for
from steadqd.daemon.problem import Account, Problem, blocked_parent, owner_mode
from steadqd.daemon.worker import payload
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
    "inbox_problems",
    "job_account",
    "metrics_problems",
    "queue_problems",
    "service_account",
    "start_problems",
    "tmpdir_problems",
    "unit_path_warnings",
    "worker_problems",
]

SERVICE_USER = "steadq"  # the units' User= (units/steadq-worker@.service, steadq.sysusers.conf)
_PROBE_BYTES = 4096  # what a TMPDIR probe writes: one block, enough to meet a full disk
_FULL = (errno.ENOSPC, errno.EDQUOT)


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
                f"s3.credentials_file {shown} is {owner_mode(path)}: it holds a secret key, so only the service user "
                f"may read it; run: {fix}"
            )
        ]
    if not os.access(path, os.R_OK):
        return [
            Problem(f"s3.credentials_file {shown} is {owner_mode(path)}: user {account.name} cannot read it; {fix}")
        ]
    return []


def _real_directory(
    path: str,
    *,
    missing: str,
    unreadable: Callable[[str], str],
    symlink: Callable[[str], str],
    not_directory: str,
) -> os.stat_result | Problem:
    """``path``'s lstat when it is a directory itself (not a symlink to one), else the Problem in the caller's
    words: ``unreadable`` is given the lstat error's text, ``symlink`` where the link leads (escaped)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Problem(missing)
    except OSError as e:
        return Problem(unreadable(str(e.strerror)))
    if stat.S_ISLNK(st.st_mode):
        try:
            target = printable(os.path.realpath(path))
        except OSError:
            target = "?"
        return Problem(symlink(target))
    if not stat.S_ISDIR(st.st_mode):
        return Problem(not_directory)
    return st


def queue_problems(settings: QueueSettings, account: Account) -> list[Problem]:
    """Can ``account`` (the process's own user) use the configured queue directory (or its bucket's credentials)?"""
    if settings.bucket:
        return credentials_problems(settings, account)
    path = settings.queue
    shown = printable(path)
    init = f"runuser -u {account.name} -- steadq init --shared {shown}"
    blocked = blocked_parent(path)
    if blocked is not None:
        return [
            Problem(
                f"queue {shown}: user {account.name} cannot reach it: {printable(blocked)} is not searchable "
                f"({owner_mode(blocked)}); let the user through (e.g. chmod o+x {printable(blocked)}) or move the queue"
            )
        ]
    looked = _real_directory(
        path,
        missing=f"queue {shown} does not exist; create it as the service user: {init}",
        unreadable=lambda error: f"queue {shown}: user {account.name} cannot look at it: {error}",
        symlink=lambda target: (
            f"queue {shown} is a symlink (to {target}); queues are never opened through a symlink: "
            f"set `queue:` in {printable(settings.source)} to the real directory"
        ),
        not_directory=f"queue {shown} is not a directory; set `queue:` to a queue made with: {init}",
    )
    if isinstance(looked, Problem):
        return [looked]
    for sub in ("", *STATE_DIRS):
        p = os.path.join(path, sub) if sub else path
        if sub and not os.path.isdir(p):
            continue  # not a queue at all, or an old layout: opening the queue says which
        if not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            what = f"queue {shown}" if not sub else f"queue {shown}: {sub}/"
            return [
                Problem(
                    f"{what} is {owner_mode(p)}: user {account.name} cannot read and write it (made by root with "
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
                    f"TMPDIR {printable(wanted)} is {owner_mode(wanted)}: user {account.name} cannot write payload "
                    f"copies there; run: chown {account.name} {printable(wanted)}, or point TMPDIR elsewhere"
                )
            ]
    try:
        base = wanted or payload.temp_dir()
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
        f"payload copies cannot be written in {printable(base)} ({owner_mode(base)}) by user {account.name}: "
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
            line += f"; {owner_mode(str(e.filename))}"
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
    return worker_problems(settings) + inbox_problems(settings, account) + metrics_problems(settings, account)


def metrics_problems(settings: QueueSettings, account: Account) -> list[Problem]:
    """``metrics_textfile:``'s directory as ``account`` (this process's user) will write it.

    The daemon runs without the file when it cannot write it (one warning in the
    journal), so the first sign was a dashboard with no data: here it is said before
    the start, with the same rule the writer applies (``metrics.directory_problem``).
    Nothing is created."""
    configured = settings.metrics_textfile
    if configured is None:
        return []
    directory = os.path.dirname(configured)
    target = printable(textfile_for(configured, "worker"))
    where = printable(directory)
    install = f"install -d -o {account.name} -m 0755 {where}"
    looked = _real_directory(
        directory,
        missing=f"metrics_textfile: directory {where} does not exist, so {target} cannot be written; {install}",
        unreadable=lambda error: f"metrics_textfile: user {account.name} cannot look at {where}: {error}; {install}",
        symlink=lambda real: (
            f"metrics_textfile: directory {where} is a symbolic link, which the writer never follows; name "
            f"the real directory ({real}) in metrics_textfile:"
        ),
        not_directory=f"metrics_textfile: {where} is not a directory; {install}",
    )
    if isinstance(looked, Problem):
        return [looked]
    if problem := directory_problem(directory, looked):
        return [Problem(f"{problem}; {target} would not be written")]
    if not os.access(directory, os.W_OK | os.X_OK):
        return [
            Problem(
                f"metrics_textfile: user {account.name} cannot create {target} in {where} ({owner_mode(directory)}); "
                f"chown {account.name} {where} (mode 0755)"
            )
        ]
    return []


# --- the hardened units' writable paths, as systemd reports them -------------------------------

_SYSTEMCTL_TIMEOUT_S = 5.0
_SHOW_MAX = 64 * 1024  # characters of `systemctl show` read: three properties of three units
_HOMES = ("/home", "/root", "/run/user")


@dataclass(frozen=True)
class Sandbox:
    """What a unit's file-system protection leaves writable (``systemctl show``, drop-ins included)."""

    writable: tuple[str, ...]
    protect_system: str
    protect_home: str

    def blocks(self, path: str) -> str:
        """Why the unit cannot write ``path`` ("" if it can, as far as these settings say)."""
        real = os.path.realpath(path)

        def inside(p: str) -> bool:
            return any(p == w or p.startswith(w.rstrip("/") + "/") for w in self.writable)

        if any(real == h or real.startswith(h + "/") for h in _HOMES):
            if self.protect_home in ("yes", "tmpfs"):
                return f"ProtectHome={self.protect_home} hides it from the unit"
            if self.protect_home == "read-only" and not inside(real):
                return "ProtectHome=read-only makes it read-only and no ReadWritePaths= holds it"
        if self.protect_system == "strict" and not inside(real):
            return "ProtectSystem=strict makes it read-only and no ReadWritePaths= holds it"
        return ""


def _parse_show(text: str, count: int) -> list[Sandbox] | None:
    """``count`` blocks of ``Key=value`` lines, one per unit asked about; None for anything else."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()] if text.strip() else []
    if len(blocks) != count:
        return None
    found = []
    for block in blocks:
        props: dict[str, str] = {}
        for line in block.splitlines():
            key, eq, value = line.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z]+", key):
                return None
            props[key] = value.strip()
        paths = tuple(
            os.path.normpath(p.lstrip("-+"))
            for p in props.get("ReadWritePaths", "").split()
            if p.lstrip("-+").startswith("/")
        )
        found.append(Sandbox(paths, props.get("ProtectSystem", "no"), props.get("ProtectHome", "no")))
    return found


def unit_sandboxes(units: list[str]) -> list[Sandbox] | str:
    """Each unit's sandbox as the running systemd has it, or why systemd could not be asked."""
    try:
        p = subprocess.run(
            ["systemctl", "show", "-p", "ReadWritePaths,ProtectSystem,ProtectHome", "--", *units],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_SYSTEMCTL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return "systemctl is not installed"
    except subprocess.TimeoutExpired:
        return f"systemctl did not answer within {_SYSTEMCTL_TIMEOUT_S:g}s"
    except OSError as e:
        return f"systemctl cannot be run ({e.strerror})"
    if p.returncode != 0:
        said = printable((p.stderr.strip().splitlines() or [""])[0][:200])
        return f"systemctl show failed ({said or f'exit status {p.returncode}'})"
    parsed = _parse_show(p.stdout[:_SHOW_MAX], len(units))
    return "systemctl show answered in a form not understood" if parsed is None else parsed


def unit_path_warnings(settings: QueueSettings) -> list[str]:
    """The paths the queue's units must write that their sandbox keeps read-only, each with the drop-in to add.

    Checked against systemd itself: a file system check from outside the unit
    cannot see ``ProtectSystem=strict``, so the watch folder (or metrics file)
    worked under ``steadqd run`` and failed under the unit. Without a running
    systemd this cannot be checked, and says so."""
    needs: dict[str, list[tuple[str, str]]] = {}
    inbox = settings.inbox
    if inbox is not None:
        needs["worker"] = [("watch folder (inbox.path)", inbox.path)]
        if inbox.after == "move" and inbox.move_to is not None:
            needs["worker"].append(("inbox.move_to", inbox.move_to))
    if settings.metrics_textfile is not None:
        directory = ("metrics_textfile directory", os.path.dirname(settings.metrics_textfile))
        for role in ("worker", "sweeper", "promoter"):
            needs.setdefault(role, []).append(directory)
    if not needs:
        return []
    units = [f"steadq-{role}@{settings.name}.service" for role in needs]
    answer = unit_sandboxes(units)
    if isinstance(answer, str):
        return [
            f"cannot check the units' writable paths (ProtectSystem=, ReadWritePaths=): {answer}; under systemd, "
            "`systemctl show -p ReadWritePaths steadq-worker@QUEUE.service` must hold the watch folder and the "
            "metrics directory"
        ]
    warnings = []
    for unit, sandbox, paths in zip(units, answer, needs.values(), strict=True):
        for what, path in paths:
            if why := sandbox.blocks(path):
                warnings.append(
                    f"{what} {printable(path)} cannot be written by {unit}: {why}; add a drop-in "
                    f"(systemctl edit {unit}) with [Service] ReadWritePaths={printable(path)}, then restart it"
                )
    return warnings


def inbox_problems(settings: QueueSettings, account: Account) -> list[Problem]:
    """The watch folder as ``account`` (this process's user) will use it: there, a directory, writable.

    Only what a start would meet, without making anything: the start creates the
    state directory in the folder, so the folder must let this user create an entry.
    What a hardened unit makes read-only (paths outside its ReadWritePaths=) cannot
    be seen from outside the unit; the worker then reports the folder failed and
    names ReadWritePaths=.
    """
    config = settings.inbox
    if config is None:
        return []
    from steadqd.daemon.inbox.access import cannot_write_fix
    from steadqd.daemon.inbox.intent import STATE_DIR

    where = printable(config.path)
    if not os.path.isdir(config.path):
        return [
            Problem(f"watch folder {where} does not exist or is not a directory for user {account.name} (inbox.path)")
        ]
    state = os.path.join(config.path, STATE_DIR)
    if os.path.lexists(state) or os.access(config.path, os.W_OK | os.X_OK):
        return []
    return [
        Problem(
            f"watch folder {where}: user {account.name} cannot create {printable(state)} in it; "
            f"{cannot_write_fix(config.path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))}"
        )
    ]
