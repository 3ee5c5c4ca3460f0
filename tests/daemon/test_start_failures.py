"""Issue 16, points 1 and 2: how the worker fails, and that a broken environment never burns the backlog.

Point 1: each of the usual set-up mistakes gives one line naming the thing
(and the user, owner and mode where they matter) and the fix, exit 78,
never a traceback; ``check-config --open`` finds the same as the service's
user. Point 2 (and issue 33 #9): a command that cannot be started is found
by the check before each claim, so no job is leased and no attempt is used;
the worker leases nothing until the cause is gone (it says so, and STATUS=
says so). A start that fails after a claim all the same (the payload copy)
hands the job back ready with only its claim's attempt used.

The console script cannot run as another user here (the interpreter lives
under /root), so the cases that need another user fork, import, switch to
``nobody`` and call ``daemon_main`` in-process: the same code, real
permission checks.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from steadqd import Queue
from steadqd.daemon import command_check, preflight
from steadqd.daemon.main import daemon_main
from tests.daemon.conftest import DEADLINE, Env, job_spec
from tests.invariants import check_tree

NOBODY = 65534


def _steadqd(env: Env, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": str(env.jobtmp)}
    if "PYTHONPATH" in os.environ:
        child_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    child_env.update(extra_env or {})
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "steadqd"), "--config-dir", str(env.config_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env,
    )


def _one_clean_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("<3>worker[testq]: cannot start: "), lines[0]
    return lines[0]


def _as_nobody(argv: list[str]) -> tuple[int, str, str]:
    """``steadqd ARGV`` in a forked child that switched to nobody; (exit status, stdout, stderr)."""
    # Everything the child may import lazily, imported while /root (the interpreter's home) is readable.
    import importlib.metadata  # noqa: F401

    import steadqd.daemon.worker.role  # noqa: F401

    with contextlib.suppress(Exception):  # reads the package metadata (steadqd --version): its imports too
        importlib.metadata.version("steadqd")
    r_out, w_out = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(r_out)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                sys.stderr = err  # the daemon's Log writes to sys.stderr
                code = daemon_main(argv)
            os.write(w_out, (out.getvalue() + "\0" + err.getvalue()).encode())
        finally:
            os._exit(code)
    os.close(w_out)
    with os.fdopen(r_out, "rb") as f:
        raw = f.read().decode()
    _, status = os.waitpid(pid, 0)
    stdout, _, stderr = raw.partition("\0")
    return os.waitstatus_to_exitcode(status), stdout, stderr


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A tmp directory every user can walk through (nobody must reach the config and the queue)."""
    if os.geteuid() != 0:
        pytest.fail("needs root to run the daemon as another user")
    parent = str(tmp_path)
    while parent != "/":
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)
    os.chmod(tmp_path, 0o755)
    return tmp_path


def _config(world: Path, queue: Path, command: list[str]) -> Path:
    cfg = world / "cfg"
    cfg.mkdir(mode=0o755, exist_ok=True)
    (cfg / "t.yaml").write_text(yaml.safe_dump({"queue": str(queue), "worker": {"command": command}}))
    os.chmod(cfg / "t.yaml", 0o644)
    return cfg


# --- point 1: one line, exit 78, the fix ------------------------------------------------------


def test_a_queue_made_by_root_names_owner_mode_user_and_the_fix(world: Path) -> None:
    queue = world / "q"
    Queue.init(str(queue), shards=2).close()  # root, no runuser: 0700 root:root
    cfg = _config(world, queue, ["/bin/true"])
    code, _, err = _as_nobody(["--config-dir", str(cfg), "worker", "t"])
    assert code == 78, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"cannot start: queue {queue} is owner root:root, mode 0700: user nobody cannot read and write it" in err
    assert f"chown -R nobody: {queue}" in err and f"runuser -u nobody -- steadq init --shared {queue}" in err
    # issue 33 #1: for a queue several users produce into, the shared queue is the first fix offered
    assert err.index("init --shared") < err.index("chown -R"), err


def test_check_config_open_checks_as_the_service_user_and_says_so(world: Path) -> None:
    queue = world / "q"
    Queue.init(str(queue), shards=2).close()
    cfg = _config(world, queue, ["/bin/true"])
    # As root, for the service's user: the same finding as the service's start.
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = daemon_main(["--config-dir", str(cfg), "check-config", "--open", "--user", "nobody", "t"])
    assert code == 78, err.getvalue()
    assert "user nobody cannot read and write it" in err.getvalue()
    assert "t: checked as user nobody" in err.getvalue()
    # Handed over: the same check passes, and says as whom.
    for p in [queue, *queue.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = daemon_main(["--config-dir", str(cfg), "check-config", "--open", "--user", "nobody", "t"])
    assert code == 0, err.getvalue()
    assert out.getvalue().strip() == f"t: ok ({queue}; checked as user nobody)"


def test_check_config_open_finds_a_command_the_service_user_cannot_execute(world: Path) -> None:
    queue = world / "q"
    Queue.init(str(queue), shards=2).close()
    for p in [queue, *queue.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    script = world / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o744)  # root may run it, nobody may not
    cfg = _config(world, queue, [str(script)])
    code, _, err = _as_nobody(["--config-dir", str(cfg), "check-config", "--open", "t"])
    assert code == 78, err
    assert f"worker.command {script} is not executable by user nobody: it is owner root:root, mode 0744" in err
    assert f"chmod a+rx {script}" in err and "checked as user nobody" in err


@pytest.mark.parametrize("case", ["missing command", "not executable", "not in PATH", "working_directory", "user"])
def test_a_worker_that_could_not_run_a_job_refuses_to_start_and_leases_nothing(denv: Env, case: str) -> None:
    script = denv.tmp / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    worker: dict[str, object] = {
        "missing command": {"command": ["/usr/local/bin/nope"]},
        "not executable": {"command": [str(script)]},
        "not in PATH": {"command": ["steadq-no-such-program"]},
        "working_directory": {"working_directory": str(denv.tmp / "gone")},
        "user": {"user": "steadq-no-such-user"},
    }[case]
    denv.write_config(**worker)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(exit=0))
    line = _one_clean_line(_steadqd(denv, "worker", denv.name))
    expected = {
        "missing command": "worker.command /usr/local/bin/nope does not exist; install it, or fix `worker.command`",
        "not executable": f"worker.command {script} is not executable by user root",
        "not in PATH": "worker.command 'steadq-no-such-program' is not found in the job's PATH",
        "working_directory": f"worker.working_directory {denv.tmp / 'gone'} does not exist",
        "user": "worker.user 'steadq-no-such-user' does not exist on this machine",
    }[case]
    assert expected in line, line
    tree = check_tree(denv.queue_path)
    assert tree.ready == {job} and tree.get(job).attempt == 0  # never leased


def test_an_unwritable_tmpdir_refuses_the_start(denv: Env) -> None:
    denv.write_config()
    missing = denv.tmp / "no-tmp"
    line = _one_clean_line(_steadqd(denv, "worker", denv.name, extra_env={"TMPDIR": str(missing)}))
    assert f"TMPDIR {missing} does not exist; create it or unset TMPDIR" in line, line


def test_a_symlinked_queue_names_the_real_directory(denv: Env) -> None:
    link = denv.tmp / "link"
    link.symlink_to(denv.queue_path)
    denv.write_config(queue=str(link))
    line = _one_clean_line(_steadqd(denv, "worker", denv.name))
    assert f"queue {link} is a symlink (to {os.path.realpath(denv.queue_path)})" in line, line


def test_a_missing_queue_says_how_to_make_it(denv: Env) -> None:
    missing = denv.tmp / "nowhere"
    denv.write_config(queue=str(missing))
    line = _one_clean_line(_steadqd(denv, "worker", denv.name))
    assert f"queue {missing} does not exist; create it as the service user: runuser -u root -- " in line, line


# --- point 2: a broken environment never burns the backlog -------------------------------------


def test_a_command_that_vanishes_while_the_worker_runs_costs_no_attempt_and_leasing_resumes(denv: Env, daemons) -> None:
    """Issue 33 #9: the command is checked before each claim, so a vanished one leases nothing at all."""
    script = denv.tmp / "bin" / "job"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n" + denv.script.read_text())
    os.chmod(script, 0o755)
    denv.write_config(command=[str(script), str(denv.results)])
    d = daemons(denv)
    d.ready()
    hidden = script.with_name("job.away")
    os.rename(script, hidden)  # uninstalled while the worker runs
    with Queue.open(denv.queue_path) as q:
        jobs = [q.enqueue(job_spec(exit=0)) for _ in range(3)]
    d.wait_log(rf"not leasing jobs: worker.command {script} does not exist; install it")
    tree = check_tree(denv.queue_path)
    assert tree.ready == set(jobs)
    attempts = sorted(tree.get(j).attempt for j in jobs)
    assert attempts == [0, 0, 0], attempts  # no attempt burnt: nothing was claimed
    assert "not started" not in d.log() and "handed back" not in d.log(), d.log()
    os.rename(hidden, script)
    d.wait_log(r"leasing jobs again: the checks pass")
    for j in jobs:  # each runs as its first attempt
        denv.result(j, 1)


def test_a_script_whose_interpreter_vanishes_costs_no_attempt(denv: Env, daemons) -> None:
    """The script stays; the interpreter on its #! line goes: the check before a claim reads that line too."""
    interp = denv.tmp / "bin" / "python"
    interp.parent.mkdir()
    interp.symlink_to(sys.executable)
    script = denv.tmp / "job"
    script.write_text(f"#!{interp}\n" + denv.script.read_text())
    os.chmod(script, 0o755)
    denv.write_config(command=[str(script), str(denv.results)])
    d = daemons(denv)
    d.ready()
    interp.unlink()
    # The hold comes from the first claim pass asked for after the unlink; a pass asked for before it (the
    # start's) may still be running, and would claim a job enqueued now (its check passed: the window the
    # class LaunchCheck names). So the job comes once the worker holds, which no pass in flight outlives.
    with Queue.open(denv.queue_path) as q:
        q.pause("news for the worker")
        q.resume()  # the pause record's removal is ready-watch news: a claim pass is asked for
    d.wait_log(rf"not leasing jobs: worker.command {script} is a script for {interp}, which does not exist")
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(exit=0))
    tree = check_tree(denv.queue_path)
    assert tree.ready == {job} and tree.get(job).attempt == 0
    assert "not started" not in d.log(), d.log()
    interp.symlink_to(sys.executable)
    d.wait_log(r"leasing jobs again: the checks pass")
    denv.result(job, 1)


def test_a_full_tmpdir_holds_the_worker_without_leasing_and_it_resumes(denv: Env, daemons, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=64", "tmpfs", str(mnt)], check=True)
    try:
        filler = mnt / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
        denv.write_config()
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(exit=0))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(tmp_path / "notify.sock"))
        sock.settimeout(DEADLINE)
        d = daemons(denv, extra_env={"TMPDIR": str(mnt), "NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
        with sock:
            ready = sock.recv(4096).decode().split("\n")  # READY=1 with the first STATUS=
        assert "READY=1" in ready, ready
        assert any(x.startswith("STATUS=worker: 0 running") and "not leasing: payload copies" in x for x in ready)
        d.wait_log(r"not leasing jobs: payload copies cannot be written in .*No space left on device")
        tree = check_tree(denv.queue_path)
        assert tree.ready == {job} and tree.get(job).attempt == 0
        filler.unlink()
        d.wait_log(r"leasing jobs again", timeout=30)
        denv.result(job, 1)
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def test_a_payload_copy_that_fails_on_a_full_disk_hands_the_job_back_and_holds(
    denv: Env, daemons, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=64", "tmpfs", str(mnt)], check=True)
    try:
        denv.write_config()
        d = daemons(denv, extra_env={"TMPDIR": str(mnt)})
        d.ready()  # room at start: the checks pass
        filler = mnt / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(job_spec(exit=0, pad="x" * 20000))
        d.wait_log(rf"job {job[:8]} not started: cannot prepare the job")
        d.wait_log(r"not leasing jobs: cannot prepare the job")
        d.wait_log(rf"job {job[:8]} handed back: ready \(attempt 1/3\)")
        tree = check_tree(denv.queue_path)
        assert tree.ready == {job} and tree.get(job).attempt == 1  # only its claim's attempt
        filler.unlink()
        d.wait_log(r"leasing jobs again", timeout=30)
        denv.result(job, 2)
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def test_preflight_problems_are_one_line_each() -> None:
    """No check may produce a multi-line message: the journal line must stay one line."""
    settings_text = "queue: /nonexistent/q\nworker:\n  command: ['/nonexistent/\\n/x']\n"
    from steadqd.daemon.config import parse_config

    settings = parse_config(settings_text, path="t.yaml", name="t")
    problems = preflight.queue_problems(settings, preflight.Account.current()) + preflight.worker_problems(settings)
    assert problems
    assert all("\n" not in p.text for p in problems), problems


def test_check_config_without_open_warns_about_a_command_that_does_not_exist(denv: Env) -> None:
    missing = denv.tmp / "bin" / "no-such-job"
    denv.write_config(command=[str(missing)])
    r = _steadqd(denv, "check-config", denv.name)
    assert r.returncode == 0, r.stderr  # a warning: the service's user is not asked without --open
    assert r.stdout == f"{denv.name}: ok ({denv.queue_path})\n"
    assert r.stderr.startswith(f"{denv.name}: warning: worker.command {missing} does not exist; install it"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


def test_check_config_open_checks_the_watch_folder_as_the_service_user(world: Path) -> None:
    """Issue 33 #2: `check-config --open` said ok for a watch folder the service user could not write."""
    queue = world / "q"
    Queue.init(str(queue), shards=2).close()
    for p in [queue, *queue.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    folder = world / "drop"
    folder.mkdir(mode=0o755)  # root's: nobody may read it, not write it
    cfg = _config(world, queue, ["/bin/true"])
    doc = yaml.safe_load((cfg / "t.yaml").read_text())
    doc["inbox"] = {"path": str(folder)}
    (cfg / "t.yaml").write_text(yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = daemon_main(["--config-dir", str(cfg), "check-config", "--open", "--user", "nobody", "t"])
    assert code == 78, err.getvalue()
    assert f"watch folder {folder}: user nobody cannot create {folder}/.steadq-inbox in it" in err.getvalue()
    assert f"chmod g+w,+t {folder}" in err.getvalue()
    assert not (folder / ".steadq-inbox").exists()  # a check creates nothing
    os.chown(folder, 0, NOBODY)
    os.chmod(folder, 0o3770)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = daemon_main(["--config-dir", str(cfg), "check-config", "--open", "--user", "nobody", "t"])
    assert code == 0, err.getvalue()


def _check_open(cfg: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = daemon_main(["--config-dir", str(cfg), "check-config", "--open", "--user", "nobody", "t"])
    return code, err.getvalue()


def _stand_in_systemctl(where: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A stand-in ``systemctl`` first on PATH (as tests/cli/test_status.py does); it logs its arguments."""
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/calls\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "calls"


def _hardened(writable: str) -> str:
    """What systemd answers for each unit asked about: the shipped units' sandbox, with ``writable``."""
    return (
        'shift 4\nfor u in "$@"; do\n'
        f"  printf 'ReadWritePaths=-/var/lib/steadq {writable} -/run/steadq/roles\\nProtectSystem=strict\\n"
        "ProtectHome=yes\\n\\n'\ndone"
    )


def _metrics_config(world: Path, directory: Path) -> Path:
    queue = world / "q"
    Queue.init(str(queue), shards=2).close()
    for p in [queue, *queue.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    cfg = _config(world, queue, ["/bin/true"])
    doc = yaml.safe_load((cfg / "t.yaml").read_text())
    doc["metrics_textfile"] = str(directory / "steadq-t.prom")
    (cfg / "t.yaml").write_text(yaml.safe_dump(doc))
    return cfg


def test_check_config_open_checks_the_metrics_directory_as_the_service_user(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 #2: the daemon ran without its metrics file (one journal warning); --open said ok."""
    _stand_in_systemctl(world, monkeypatch, _hardened(str(world)))
    metrics = world / "metrics"
    cfg = _metrics_config(world, metrics)
    code, err = _check_open(cfg)
    assert code == 78 and f"directory {metrics} does not exist" in err, err
    assert f"install -d -o nobody -m 0755 {metrics}" in err, err
    metrics.mkdir(mode=0o755)  # root's 0755: the rule allows it, but nobody cannot create the file
    code, err = _check_open(cfg)
    assert code == 78, err
    assert f"user nobody cannot create {metrics}/steadq-t.worker.prom in {metrics}" in err, err
    assert f"chown nobody {metrics}" in err, err
    os.chown(metrics, 0, NOBODY)
    os.chmod(metrics, 0o775)  # the group may write: a member could plant a link (metrics.directory_problem)
    code, err = _check_open(cfg)
    assert code == 78 and f"chmod go-w {metrics}" in err, err
    os.chown(metrics, NOBODY, NOBODY)
    os.chmod(metrics, 0o755)
    code, err = _check_open(cfg)
    assert code == 0, err
    assert not list(metrics.iterdir())  # a check creates nothing


def test_check_config_open_asks_systemd_whether_the_units_may_write_the_folder_and_the_metrics(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 #2: ProtectSystem=strict cannot be seen from outside the unit; systemd is asked, drop-ins included."""
    metrics = world / "metrics"
    metrics.mkdir(mode=0o755)
    os.chown(metrics, NOBODY, NOBODY)
    folder = world / "drop"
    folder.mkdir()
    os.chown(folder, 0, NOBODY)
    os.chmod(folder, 0o3770)
    cfg = _metrics_config(world, metrics)
    doc = yaml.safe_load((cfg / "t.yaml").read_text())
    doc["inbox"] = {"path": str(folder)}
    (cfg / "t.yaml").write_text(yaml.safe_dump(doc))

    calls = _stand_in_systemctl(world, monkeypatch, _hardened("/srv/elsewhere"))
    code, err = _check_open(cfg)
    assert code == 0, err  # warnings: the folder and the metrics are extras, the queue's jobs run
    assert calls.read_text().split() == [
        "show",
        "-p",
        "ReadWritePaths,ProtectSystem,ProtectHome",
        "--",
        "steadq-worker@t.service",
        "steadq-sweeper@t.service",
        "steadq-promoter@t.service",
    ]
    lines = [line for line in err.splitlines() if "warning:" in line]
    assert len(lines) == 4, err  # the folder (worker), the metrics directory (each unit)
    assert lines[0] == (
        f"t: warning: watch folder (inbox.path) {folder} cannot be written by steadq-worker@t.service: "
        "ProtectSystem=strict makes it read-only and no ReadWritePaths= holds it; add a drop-in "
        f"(systemctl edit steadq-worker@t.service) with [Service] ReadWritePaths={folder}, then restart it"
    )
    assert all(f"metrics_textfile directory {metrics} cannot be written by" in line for line in lines[1:]), err

    _stand_in_systemctl(world, monkeypatch, _hardened(str(world)))  # a drop-in names a parent: all writable
    code, err = _check_open(cfg)
    assert code == 0 and "warning" not in err, err

    _stand_in_systemctl(world, monkeypatch, _hardened(str(folder)) + "\necho 'ProtectSystem=strict'")
    code, err = _check_open(cfg)  # an answer not understood is not taken for one
    assert "t: warning: cannot check the units' writable paths" in err and "not understood" in err, err

    _stand_in_systemctl(
        world, monkeypatch, 'echo "System has not been booted with systemd as init system (PID 1)." >&2; exit 1'
    )
    code, err = _check_open(cfg)
    assert code == 0, err
    assert (
        "t: warning: cannot check the units' writable paths (ProtectSystem=, ReadWritePaths=): systemctl show "
        "failed (System has not been booted with systemd as init system (PID 1).)"
    ) in err, err


def test_the_check_before_a_claim_finds_only_what_surely_fails(tmp_path: Path) -> None:
    """The daemon's own user asks access(); for worker.user, a file with no execute bit at all is
    executable by no one, and one with some bit is left to the full check (no false hold)."""
    from steadqd.daemon.config import parse_config

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")

    def startable(**worker: object) -> bool:
        text = yaml.safe_dump({"queue": str(tmp_path / "q"), "worker": {"command": [str(script)], **worker}})
        cfg = parse_config(text, path="t.yaml", name="t").worker
        assert cfg is not None
        return preflight.LaunchCheck().looks_startable(cfg)

    os.chmod(script, 0o644)
    assert not startable() and not startable(user="nobody")
    os.chmod(script, 0o700)  # its owner (we) may, nobody may not: only the full check (as nobody) can tell
    assert startable() and startable(user="nobody")
    os.chmod(script, 0o755)
    assert startable() and startable(user="nobody")
    assert not startable(working_directory=str(tmp_path / "gone"))
    script.write_text(f"#!{tmp_path / 'no-such-sh'}\nexit 0\n")
    assert not startable() and not startable(user="nobody")
    script.unlink()
    assert not startable() and not startable(user="nobody")
    os.mkfifo(script)  # never opened for reading without O_NONBLOCK: the worker's loop would block
    assert not startable() and not startable(user="nobody")
    assert command_check._script_interpreter(str(script)) is None
