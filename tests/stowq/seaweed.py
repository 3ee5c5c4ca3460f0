"""One SeaweedFS server for the live tests and the store benchmark: ``weed server -s3`` on 127.0.0.1.

Why one process: ``weed server`` runs a master, a volume server, a filer and
the S3 gateway together and answers in about 4 s, which a test session can
afford once. It is the demo's launcher (``steadqd.demo.seaweed``: 127.0.0.1
only, ports picked there, telemetry off, stopped by its PID) with the test
suite's options: the fixed test key, no bucket made by a write into it, and
ready when an S3 request is answered.

Clients get that key through a shared-credentials file (mode 0600), the way
an operator would give it: the store code never sees the secret as an
argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from steadqd.demo import seaweed as launcher
from steadqd.demo.seaweed import READY_TIMEOUT_S, weed_binary
from steadqd.s3.store.base import SEAWEEDFS, StoreProfile
from tests.stowq.live_s3 import ACCESS_KEY, SECRET_KEY, Gateway, write_credentials

__all__ = [
    "ACCESS_KEY",
    "READY_TIMEOUT_S",
    "SECRET_KEY",
    "STOP_GRACE_S",
    "Seaweed",
    "running",
    "start",
    "weed_binary",
]

# weed server does not exit on SIGTERM in 15 s; its data is scratch, so a short grace then SIGKILL.
STOP_GRACE_S = 0.5
# Each bucket is a collection that grows several volumes of its own, and the suite makes many buckets.
VOLUME_MAX = 100


@dataclass
class Seaweed(Gateway):
    """A running server: where it answers, how to reach it (:class:`Gateway`), how to stop it."""

    endpoint: str
    root: Path
    credentials_file: Path
    server: launcher.Seaweed
    default_profile: ClassVar[StoreProfile] = SEAWEEDFS

    def log_tail(self, lines: int = 30) -> str:
        return self.server.log_tail(lines)

    def stop(self) -> None:
        self.server.stop(STOP_GRACE_S)


def _write_identities(root: Path) -> tuple[Path, Path]:
    """(the gateway's identities file, the clients' credentials file) for the test key."""
    identities = launcher.write_identities(str(root), "steadq-test", ACCESS_KEY, SECRET_KEY)
    return Path(identities), write_credentials(root)


def start(root: Path, weed: str) -> Seaweed:
    """Start a server with its data under ``root``; the caller stops it (use :func:`running`)."""
    root.mkdir(parents=True, exist_ok=True)
    credentials = write_credentials(root)

    def answers(server: launcher.Seaweed) -> bool:
        return Seaweed(server.endpoint, root, credentials, server).answers()

    server = launcher.start(
        str(root), weed, keys=(ACCESS_KEY, SECRET_KEY), auto_create_bucket=False, volume_max=VOLUME_MAX, ready=answers
    )
    return Seaweed(server.endpoint, root, credentials, server)


@contextlib.contextmanager
def running(root: Path, weed: str) -> Iterator[Seaweed]:
    server = start(root, weed)
    try:
        yield server
    finally:
        server.stop()
