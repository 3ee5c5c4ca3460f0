"""Issue 16, point 5: what a stop says, under a service manager and on a terminal.

The drain line says how many jobs it waits for and how to stop waiting; a
forced stop says, per job, what happened to it; ``steadqd run`` on a
terminal timestamps its lines and says "Ctrl-C".
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time

from steadqd import Queue
from tests.daemon.conftest import STEADQD, Env, job_spec


def test_a_drain_counts_the_running_jobs_and_a_forced_stop_says_what_became_of_each(denv: Env, daemons) -> None:
    denv.write_config(concurrency=2, kill_grace="1s")
    d = daemons(denv)
    d.ready()
    with Queue.open(denv.queue_path) as q:
        jobs = [q.enqueue(job_spec(sleep=60, ignore_term=False)) for _ in range(2)]
    for j in jobs:
        denv.started(j, 1)
    d.signal(signal.SIGTERM)
    d.wait_log(r"^<5>worker\[testq\]: stopping: draining 2 running jobs \(a second SIGTERM to hand them back now\)$")
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    for j in jobs:
        d.wait_log(
            rf"job handed back on stop: ready \(its attempt is counted\) after a forced stop: job {j[:8]} was "
            rf"killed by SIGTERM, attempt 1/3 .*STEADQ_JOB_ID={j}"
        )
    assert re.search(r"^<5>worker\[testq\]: stopped STEADQ_FORCED=true$", d.log(), re.M), d.log()


def test_steadqd_run_on_a_terminal_timestamps_its_lines_and_says_ctrl_c(denv: Env) -> None:
    denv.write_config()
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(sleep=60))
    master, slave = os.openpty()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TMPDIR": str(denv.jobtmp)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.Popen(
        [STEADQD, "--config-dir", str(denv.config_dir), "run", denv.name],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(slave)
    output = b""

    def pump_until(pattern: bytes, timeout: float = 30.0) -> None:
        nonlocal output
        end = time.monotonic() + timeout
        while pattern not in output:
            assert time.monotonic() < end, output[-800:]
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 65536)
                except OSError:
                    return

    try:
        denv.started(job, 1)
        proc.send_signal(signal.SIGINT)
        pump_until(b"(Ctrl-C again to hand them back now)")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        pump_until(b"stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = output.decode(errors="replace")
    assert "stopping: draining 1 running job (Ctrl-C again to hand them back now)" in text, text
    lines = [line for line in text.splitlines() if "run[testq]:" in line]
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} <\d>run\[testq\]: ", x) for x in lines), lines
