"""The kill test of the watch folders: SIGKILL at random points while files arrive, then count.

A producer thread drops files into the folder (written in place, or written
under a hidden name and renamed in) while `steadqd inbox` is started and
SIGKILLed again and again, at random moments: during its start, while it
resolves what the last one left, in the middle of taking a file. A last run
is then left to finish. Afterwards every file must be exactly one job: none
lost, none twice, and nothing left half done in the folder's state directory.
The seed is printed so a failure can be replayed (STEADQ_INBOX_KILL_SEED).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon, Env, wait_for
from tests.daemon.test_inbox import jobs, write_config

FILES = 150
ROUNDS = 25


def produce(inbox: Path, staging: Path, rng: random.Random, stop: threading.Event) -> None:
    for i in range(FILES):
        if stop.is_set():
            return
        body = b"file-%05d" % i
        if i % 2:
            (inbox / f"f{i:05}.dat").write_bytes(body)
        else:
            tmp = staging / f"f{i:05}.dat"
            tmp.write_bytes(body)
            os.rename(tmp, inbox / tmp.name)
        time.sleep(rng.uniform(0.0, 0.03))


def settled(inbox: Path, done: Path, after: str) -> bool:
    try:
        state = os.listdir(inbox / ".steadq-inbox")
    except FileNotFoundError:  # a loaded machine: no run got as far as making it yet
        return False
    if any(not n.endswith(".kept") for n in state):
        return False
    if after == "keep":
        return len(state) == FILES
    if after == "move":
        return len(os.listdir(done)) == FILES
    return os.listdir(inbox) == [".steadq-inbox"]


@pytest.mark.parametrize(("after", "payload"), [("delete", "content"), ("move", "path"), ("keep", "content")])
def test_every_file_is_exactly_one_job_across_sigkills(denv: Env, tmp_path: Path, after: str, payload: str) -> None:
    seed = int(os.environ.get("STEADQ_INBOX_KILL_SEED", random.randrange(1 << 32)))
    print(f"inbox kill seed {seed}: replay with STEADQ_INBOX_KILL_SEED={seed}")
    rng = random.Random(seed)
    inbox, done, staging = tmp_path / "inbox", tmp_path / "done", tmp_path / "staging"
    for d in (inbox, done, staging):
        d.mkdir()
    config = {"path": str(inbox), "settle": "0.05s", "payload": payload, "after": after}
    if after == "move":
        config["move_to"] = str(done)
    write_config(denv, config)
    stop = threading.Event()
    producer = threading.Thread(target=produce, args=(inbox, staging, rng, stop))
    producer.start()
    try:
        for _ in range(ROUNDS):
            d = Daemon(denv, "inbox")
            time.sleep(rng.uniform(0.05, 1.0))
            d.proc.kill()
            d.proc.wait()
            d.stop()
        producer.join()
        d = Daemon(denv, "inbox")
        try:
            wait_for(lambda: settled(inbox, done, after), 120, "the last run to take every file")
        finally:
            d.stop()
    finally:
        stop.set()
        producer.join()
    found = jobs(denv.queue_path)
    if payload == "path":
        bodies = sorted(Path(os.fsdecode(p)).read_bytes() for _, p, _ in found)
    else:
        bodies = sorted(p for _, p, _ in found)
    assert bodies == [b"file-%05d" % i for i in range(FILES)], f"seed {seed}"
    assert len({j for j, _, _ in found}) == FILES
