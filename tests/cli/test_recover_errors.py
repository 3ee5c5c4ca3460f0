"""``steadq recover`` names each recovery error and honours --json (issue 15, item 13).

It used to print only "1 recovery errors": an operator had to guess what failed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from steadqd import Queue
from tests.cli.helpers import steadq


def _corrupt_receipt(queue: Queue, queue_path: str) -> str:
    queue.enqueue(b"will be corrupted")
    lease = queue.lease()
    assert lease is not None
    queue.ack(lease)
    (rel,) = [
        os.path.relpath(os.path.join(d, f), queue_path)
        for d, _, fs in os.walk(os.path.join(queue_path, "receipts"))
        for f in fs
    ]
    path = Path(queue_path, rel)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a payload byte: compaction must refuse the receipt
    path.write_bytes(bytes(data))
    return rel


def test_recover_lists_each_error(queue: Queue, queue_path: str) -> None:
    _corrupt_receipt(queue, queue_path)
    res = steadq("recover", queue_path)
    assert res.code == 6, res
    i = res.err_lines.index("1 recovery errors")  # the reference's count line, kept
    assert res.err_lines[i + 1].startswith("  receipt_compact_invalid: "), res.err


def test_recover_json_reports_the_pass(queue: Queue, queue_path: str) -> None:
    _corrupt_receipt(queue, queue_path)
    res = steadq("--json", "recover", queue_path)
    assert res.code == 6, res
    doc = json.loads(res.out)
    assert doc["receipts_compacted"] == 0
    assert [e["code"] for e in doc["errors"]] == ["receipt_compact_invalid"]
    assert doc["budget_exhausted"] is False


def test_a_clean_pass_prints_no_error_lines(queue: Queue, queue_path: str) -> None:
    res = steadq("recover", queue_path, "--json")
    assert res.code == 0, res
    assert json.loads(res.out)["errors"] == []
    assert not any("recovery errors" in line for line in res.err_lines)
