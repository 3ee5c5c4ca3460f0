"""The CEPH_RGW profile's quirks, offline: each one changes what the memory store, the injector or the S3 client do.

What Ceph RGW 16.2 does is pinned live in ``test_store_ceph.py``; here each
profile field is shown to change behaviour where it should, so any store
implementation given the profile honours it, and certification accepts the
profile only with the field's remedy in place.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from steadqd.errors import NotCommitted, PreconditionFailed
from steadqd.s3.certify import certify
from steadqd.s3.store.base import CEPH_RGW, MEMORY, S3_GENERIC, SECOND_NS, StoreProfile, check_if_match
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.store.s3 import S3Settings, S3Store

NO_WAIT = {"sleep": lambda _s: None, "large_body_bytes": 64 * 1024}
PREFIX_MATCHING = StoreProfile("prefix-if-match", granularity_ns=1, if_match_prefix=True)


def _failed(store: MemoryStore | FaultyStore, **options: object) -> list[str]:
    return [f"{c.primitive} {c.title}" for c in certify(store, **NO_WAIT, **options).failures]


def test_the_memory_store_under_the_ceph_profile_is_certified_with_p7_by_read_back() -> None:
    store = MemoryStore(clock=ManualClock(step_ns=SECOND_NS), profile=CEPH_RGW)
    result = certify(store, peer=store.peer(), **NO_WAIT)
    assert result.certified, result.report()
    assert result.measured["P7 mode"].startswith("read-back")


def test_a_prefix_matching_engine_takes_a_longer_etag_unless_the_client_refuses_to_send_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore(profile=PREFIX_MATCHING)
    current = store.put_if_absent("meta/watermark", b"v1").etag
    with pytest.raises(PreconditionFailed, match="not a single-PUT ETag"):
        store.put_if_match("meta/watermark", b"forged", current + "0")
    assert store.get("meta/watermark").body == b"v1"
    assert _failed(MemoryStore(profile=PREFIX_MATCHING)) == []

    # Without the guard the memory store is the engine itself: RGW's strncmp takes the forged version.
    monkeypatch.setattr("steadqd.s3.store.memory.check_if_match", lambda _p, _k, etag: etag)
    store.put_if_match("meta/watermark", b"forged", current + "0")
    assert store.get("meta/watermark").body == b"forged"
    assert _failed(MemoryStore(profile=PREFIX_MATCHING)) == ["P2 compare-and-swap"]


def test_an_exact_matching_profile_sends_any_etag() -> None:
    assert check_if_match(MEMORY, "k", "not-hex") == "not-hex"
    store = MemoryStore()
    current = store.put_if_absent("k", b"v1").etag
    with pytest.raises(PreconditionFailed, match="at version"):
        store.put_if_match("k", b"x", current + "0")  # sent, and refused by exact comparison


def test_the_s3_client_does_not_send_an_etag_a_prefix_matching_engine_could_misread(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = k\naws_secret_access_key = s\n")
    credentials.chmod(0o600)

    def store(profile: StoreProfile) -> S3Store:
        # Port 9 refuses connections: NotCommitted proves a request was attempted, anything else that none was.
        settings = S3Settings("b-ok", endpoint_url="http://127.0.0.1:9", credentials_file=str(credentials), attempts=1)
        return S3Store(settings, profile=profile)

    etag = hashlib.md5(b"v1", usedforsecurity=False).hexdigest()
    with pytest.raises(PreconditionFailed, match="not sent"):
        store(CEPH_RGW).put_if_match("k", b"x", etag + "0")
    for profile, sent in ((CEPH_RGW, etag), (S3_GENERIC, etag + "0")):
        with pytest.raises(NotCommitted, match="could not connect"):
            store(profile).put_if_match("k", b"x", sent)


def _race_loser_unknown(profile: StoreProfile) -> FaultyStore:
    """The second racer of certification's CAS race gets a 5xx and is not applied, as an RGW ECANCELED is."""
    store = FaultyStore(MemoryStore(profile=profile))
    # P2 makes four sequential CASes on its watermark before the race: call 6 is the race's second.
    store.inject(Fault(FaultKind.SERVER_ERROR, op="put_if_match", key_prefix="c/p2/meta/watermark", nth=6, status=500))
    return store


def test_a_cas_race_loser_with_an_unknown_outcome_is_accepted_only_where_the_profile_declares_it() -> None:
    declared = StoreProfile("race-unknown", granularity_ns=1, cas_race_unknown=True)
    result = certify(_race_loser_unknown(declared), scratch_prefix="c/", **NO_WAIT)
    assert result.certified, result.report()
    assert result.measured["P2 race losers"] == "1 of 7 answered with an unknown outcome (5xx), read: lost"

    undeclared = StoreProfile("race-exact", granularity_ns=1)
    result = certify(_race_loser_unknown(undeclared), scratch_prefix="c/", **NO_WAIT)
    assert [f"{c.primitive} {c.title}" for c in result.failures] == ["P2 compare-and-swap"]
    assert "OutcomeUnknown" in result.failures[0].detail
