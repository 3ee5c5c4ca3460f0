"""A handle file or ticket the user names may be a FIFO (issue 15 point 1): the
command says so and exits, instead of blocking in open() until a writer comes."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from steadqd import Queue
from tests.security.test_special_files import run_cli


@pytest.mark.parametrize(
    "argv",
    [
        ("ack", "{q}", "--handle-file", "{f}"),
        ("retry", "{q}", "--handle-file", "{f}"),
        ("bury", "{q}", "--handle-file", "{f}"),
        ("resolve", "{q}", "--result-file", "{f}"),
    ],
)
def test_a_fifo_for_a_handle_or_ticket_is_refused_not_waited_on(
    tmp_path: Path, queue: Queue, queue_path: str, argv: tuple[str, ...]
) -> None:
    fifo = tmp_path / "handle.json"
    os.mkfifo(fifo)
    r: subprocess.CompletedProcess[str] = run_cli(*(a.format(q=queue_path, f=fifo) for a in argv))
    assert r.returncode != 0
    assert "not a regular file" in r.stderr and str(fifo) in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["verify", "format-dump"])
def test_verify_and_format_dump_refuse_a_fifo(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "job.sqj"
    os.mkfifo(fifo)
    r = run_cli(command, str(fifo))
    assert r.returncode != 0
    assert "not a regular file" in r.stderr, r.stderr


def test_the_duplicate_ack_probe_does_not_block_on_a_fifo_at_the_receipt_name(tmp_path: Path, queue: Queue) -> None:
    """A group member plants a FIFO where an ack looks for its own receipt."""
    from steadqd.fs import settle

    os.mkfifo(tmp_path / "receipt")
    job = queue.enqueue(b"x")
    lease = queue.lease()
    assert lease is not None and lease.job_id == job
    found: list[bool] = []
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    try:
        t = threading.Thread(
            target=lambda: found.append(settle._receipt_matches_in(queue._ctx, dir_fd, "receipt", 0, 0, lease)),
            daemon=True,
        )
        t.start()
        t.join(10)
    finally:
        os.close(dir_fd)
    assert found == [False], "the probe blocked on the FIFO"
