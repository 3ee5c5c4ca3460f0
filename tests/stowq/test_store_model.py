"""The memory store and the fault injector against a pure model (Hypothesis state machine).

Why: the protocol's model and fault tests will trust two things about the
store layer, and this checks both over random sequences. First, the memory
store answers every operation as a plain dictionary of bodies would.
Second, each injected fault means what its outcome class promises: after
``NotCommitted`` nothing changed; after ``OutcomeUnknown`` the write either
happened or did not, and reading the ticket's key tells which.
"""

from __future__ import annotations

import hashlib

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from steadqd.errors import AlreadyExists, NotCommitted, NotFound, OutcomeUnknown, PreconditionFailed
from steadqd.s3.store.base import PendingWrite
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import MemoryStore

KEYS = st.sampled_from(["q/jobs/0000/a", "q/jobs/0000/b", "q/claims/0000/a/00000001", "q/meta/watermark", "r/x"])
BODIES = st.binary(max_size=12)
FAULTS = st.one_of(
    st.none(),
    st.builds(Fault, kind=st.just(FaultKind.BEFORE_SEND)),
    st.builds(
        Fault,
        kind=st.sampled_from([FaultKind.TIMEOUT, FaultKind.CONNECTION_LOST, FaultKind.SERVER_ERROR]),
        applied=st.booleans(),
    ),
)


def _etag(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


class StoreAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.inner = MemoryStore()
        self.store = FaultyStore(self.inner)
        self.model: dict[str, bytes] = {}

    def _write(self, fault: Fault | None, write: object, applies: object) -> None:
        """Run ``write`` under ``fault``; ``applies`` is what the model does if it took effect."""
        before = dict(self.model)
        with self.store.armed(*([fault] if fault else [])):
            try:
                write()  # type: ignore[operator]
            except NotCommitted:
                assert self.inner.snapshot() == before  # provably nothing happened
                return
            except OutcomeUnknown as unknown:
                assert isinstance(unknown.ticket, PendingWrite)
                self._resolve(unknown.ticket, before, applies)
                return
            except (AlreadyExists, PreconditionFailed):
                assert self.inner.snapshot() == before
                return
        applies()  # type: ignore[operator]

    def _resolve(self, ticket: PendingWrite, before: dict[str, bytes], applies: object) -> None:
        """Outcome unknown: the store is as before or as after, and reading the ticket's key tells which."""
        self.model = dict(before)
        applies()  # type: ignore[operator]
        after, now = self.model, self.inner.snapshot()
        assert now in (before, after)
        if ticket.op == "delete":
            landed = ticket.key not in now
        else:
            landed = ticket.key in now and hashlib.sha256(now[ticket.key]).digest() == ticket.sha256
        if now != before:
            assert landed
        self.model = now

    @rule(key=KEYS, body=BODIES, fault=FAULTS)
    def create(self, key: str, body: bytes, fault: Fault | None) -> None:
        def applies() -> None:
            self.model.setdefault(key, body)

        self._write(fault, lambda: self.store.put_if_absent(key, body), applies)

    @rule(key=KEYS, body=BODIES, fault=FAULTS, stale=st.booleans())
    def cas(self, key: str, body: bytes, fault: Fault | None, stale: bool) -> None:
        current = self.model.get(key)
        etag = _etag(b"never written" if stale or current is None else current)

        def applies() -> None:
            if current is not None and etag == _etag(current):
                self.model[key] = body

        self._write(fault, lambda: self.store.put_if_match(key, body, etag), applies)

    @rule(key=KEYS, fault=FAULTS)
    def delete(self, key: str, fault: Fault | None) -> None:
        self._write(fault, lambda: self.store.delete(key), lambda: self.model.pop(key, None))

    @rule(key=KEYS)
    def read(self, key: str) -> None:
        try:
            got = self.store.get(key)
        except NotFound:
            assert key not in self.model
        else:
            assert got.body == self.model[key] and got.meta.etag == _etag(got.body)
            assert self.store.head(key).size == len(self.model[key])

    @rule(prefix=st.sampled_from(["", "q/", "q/jobs/", "r/", "z/"]), limit=st.integers(0, 3))
    def listing(self, prefix: str, limit: int) -> None:
        expected = sorted(k for k in self.model if k.startswith(prefix))
        keys: list[str] = []
        after = None
        for _ in range(10):
            page = self.store.list_page(prefix, start_after=after, limit=limit)
            keys += [m.key for m in page.items]
            if page.next_start_after is None:
                break
            after = page.next_start_after
        assert keys == (expected if limit else [])

    @invariant()
    def matches_the_model(self) -> None:
        assert self.inner.snapshot() == self.model


TestStoreAgainstModel = StoreAgainstModel.TestCase
TestStoreAgainstModel.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
