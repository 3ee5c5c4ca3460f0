"""The guard knows a job's group before its command can run (CI: a grandchild outlived a SIGKILLed worker).

The worker used to tell the guard ``+PGID`` only after the spawn returned,
that is after the command's exec. Under load the worker's thread can wait
for the CPU there while the command runs, forks a grandchild and reports
itself started; a worker SIGKILLed in that window left a group the guard
never heard of, and the grandchild (no parent-death signal) lived on.

Reproduced deterministically: a worker process whose spawn stalls right
after it returned (as a thread waiting for the GIL would), and a command
that forks a grandchild and then SIGKILLs the worker itself. The guard must
have been told by the spawn, so it kills the grandchild.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.daemon.worker.run import fastspawn

from .conftest import DEADLINE, wait_for

_WORKER = r"""
import os, sys, time
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.worker.run import child, exec_helper, fastspawn

def stalled(real):
    def spawn(*args, **kwargs):
        result = real(*args, **kwargs)
        time.sleep(600)  # the loop thread stalls after the exec: the command SIGKILLs this worker meanwhile
        return result
    return spawn

fastspawn.spawn = stalled(fastspawn.spawn)
exec_helper.start = stalled(exec_helper.start)
command = 'sleep 1000 & echo $! > %s.tmp && mv %s.tmp %s; kill -9 $PPID; wait' % ((sys.argv[1],) * 3)
cfg = WorkerConfig(command=(command,), shell=True)
env = {"PATH": os.environ["PATH"], "STEADQ_JOB_ID": sys.argv[2], "STEADQ_QUEUE": "window"}
child.launch(cfg, env, os.devnull, {})
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("spawn_path", ["compiled", "popen"])
@pytest.mark.parametrize("job_id", ["0123456789abcdef0123456789abcdef", ""])
def test_a_worker_killed_right_after_the_exec_leaves_no_grandchild(tmp_path: Path, spawn_path: str, job_id: str) -> None:
    """With and without a job id: the group kill alone must do it (the env scan needs the id)."""
    env = dict(os.environ)
    if spawn_path == "popen":
        env[fastspawn.SWITCH] = "popen"
    else:
        env.pop(fastspawn.SWITCH, None)
        assert fastspawn.available(), fastspawn.path()
    marker = tmp_path / "grandchild"
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, str(marker), job_id], env=env)
    grandchild = 0
    try:
        assert worker.wait(timeout=DEADLINE) == -9  # killed by its own command, stalled before the spawn returned
        grandchild = int(marker.read_text())
        wait_for(lambda: not _alive(grandchild), 5.0, "the guard to kill the job's grandchild")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if grandchild and _alive(grandchild):
            os.kill(grandchild, 9)
