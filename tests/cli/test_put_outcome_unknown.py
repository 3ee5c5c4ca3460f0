"""`steadq put` whose enqueue ends outcome-unknown says what to look for, for either backend's ticket.

A bucket queue's ticket names the write whose answer never came (a PendingWrite,
no job id or path); it used to crash the error path with an AttributeError."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from steadqd.cli import main as cli_main
from steadqd.cli import put_cmd
from steadqd.errors import OutcomeUnknown
from steadqd.s3.store.base import PendingWrite


class _LostAnswer:
    def __init__(self, ticket: object) -> None:
        self.ticket = ticket

    def enqueue_detailed(self, payload: Any, **options: Any) -> tuple[str, str]:
        payload.read()
        raise OutcomeUnknown("PUT timed out after it was sent", ticket=self.ticket)

    def pause_state(self) -> None:  # the queue runs: put says nothing about a pause
        return None

    def close(self) -> None:
        pass


def test_a_bucket_ticket_is_reported_not_crashed_on(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    ticket = PendingWrite("put_if_absent", "jobs/00/" + "ab" * 16, b"\x00" * 32)
    monkeypatch.setattr(put_cmd, "open_queue", lambda path, **kw: _LostAnswer(ticket))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"payload")))
    code = cli_main.main(["put", "s3://bucket/q", "-"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "outcome unknown: PUT timed out after it was sent" in err
    assert f"unanswered write: put_if_absent jobs/00/{'ab' * 16}" in err
