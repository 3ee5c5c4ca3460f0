"""One single-node Ceph cluster with an S3 gateway for the live tests: a mon, one memstore OSD, radosgw.

Why plain processes: the Debian packages ship systemd units, and a test run
must never start systemd or touch /etc/ceph. So the cluster is what
``vstart.sh`` would make, by hand: a config file, a keyring and every
daemon's data, sockets, logs and pid files under the directory it is given,
each daemon in the foreground (``-f``) so its PID is the Popen's, stopped by
that PID. Everything listens on 127.0.0.1 only: the mon on msgr2 alone, the
OSD on the address the mon gives it, radosgw's beast frontend on a free
port. The OSD's objectstore is memstore: nothing is written to a device, and
one OSD with pool size 1 is a cluster that is HEALTH_OK as soon as it is up.

cephx stays on, as on a real cluster (radosgw, a daemon, cannot reach a mon
with ``auth none`` on 16.2: its first auth request is refused). The S3 user is
made with ``radosgw-admin`` with the same throw-away key as the SeaweedFS
fixture's, and clients get it through a 0600 credentials file.

Start time is dominated by pool creation (radosgw-admin and radosgw create
seven pools, each a mon proposal); see :data:`READY_TIMEOUT_S` and
docs/testing.md for the measured times.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from steadqd.demo.seaweed import free_ports
from steadqd.s3.store.base import CEPH_RGW, StoreProfile
from tests.procs import die_with_parent
from tests.stowq.live_s3 import ACCESS_KEY, SECRET_KEY, Gateway, write_credentials

# From Debian's ceph-mon, ceph-osd and radosgw (dev.sh's CEPH_PACKAGES installs them).
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool", "monmaptool")
READY_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 60.0
# A memstore OSD writes its whole store out on SIGTERM; the data is scratch, so a short grace then SIGKILL.
STOP_GRACE_S = 1.0
RGW_USER = "steadq-test"
# Stopped in this order: the gateway before the OSD before the mon, so none hunts for a peer already gone.
_DAEMONS = ("radosgw", "osd", "mon")


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _config(root: Path, fsid: str, mon_port: int) -> str:
    """ceph.conf: one mon, pools of size 1, everything under ``root``, lean daemons for a shared 2-core machine."""
    return f"""[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
public addr = 127.0.0.1
ms bind ipv6 = false
ms bind msgr1 = false
keyring = {root}/keyring
run dir = {root}/run
admin socket = {root}/run/$name.asok
pid file = {root}/run/$name.pid
log file = {root}/log/$name.log
crash dir = {root}/crash
mon data = {root}/mon/$id
osd data = {root}/osd/$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd memory target = 939524096
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon allow pool delete = true
# One proposal per pool creation: without these each waits up to a second.
paxos propose interval = 0.05
paxos min wait = 0.01
rgw thread pool size = 32
rgw dynamic resharding = false
rgw enable usage log = false
"""


@dataclass
class Ceph(Gateway):
    """A running cluster: where its gateway answers, how to reach it (:class:`Gateway`), how to stop it."""

    endpoint: str
    root: Path
    conf: Path
    credentials_file: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started_in_s: dict[str, float] = field(default_factory=dict)
    default_profile: ClassVar[StoreProfile] = CEPH_RGW

    def log_tail(self, lines: int = 20) -> str:
        tails = []
        for log in sorted((self.root / "log").glob("*")):
            try:
                text = log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails) or "(no log)"

    def ceph(self, *args: str) -> str:
        """One ``ceph`` (or ``radosgw-admin``, as ``args[0]``) command against this cluster; its stdout."""
        program, rest = (args[0], args[1:]) if args and args[0] == "radosgw-admin" else ("ceph", args)
        done = subprocess.run(
            [program, "-c", str(self.conf), *rest],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(rest)} exited with {done.returncode}: {done.stderr.decode(errors='replace')}"
            )
        return done.stdout.decode()

    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the child holds it, closed below
        try:
            self.processes[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run reaches it through stop(), not twice
                preexec_fn=die_with_parent,  # a test run killed before stop() takes its cluster with it
            )
        finally:
            log.close()

    def stop(self) -> None:
        """Stop every daemon by its PID: SIGTERM to all, a short grace, SIGKILL to what is left."""
        running = [self.processes[n] for n in _DAEMONS if n in self.processes and self.processes[n].poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # A killed daemon leaves its admin socket and pid file; nothing of the cluster outlives stop().
        for leftover in (self.root / "run").glob("*"):
            leftover.unlink(missing_ok=True)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"ceph {name} exited with {process.returncode}:\n{self.log_tail()}")


def _run(*argv: str) -> None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {done.returncode}: {done.stderr.decode(errors='replace')}")


def _keyring(path: Path) -> None:
    """One keyring for every entity (the mon imports it at mkfs): the cluster lives and dies with the test."""
    entities = {
        "mon.": ["mon", "allow *"],
        "client.admin": ["mon", "allow *", "osd", "allow *", "mgr", "allow *"],
        "osd.0": ["mon", "allow profile osd", "osd", "allow *", "mgr", "allow profile osd"],
        "client.rgw": ["mon", "allow rw", "osd", "allow rwx", "mgr", "allow rw"],
    }
    first = True
    for name, caps in entities.items():
        argv = ["ceph-authtool", str(path), "--gen-key", "-n", name]
        if first:
            argv.insert(2, "--create-keyring")
            first = False
        for kind, cap in zip(caps[::2], caps[1::2], strict=True):
            argv += ["--cap", kind, cap]
        _run(*argv)
    path.chmod(0o600)


def _wait(what: str, cluster: Ceph, ready: Callable[[], bool], deadline: float) -> None:
    while True:
        cluster.check_alive()
        if ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"ceph {what} not ready after {READY_TIMEOUT_S:.0f} s:\n{cluster.log_tail()}")
        time.sleep(0.2)


def _osd_up(cluster: Ceph) -> bool:
    return int(json.loads(cluster.ceph("osd", "stat", "-f", "json")).get("num_up_osds", 0)) >= 1


def start(root: Path) -> Ceph:
    """Start a cluster with everything under ``root``; the caller stops it (use :func:`running`)."""
    for sub in ("run", "log", "crash", "mon/a", "osd/0"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    mon_port, rgw_port = free_ports(2)
    fsid = str(uuid.uuid4())
    conf = root / "ceph.conf"
    conf.write_text(_config(root, fsid, mon_port))
    cluster = Ceph(f"http://127.0.0.1:{rgw_port}", root, conf, write_credentials(root))
    began = time.monotonic()
    deadline = began + READY_TIMEOUT_S
    try:
        _keyring(root / "keyring")
        _run(
            "monmaptool", "--create", "--fsid", fsid, "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", str(root / "monmap")
        )
        _run("ceph-mon", "-c", str(conf), "--mkfs", "-i", "a", "--monmap", str(root / "monmap"))
        cluster.spawn("mon", ["ceph-mon", "-c", str(conf), "-f", "-i", "a"])
        osd_uuid = str(uuid.uuid4())
        osd_id = cluster.ceph("osd", "new", osd_uuid).strip()
        if osd_id != "0":
            raise RuntimeError(f"a fresh cluster numbered its first OSD {osd_id!r}, not 0")
        _run("ceph-osd", "-c", str(conf), "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
        cluster.spawn("osd", ["ceph-osd", "-c", str(conf), "-f", "-i", "0"])
        _wait("OSD", cluster, lambda: _osd_up(cluster), deadline)
        cluster.started_in_s["mon and OSD"] = time.monotonic() - began
        cluster.ceph(
            "radosgw-admin", "user", "create", f"--uid={RGW_USER}", "--display-name=steadq tests",
            f"--access-key={ACCESS_KEY}", f"--secret-key={SECRET_KEY}",
        )  # fmt: skip
        cluster.spawn(
            "radosgw",
            ["radosgw", "-c", str(conf), "-f", "-n", "client.rgw", "--rgw-frontends", f"beast endpoint=127.0.0.1:{rgw_port}"],
        )  # fmt: skip
        _wait("radosgw", cluster, cluster.answers, deadline)  # no answer while its pools are being made
        cluster.started_in_s["all"] = time.monotonic() - began
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running(root: Path) -> Iterator[Ceph]:
    cluster = start(root)
    try:
        yield cluster
    finally:
        cluster.stop()
