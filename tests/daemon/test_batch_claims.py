"""Claiming a proven command's free slots together (issue 20, point 3).

Once the worker's command has been seen to start, one request to the
preparing thread claims up to the free slots' jobs inside one ``q.batch()``:
the claims share their directory barrier, none is handed to the loop before
it is done, and a failed barrier starts none of them. An unproven command
(at start, after a reload, after a start failure) is still claimed one job at
a time, so a command that never starts costs one job one attempt.
"""

from __future__ import annotations

import errno
import io
import select
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from steadqd import Queue
from steadqd.daemon.config import QueueSettings, parse_config
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import claim, payload
from steadqd.daemon.worker.role import WorkerRole
from steadqd.errors import OutcomeUnknown
from steadqd.fs import linux

from .conftest import DEADLINE, worker_in_process


def _settings(queue_path: str, concurrency: int = 4) -> QueueSettings:
    return parse_config(
        f"queue: {queue_path}\nworker:\n  command: ['true']\n  concurrency: {concurrency}\n", path="t.yaml", name="t"
    )


def _answer(prep: claim.Preparer) -> list[claim.Prepared]:
    """The whole answer to the one request in flight, as the loop collects it."""
    ready, _, _ = select.select([prep.fileno()], [], [], DEADLINE)
    assert ready, "the preparing thread never answered"
    return prep.collect()


@pytest.fixture
def preparer(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[claim.Preparer]:
    make_queue(shards=1).close()
    prep = claim.Preparer(Queue.open(queue_path), lambda: Queue.open(queue_path))
    try:
        yield prep
    finally:
        for done in prep.close(DEADLINE):
            payload.remove(done.tmpdir)


def _claims(prep: claim.Preparer, settings: QueueSettings, count: int) -> tuple[list[Any], int]:
    assert settings.worker is not None
    with linux.trace() as events:
        prep.submit(settings.worker, settings, {}, count)
        done = _answer(prep)
    return done, sum(1 for e in events if e.op == "fsync")


def test_one_request_claims_up_to_its_count_under_one_barrier(queue_path: str, preparer: claim.Preparer) -> None:
    with Queue.open(queue_path) as q:
        for i in range(6):
            q.enqueue(b"job %d" % i)
    settings = _settings(queue_path)
    (first,), one = _claims(preparer, settings, 1)  # the first claim also makes the leases bucket
    (single,), one = _claims(preparer, settings, 1)
    together, three = _claims(preparer, settings, 3)
    assert [p.error for p in together] == [None, None, None]
    leases = [first.lease, single.lease, *(p.lease for p in together)]
    assert all(lease is not None for lease in leases)
    assert len({lease.job_id for lease in leases if lease is not None}) == 5
    for p in together:  # each one's payload copy is written, as for a single claim
        assert p.payload_path and open(p.payload_path, "rb").read().startswith(b"job ")
    assert three == one, "three claims in one batch share the single claim's barriers"
    for p in [first, single, *together]:
        payload.remove(p.tmpdir)


def test_a_request_for_more_than_is_ready_ends_with_the_empty_answer(queue_path: str, preparer: claim.Preparer) -> None:
    with Queue.open(queue_path) as q:
        for i in range(2):
            q.enqueue(b"job %d" % i)
    done, _ = _claims(preparer, _settings(queue_path), 4)
    assert [p.lease is not None for p in done] == [True, True, False]
    assert done[-1].error is None and done[-1].lease_error is None
    for p in done:
        payload.remove(p.tmpdir)


def test_a_failed_shared_barrier_hands_over_no_claim_to_start(queue_path: str, preparer: claim.Preparer) -> None:
    with Queue.open(queue_path) as q:
        for i in range(4):
            q.enqueue(b"job %d" % i)
    settings = _settings(queue_path)
    _claims(preparer, settings, 1)  # the leases bucket exists: the batch's barrier is the ready shard's
    with linux.inject(op="fsync", nth=1, errno=errno.EIO) as fault:
        done, _ = _claims(preparer, settings, 3)
    assert fault.fired
    claimed = [p for p in done if p.lease is not None]
    assert len(claimed) == 3
    for p in claimed:  # whether each claim is durable is unknown: none may run its command
        assert isinstance(p.error, OutcomeUnknown), p
        assert not p.tmpdir and not p.payload_path
    assert done[-1].poisoned is not None


# --- the worker asks for its free slots once the command is proven ---------------------------


@pytest.fixture
def role(make_queue: Callable[..., Queue], queue_path: str) -> Iterator[tuple[WorkerRole, Loop, io.StringIO]]:
    with worker_in_process(make_queue(shards=1), queue_path, jobs=8, concurrency=3, lease=True) as role:
        yield role


def test_requests_ask_for_one_job_until_a_start_is_seen_then_for_the_free_slots(
    role: tuple[WorkerRole, Loop, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, lp, out = role
    assert worker._prep is not None
    asked: list[int] = []
    real = worker._prep.submit

    def submit(cfg: Any, settings: Any, credentials: Any, count: int = 1) -> None:
        asked.append(count)
        real(cfg, settings, credentials, count)

    monkeypatch.setattr(worker._prep, "submit", submit)
    deadline = time.monotonic() + DEADLINE
    while worker.tally.done < 8:
        assert time.monotonic() < deadline, out.getvalue()
        lp.run_once(0.05)
    assert asked[0] == 1, asked  # unproven: one job, one attempt at stake
    assert max(asked) > 1, asked  # proven: the free slots together
    assert all(n <= 3 for n in asked), asked  # never more than the concurrency
