"""Can the job's command start? The checks of the command, its ``#!`` interpreter and its working directory,
as the job's user (:func:`command_problems`), and the cheap look before each claim (:class:`LaunchCheck`).

Apart from the other preflight checks (the queue, TMPDIR, the folders, the metrics file, the units)
because a worker runs these again and again while it serves, not only at its start.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping

from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.problem import Account, Problem, blocked_parent, owner_mode
from steadqd.text import printable

__all__ = ["LaunchCheck", "command_problems"]


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
                    f"worker.working_directory {printable(wd)} is {owner_mode(wd)}: user {account.name} cannot enter "
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
        blocked = blocked_parent(full)
        if blocked is not None:
            why = f"{printable(blocked)} is not searchable ({owner_mode(blocked)})"
        else:
            why = f"it is {owner_mode(full)}"
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
                f"{head} is not executable by user {account.name}: it is {owner_mode(interp)}; "
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
