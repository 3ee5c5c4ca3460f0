"""Time arithmetic that could overflow is checked (clocks.md), as the reference does (issue 15, item 10).

`steadq put --not-before 18446744073709551615` used to write a delayed job whose
eligibility instant (bucket × width) does not fit u64: a job that could never
become due. The reference refuses it as invalid input; so do we, before anything
is written.
"""

from __future__ import annotations

import os

import pytest

from steadqd import ErrorKind, NotCommitted, Queue
from steadqd.constants import U64_MAX
from tests.cli.helpers import steadq
from tests.invariants import check_tree


def _files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "delayed")) for f in fs]


@pytest.mark.parametrize("not_before", [U64_MAX, U64_MAX - 1, U64_MAX // 10_000_000_000 * 10_000_000_000 + 1])
def test_enqueue_refuses_a_not_before_whose_bucket_overflows(queue: Queue, queue_path: str, not_before: int) -> None:
    with pytest.raises(NotCommitted) as info:
        queue.enqueue(b"x", not_before_ns=not_before)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert "not_before" in str(info.value)
    assert queue.poisoned is None
    assert _files(queue_path) == []
    check_tree(queue_path, allow_quarantine=False)


def test_the_latest_not_before_that_fits_is_accepted(queue: Queue, queue_path: str) -> None:
    width = queue.format.delayed_width_ns
    last = U64_MAX // width * width  # its bucket starts exactly there: the last instant that fits
    queue.enqueue(b"x", not_before_ns=last)
    assert len(_files(queue_path)) == 1


def test_steadq_put_refuses_it_with_the_invalid_input_status(queue: Queue, queue_path: str) -> None:
    res = steadq("put", queue_path, "--not-before", str(U64_MAX), stdin=b"x")
    assert res.code == ErrorKind.INVALID_INPUT.exit_code, res
    assert "not_before" in res.err
    assert _files(queue_path) == []
