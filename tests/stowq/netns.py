"""Hosts made of network namespaces, and a SeaweedFS cluster spread over them, for the multi-host test.

Why namespaces and not containers or VMs: each "host" needs only its own
network stack (an address, a link that can be cut) to show what a second
machine changes for a bucket queue; the processes still share this
machine's file system, so the test reads their side effects directly.

The hosts hang off a bridge that lives in a namespace of its own, and every
veth pair is created with both ends already inside the test's namespaces:
the root namespace's interfaces, addresses and routes are never touched.
Every namespace is named ``sqmh<pid>-<host>`` after the test process, so a
later run deletes what a killed run left (``reap_stale``). Processes are
started with ``ip netns exec`` (which execs, so the PID is the program's)
in a session of their own, die with the test process (``PR_SET_PDEATHSIG``),
and are stopped by their PID. Clients in the test process itself run in a
thread moved into a host's namespace (``Host.call``): a network namespace
is per thread, and a socket stays in the namespace it was made in.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from steadqd.demo import seaweed as launcher
from steadqd.errors import NotCommitted, NotFound
from steadqd.s3.store.base import SEAWEEDFS
from steadqd.s3.store.s3 import S3Settings, S3Store
from tests.procs import alive, die_with_parent
from tests.stowq import seaweed

T = TypeVar("T")

SUBNET = "10.77.0"
NETMASK_BITS = 24
BRIDGE = "br0"
HOST_LINK = "eth0"
_NAME = re.compile(r"sqmh(\d+)-[a-z0-9]+")
_CLONE_NEWNET = 0x40000000
_IP_TIMEOUT_S = 20.0
# Ports are fixed: every host has its own network stack, so nothing else can hold them.
MASTER_PORT, VOLUME_PORT, FILER_PORT, S3_PORT = 9333, 8080, 8888, 8333

_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> str:
    """Run ``ip ARGS``; a failure raises with ip's own complaint."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def missing_prerequisite() -> str | None:
    """Why this machine cannot build the hosts (root, ``ip``, namespaces, veth, bridge), or None."""
    if os.geteuid() != 0:
        return "the multi-host test needs root (network namespaces, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "the multi-host test needs `ip` (iproute2)"
    probe = f"sqmh{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
        ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        ip("-n", probe, "link", "add", "b0", "type", "bridge")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot make network namespaces, veth pairs or bridges here: {exc}"
    finally:
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            ip("netns", "delete", probe)
    return None


def reap_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose test process is gone, killing what still runs in them."""
    reaped = []
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        found = _NAME.fullmatch(name)
        if found is None or alive(int(found.group(1))):
            continue
        for pid in ip("netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "delete", name)
        reaped.append(name)
    return reaped


@dataclass
class Host:
    """One namespace with one address on the bridge."""

    name: str
    netns: str
    address: str

    def argv(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *command]

    def start(self, command: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> Process:
        """Run ``command`` on this host, output to ``log``, in a session of its own (so its job group can be killed)."""
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                self.argv(*command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent,  # only prctl, between fork and exec
            )
        return Process(self, command[0], popen, log)

    def call(self, fn: Callable[[], T], timeout_s: float = 120.0) -> T:
        """``fn()`` in a thread moved into this host's namespace; its sockets stay there."""
        result: list[T] = []
        failure: list[BaseException] = []

        def body() -> None:
            try:
                fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, _CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {self.netns}: {os.strerror(err)}")
                finally:
                    os.close(fd)
                result.append(fn())
            except BaseException as exc:  # handed to the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=body, name=f"netns-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"a call on host {self.name} did not return in {timeout_s:.0f} s")
        if failure:
            raise failure[0]
        return result[0]

    def kill_all(self) -> None:
        """SIGKILL every process on this host, as a host that loses power: whatever groups they made."""
        for pid in map(int, ip("netns", "pids", self.netns).split()):
            if pid != os.getpid():  # a thread of ours may be visiting (Host.call)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def running(self, *argv: str) -> list[int]:
        """The PIDs of this host's processes whose command line begins with ``argv``."""
        want = [arg.encode() for arg in argv]
        found = []
        for pid in map(int, ip("netns", "pids", self.netns).split()):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[: len(want)] == want:
                    found.append(pid)
        return found

    def cut(self) -> None:
        """Take this host off the network: its link goes down inside its own namespace."""
        ip("-n", self.netns, "link", "set", HOST_LINK, "down")

    def mend(self) -> None:
        """Back on the network: the kernel restores the subnet's route with the link."""
        ip("-n", self.netns, "link", "set", HOST_LINK, "up")


@dataclass
class Process:
    """A process started on a host; stopped by its PID (and its session's, for the jobs it spawned)."""

    host: Host
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the process and everything in its session (a worker and the jobs it runs)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, grace_s: float = seaweed.STOP_GRACE_S) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return f"--- {self.host.name}/{self.name} ({self.log}):\n" + "\n".join(text.splitlines()[-lines:])


class Network:
    """A bridge in a namespace of its own and hosts attached to it by veth pairs; ``close`` removes them all."""

    def __init__(self) -> None:
        self.tag = f"sqmh{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", BRIDGE, "up")

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def add(self, name: str, octet: int) -> Host:
        """A host at ``SUBNET.octet``: its ``eth0`` is one end of a veth whose other end is on the bridge."""
        netns = f"{self.tag}-{name}"
        self._add_namespace(netns)
        port = f"v-{name}"
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", HOST_LINK, "netns", netns)
        ip("-n", self.switch, "link", "set", port, "master", BRIDGE, "up")
        address = f"{SUBNET}.{octet}"
        ip("-n", netns, "addr", "add", f"{address}/{NETMASK_BITS}", "dev", HOST_LINK)
        ip("-n", netns, "link", "set", HOST_LINK, "up")
        host = Host(name, netns, address)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Delete every namespace; each veth goes with the namespace of its ends, the bridge with the switch's."""
        failures = []
        for name in reversed(self._namespaces):
            try:
                ip("netns", "delete", name)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                failures.append(str(exc))
        self._namespaces.clear()
        if failures:
            raise RuntimeError("; ".join(failures))


def client_environment(endpoint: str, scratch: Path) -> dict[str, str]:
    """The environment of a ``steadq`` on a host: PATH and the AWS settings of one gateway, nothing else of AWS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID=seaweed.ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=seaweed.SECRET_KEY,
        AWS_REGION="us-east-1",
        AWS_CONFIG_FILE=str(scratch / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(scratch / "no-aws-credentials"),
    )
    return env


@dataclass
class Cluster:
    """SeaweedFS across two store hosts: master, filer and gateway 0 on ``store0``; the second volume
    server and gateway 1 on ``store1``; the first volume server beside the master."""

    weed: str
    root: Path
    store_hosts: tuple[Host, Host]
    identities: Path
    credentials: Path
    processes: dict[str, Process] = field(default_factory=dict)

    @property
    def master(self) -> str:
        return f"{self.store_hosts[0].address}:{MASTER_PORT}"

    def endpoint(self, gateway: int) -> str:
        return f"http://{self.store_hosts[gateway].address}:{S3_PORT}"

    def _start(self, role: str, host: Host, *args: str) -> Process:
        data = self.root / role
        data.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        process = host.start([self.weed, f"-logdir={self.root}", *args], self.root / f"{role}.log", env, cwd=data)
        self.processes[role] = process
        return process

    def start_gateway(self, gateway: int) -> None:
        host = self.store_hosts[gateway]
        self._start(
            f"s3-{gateway}",
            host,
            "s3",
            f"-ip={host.address}",
            f"-ip.bind={host.address}",
            f"-port={S3_PORT}",
            f"-filer={self.store_hosts[0].address}:{FILER_PORT}",
            f"-config={self.identities}",
            "-autoCreateBucket=false",
            "-port.iceberg=0",
            "-port.lance=0",
            *launcher.local_socket("localSocket", str(self.root), f"s3-{gateway}.sock"),
        )

    def kill_gateway(self, gateway: int, hang_s: float) -> None:
        """The gateway hangs (SIGSTOP) for ``hang_s``, then dies (SIGKILL).

        While it is stopped the kernel still accepts connections and takes
        requests, so every client that sends one in that time is left with
        an operation in flight whose answer never comes: the outcome-unknown case.
        """
        process = self.processes[f"s3-{gateway}"]
        os.killpg(process.pid, signal.SIGSTOP)
        time.sleep(hang_s)
        process.kill_group()

    def settings(self, bucket: str, gateway: int) -> S3Settings:
        return S3Settings(
            bucket=bucket,
            endpoint_url=self.endpoint(gateway),
            region="us-east-1",
            credentials_file=str(self.credentials),
            read_timeout_s=10.0,
            connect_timeout_s=3.0,
        )

    def store(self, bucket: str, gateway: int) -> S3Store:
        """A store client of ``gateway``; make and use it inside a host's namespace (``Host.call``)."""
        return S3Store(self.settings(bucket, gateway), profile=SEAWEEDFS)

    def wait_gateway(self, gateway: int, client: Host, deadline_s: float = seaweed.READY_TIMEOUT_S) -> None:
        """Until ``gateway`` answers a LIST from ``client`` (a missing bucket counts as an answer)."""
        process = self.processes[f"s3-{gateway}"]

        def probe() -> None:
            store = self.store("steadq-ready-probe", gateway)
            deadline = time.monotonic() + deadline_s
            try:
                while True:
                    if not process.running():
                        raise RuntimeError(f"gateway {gateway} exited\n{self.logs()}")
                    try:
                        store.list_page("", limit=1)
                        return
                    except NotFound:
                        return
                    except NotCommitted:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"gateway {gateway} not answering after {deadline_s:.0f} s\n{self.logs()}")
                    time.sleep(0.2)
            finally:
                store.close()

        client.call(probe, timeout_s=deadline_s + 30)

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.processes.values())

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()


def start_cluster(root: Path, weed: str, store_hosts: tuple[Host, Host], client: Host) -> Cluster:
    """Master, two volume servers, a filer and two S3 gateways; returns when both gateways answer ``client``."""
    root.mkdir(parents=True, exist_ok=True)
    identities, credentials = seaweed._write_identities(root)  # the same throw-away identity as the one-process server
    cluster = Cluster(weed, root, store_hosts, identities, credentials)
    first, second = store_hosts
    try:
        cluster._start(
            "master",
            first,
            "master",
            f"-ip={first.address}",
            f"-ip.bind={first.address}",
            f"-port={MASTER_PORT}",
            f"-mdir={root / 'master'}",
            "-telemetry=false",  # its default posts to an outside host
            "-volumeSizeLimitMB=64",
            "-defaultReplication=000",
        )
        for index, host in enumerate(store_hosts):
            cluster._start(
                f"volume-{index}",
                host,
                "volume",
                f"-ip={host.address}",
                f"-ip.bind={host.address}",
                f"-port={VOLUME_PORT}",
                f"-dir={root / f'volume-{index}'}",
                "-max=50",  # each bucket is a collection that grows several volumes of its own
                f"-master={cluster.master}",
                "-preStopSeconds=0",
            )
        cluster._start(
            "filer",
            first,
            "filer",
            f"-ip={first.address}",
            f"-ip.bind={first.address}",
            f"-port={FILER_PORT}",
            f"-master={cluster.master}",
            f"-defaultStoreDir={root / 'filer'}",
            *launcher.local_socket("localSocket", str(root), "filer.sock"),
        )
        for gateway in (0, 1):
            cluster.start_gateway(gateway)
        for gateway in (0, 1):
            cluster.wait_gateway(gateway, client)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def hosts(names: dict[str, int]) -> Iterator[Network]:
    """A network with a host per name (at ``SUBNET.octet``), removed on the way out."""
    reap_stale()
    network = Network()
    try:
        for name, octet in names.items():
            network.add(name, octet)
        yield network
    finally:
        network.close()
