"""A handle file or ticket the user names may be a FIFO (issue 15 point 1): the
command says so and exits, instead of blocking in open() until a writer comes."""

from __future__ import annotations

import os
import subprocess
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
