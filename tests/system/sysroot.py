"""Boot real systemd as PID 1 of a throwaway root, run commands in it, tear it down.

Why a throwaway root: systemd as PID 1 runs systemd-tmpfiles, journald,
sysusers... on whatever root it finds. On the shared host root it would wipe
/tmp, create /dev/log, apply sysctls. So the root here is an overlayfs whose
lower layer is the host's ``/`` (read-only through the overlay) and whose upper
layer is a tmpfs the harness owns; /run, /tmp and /dev are fresh tmpfs
instances inside it; /sys and /proc/sys are read-only; the only writable
kernel interface is a cgroup2 mount rooted (cgroup namespace) at a sub-cgroup
the harness creates and removes. All of it lives in private mount, PID, UTS,
IPC, network and cgroup namespaces (``boot.sh`` does the in-namespace part).

Lifecycle: :meth:`SystemdRoot.boot` then :meth:`run` / :meth:`sh` (``nsenter``
into the namespaces), then :meth:`shutdown` (SIGRTMIN+4 to the namespace's
PID 1, SIGKILL if it does not exit in time) and :meth:`cleanup`, which is
idempotent and also registered with ``atexit``. Besides, the unshare process
carries PR_SET_PDEATHSIG and ``--kill-child``: if the test process is killed
outright, the whole PID namespace dies with it and only a tmpfs mount, an
empty cgroup and a directory remain, which the next session removes
(:func:`reap_stale`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from tests.procs import alive, die_with_parent

HERE = Path(__file__).resolve().parent
BOOT_SCRIPT = HERE / "boot.sh"
PREFIX = "steadq-sysroot-"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Services of the host machine: a database, Ceph, Prometheus, disk and LVM monitors that packages on the
# dev box or CI image enable (links in /etc/systemd/system/*.wants, /etc/rc?.d for SysV scripts such as
# radosgw's). The root's lower layer is the host's /, so its boot would start them all (Prometheus would
# even listen on :9090, Cockpit's port, in the root's network namespace). EVERY root masks these,
# whatever set of other units a test chooses (SystemdRoot's ``masked``); a missing name is harmless.
# A host service missing here is caught after boot: :func:`foreign_units` lists it.
HOST_SERVICES = (
    "postgresql.service",
    "postgresql@.service",
    "redis.service",
    "redis-server.service",
    "prometheus.service",
    # ./dev.sh setup installs Ceph for the RGW suite; its packages enable these on the host.
    "ceph.target",
    "ceph-crash.service",
    "ceph-mon.service",
    "ceph-mon.target",
    "ceph-mon@.service",
    "ceph-osd.target",
    "ceph-osd@.service",
    "ceph-radosgw.target",
    "ceph-radosgw@.service",
    "ceph-volume@.service",
    "radosgw.service",  # made from /etc/init.d/radosgw by systemd-sysv-generator
    "rbdmap.service",
    "smartmontools.service",
    "smartd.service",
    "lvm2-monitor.service",
    "lvm2-lvmpolld.socket",
    "lvm2-lvmpolld.service",
    "dm-event.socket",
    "dm-event.service",
    "blk-availability.service",
    "nvmefc-boot-connections.service",
    "nvmf-autoconnect.service",
    "uuidd.socket",
    "uuidd.service",
)

# The system bus. Masked by default (nothing of the queues needs it; root's systemctl talks to
# systemd's private socket); a root that must answer a non-root user's `systemctl is-active`, as
# Cockpit's test root does, leaves these out of its ``masked`` (:data:`MASKED_WITH_DBUS`).
DBUS_UNITS = ("dbus.service", "dbus.socket")

# Units that would touch the host (kernel modules, sysctls, audit, the clock) or do nothing useful
# in a test container (gettys, timers, login), plus D-Bus and the host's services above. Masked in
# the overlay's /etc before boot; a missing unit name is harmless.
MASKED_UNITS = (
    "getty.target",
    "getty-static.service",
    "console-getty.service",
    "getty@.service",
    "serial-getty@.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
    "logrotate.timer",
    "man-db.timer",
    "systemd-tmpfiles-clean.timer",
    "systemd-timesyncd.service",
    "systemd-pstore.service",
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "kmod-static-nodes.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
    "dev-hugepages.mount",
    "systemd-journald-audit.socket",
    "systemd-random-seed.service",
    "systemd-firstboot.service",
    "systemd-repart.service",
    "systemd-pcrphase.service",
    "systemd-pcrphase-sysinit.service",
    "systemd-machine-id-commit.service",
    "systemd-ask-password-wall.path",
    "systemd-ask-password-console.path",
    "systemd-logind.service",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-resolved.service",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    *DBUS_UNITS,
    *HOST_SERVICES,
)

MASKED_WITH_DBUS = tuple(u for u in MASKED_UNITS if u not in DBUS_UNITS)

# What a booted root may run (:meth:`SystemdRoot.foreign_units`): systemd's own units, the bus,
# Cockpit (cockpit-ws enables cockpit.socket on the host; it listens only in the root's network
# namespace) and the project's.
OWN_UNIT_PREFIXES = ("systemd-", "dbus.", "cockpit", "steadq")


class Unavailable(Exception):
    """The machine cannot provide what the system tier needs (the message says what)."""


def _mountinfo() -> list[list[str]]:
    with open("/proc/self/mountinfo") as f:
        return [line.split() for line in f]


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def host_mounts_under(prefix: str) -> list[str]:
    """Mount points of *this* (the host's) mount namespace at or below ``prefix``."""
    prefix = prefix.rstrip("/")
    out = []
    for fields in _mountinfo():
        mp = _unescape(fields[4])
        if mp == prefix or mp.startswith(prefix + "/"):
            out.append(mp)
    return out


def _cgroup2_base() -> str:
    """The host's cgroup2 directory of this process (where the sub-cgroup goes)."""
    mnt = None
    for fields in _mountinfo():
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            mnt = _unescape(fields[4])
            break
    if mnt is None:
        raise Unavailable("no cgroup2 file system is mounted on the host (needed for systemd's cgroup namespace)")
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, _, path = line.rstrip("\n").split(":", 2)
            if hid == "0":
                return os.path.join(mnt, path.lstrip("/"))
    raise Unavailable("this process has no cgroup2 membership (/proc/self/cgroup has no 0:: line)")


def python_home() -> str:
    """The prefix of the interpreter that runs the tests (and that the venv points at)."""
    return os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(sys.executable)), ".."))


def check_prerequisites() -> None:
    """Raise :class:`Unavailable` naming the first thing this machine lacks."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (mounts, namespaces and systemd as PID 1)")
    for tool in ("unshare", "nsenter", "pivot_root", "mount", "umount", "runuser", "useradd"):
        if shutil.which(tool, path=PATH) is None:
            raise Unavailable(f"`{tool}` is not installed")
    if not os.access("/lib/systemd/systemd", os.X_OK):
        raise Unavailable("systemd is not installed (/lib/systemd/systemd)")
    with open("/proc/filesystems") as f:
        fs = f.read().split()
    for need in ("overlay", "tmpfs", "cgroup2", "devpts"):
        if need not in fs:
            raise Unavailable(f"the kernel has no {need} file system (/proc/filesystems)")
    for ns in ("pid", "mnt", "uts", "ipc", "net", "cgroup"):
        if not os.path.exists(f"/proc/self/ns/{ns}"):
            raise Unavailable(f"the kernel has no {ns} namespaces")
    _cgroup2_base()
    probe = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--cgroup",
            "--propagation",
            "private",
            "--",
            "/bin/true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        raise Unavailable(f"cannot create namespaces: {probe.stderr.strip() or probe.returncode}")


def _rmdir_tree(path: str) -> None:
    """Remove a cgroup directory tree depth-first (cgroupfs only allows rmdir of empty groups)."""
    if not os.path.isdir(path):
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            _rmdir_tree(entry.path)
    os.rmdir(path)


def reap_stale() -> list[str]:
    """Clean up what a *killed* earlier session left (its owner PID is gone). Returns what was removed.

    Only directories named ``/tmp/steadq-sysroot-*`` that carry an ``owner``
    file naming a dead PID are touched, so a concurrent session is never disturbed.
    """
    removed = []
    for d in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((d / "owner").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if alive(owner):
            continue
        for mp in sorted(host_mounts_under(str(d)), key=len, reverse=True):
            subprocess.run(["umount", mp], check=False)
        try:
            cg = (d / "cgroup").read_text().strip()
            if os.path.basename(cg).startswith(PREFIX):
                _rmdir_tree(cg)
        except OSError:
            pass
        if not host_mounts_under(str(d)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
    return removed


class SystemdRoot:
    """One throwaway root with systemd as its PID 1. Not reusable after :meth:`cleanup`."""

    def __init__(
        self, unit: str = "multi-user.target", masked: Sequence[str] = MASKED_UNITS, binds: Sequence[str] = ()
    ) -> None:
        self.unit = unit
        self.binds = tuple(binds)
        # The host's services are masked whatever the caller chose (dict: ordered, no duplicates).
        self.masked = tuple(dict.fromkeys((*masked, *HOST_SERVICES)))
        self.dir: str | None = None
        self.layers: str | None = None
        self.spool: str | None = None
        self.cgroup: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid1: int | None = None  # the namespace's PID 1 (systemd) as the host sees it
        self._log: BinaryIO | None = None
        self._cleaned = False

    # -- boot -------------------------------------------------------------------

    def boot(self, timeout: float = 90.0) -> str:
        """Build the root, start systemd and wait until it has finished booting.

        Returns the final ``systemctl is-system-running`` state ("running", or
        "degraded" with the failed units in :meth:`failed_units`).
        """
        atexit.register(self.cleanup)
        self.dir = tempfile.mkdtemp(prefix=PREFIX)
        Path(self.dir, "owner").write_text(f"{os.getpid()}\n")
        self.layers = os.path.join(self.dir, "layers")
        self.spool = os.path.join(self.dir, "spool")
        os.mkdir(self.layers, 0o700)
        os.mkdir(self.spool, 0o755)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "mode=700,size=2g", "steadq-sysroot-layers", self.layers], check=True
        )
        for d in ("upper", "work", "root"):
            os.mkdir(os.path.join(self.layers, d), 0o755)
        self._preseed_upper(os.path.join(self.layers, "upper"))

        self.cgroup = os.path.join(_cgroup2_base(), os.path.basename(self.dir))
        Path(self.dir, "cgroup").write_text(self.cgroup + "\n")
        os.mkdir(self.cgroup)

        cgroup_procs = os.path.join(self.cgroup, "cgroup.procs")

        def child_setup() -> None:
            # Runs in the forked child before exec: die with the test process,
            # and put unshare (hence the cgroup namespace's root) in our sub-cgroup.
            die_with_parent()
            with open(cgroup_procs, "w") as f:
                f.write("0\n")

        self._log = open(os.path.join(self.dir, "console.log"), "wb")  # noqa: SIM115 (closed in cleanup)
        self.proc = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--cgroup",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                str(BOOT_SCRIPT),
                self.layers,
                self.spool,
                python_home(),
                self.unit,
                *self.binds,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_setup,
            env={"PATH": PATH},
        )
        self.pid1 = self._find_pid1(timeout=15.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the throwaway root exited during boot:\n{self.console()}")
            if self._systemd_is_pid1():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"systemd did not start as PID 1:\n{self.console()}")
        state = self._wait_booted(deadline)
        return state

    def _preseed_upper(self, upper: str) -> None:
        """Write the masks into the overlay's upper layer before systemd reads its units."""
        etc = os.path.join(upper, "etc", "systemd", "system")
        os.makedirs(etc, 0o755)
        for d in (os.path.join(upper, "etc"), os.path.join(upper, "etc", "systemd"), etc):
            os.chmod(d, 0o755)
        for unit in self.masked:
            os.symlink("/dev/null", os.path.join(etc, unit))

    def _find_pid1(self, timeout: float) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        while time.monotonic() < deadline:
            try:
                children = Path(path).read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"unshare did not start the namespace's PID 1:\n{self.console()}")

    def _systemd_is_pid1(self) -> bool:
        try:
            return Path(f"/proc/{self.pid1}/comm").read_text().strip() == "systemd"
        except OSError:
            return False

    def _wait_booted(self, deadline: float) -> str:
        state = "unknown"
        while time.monotonic() < deadline:
            r = self.run("systemctl", "is-system-running", check=False, timeout=max(1.0, deadline - time.monotonic()))
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return state
            if state not in ("offline", "initializing", "starting", "unknown", ""):
                break
            time.sleep(0.2)
        raise RuntimeError(f"systemd did not finish booting (state {state!r}):\n{self.console()}")

    # -- commands ---------------------------------------------------------------

    def nsenter_argv(self) -> list[str]:
        assert self.pid1 is not None
        return ["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"]

    def run(
        self,
        *argv: str,
        user: str | None = None,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the root (as ``user`` via runuser), with a clean environment."""
        if self.pid1 is None or self._cleaned:
            raise RuntimeError("the throwaway root is not running")
        base_env = {
            "PATH": PATH,
            "LANG": "C.UTF-8",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
            "SYSTEMD_LOG_COLOR": "0",
            "TERM": "dumb",
        }
        base_env.update(env or {})
        inner = ["env", "-i", *(f"{k}={v}" for k, v in base_env.items()), *argv]
        if user is not None:
            inner = ["runuser", "-u", user, "--", *inner]
        r = subprocess.run(
            [*self.nsenter_argv(), *inner],
            input=input.decode() if isinstance(input, bytes) else input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": PATH},
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)!r} (user {user}) exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
            )
        return r

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a /bin/sh script inside the root."""
        return self.run("/bin/sh", "-ec", script, **kw)  # type: ignore[arg-type]

    def host_path(self, path: str) -> str:
        """Where a path below /var/lib/steadq inside the root is on the host (the ext4 spool)."""
        assert self.spool is not None and path.startswith("/var/lib/steadq")
        return self.spool + path[len("/var/lib/steadq") :]

    def foreign_units(self) -> list[str]:
        """Units the boot started that are neither systemd's own nor a D-Bus, Cockpit or SteadQ unit:
        a host service that :data:`HOST_SERVICES` misses (the fixtures check this right after boot)."""
        out = self.run(
            "systemctl",
            "list-units",
            "--no-legend",
            "--plain",
            "--all",
            "--state=active,activating,reloading,deactivating,failed",
            "--type=service,socket,timer,path,automount",
            check=False,
        ).stdout
        names = [line.split()[0] for line in out.splitlines() if line.strip()]
        return [n for n in names if not n.startswith(OWN_UNIT_PREFIXES)]

    def stop_foreign_units(self) -> list[str]:
        """Stop what :meth:`foreign_units` finds, warn naming it, and return its names.

        A warning, not a failure: another machine's image may carry a service :data:`HOST_SERVICES`
        does not know yet, and it ran only inside this throwaway root (overlay upper layer, loopback
        only); the warning names it so it gets masked."""
        foreign = self.foreign_units()
        if foreign:
            self.run("systemctl", "stop", "--", *foreign, check=False)
            warnings.warn(
                f"the root's boot started the host's units (stopped; add them to sysroot.HOST_SERVICES): {foreign}",
                stacklevel=2,
            )
        return foreign

    def failed_units(self) -> str:
        return self.run("systemctl", "--failed", "--no-legend", "--plain", check=False).stdout

    def console(self) -> str:
        if self.dir is None:
            return ""
        try:
            return Path(self.dir, "console.log").read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    # -- teardown ---------------------------------------------------------------

    def shutdown(self, timeout: float = 60.0) -> int | None:
        """Ask systemd to power off (SIGRTMIN+4); SIGKILL the namespace if it does not exit in time.

        Returns unshare's exit status (None if nothing was running).
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None and self.pid1 is not None:
            try:
                os.kill(self.pid1, signal.SIGRTMIN + 4)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # Killing the namespace's PID 1 makes the kernel kill every process in it.
                try:
                    os.kill(self.pid1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        return self.proc.poll()

    def cleanup(self) -> list[str]:
        """Stop everything and remove every trace; idempotent. Returns problems found (empty = clean)."""
        if self._cleaned:
            return []
        self._cleaned = True
        problems: list[str] = []
        try:
            self.shutdown()
        except Exception as e:  # keep cleaning up
            problems.append(f"shutdown failed: {e!r}")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.pid1 is not None and alive(self.pid1) and self._systemd_is_pid1():
            problems.append(f"namespace PID 1 ({self.pid1}) still alive")
        if self._log is not None:
            self._log.close()
        if self.dir is not None:
            for mp in sorted(host_mounts_under(self.dir), key=len, reverse=True):
                r = subprocess.run(["umount", mp], capture_output=True, text=True)
                if r.returncode != 0:
                    problems.append(f"umount {mp}: {r.stderr.strip()}")
            left = host_mounts_under(self.dir)
            if left:
                problems.append(f"mounts left: {left}")
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    _rmdir_tree(self.cgroup)
                    break
                except OSError:
                    time.sleep(0.1)  # processes of a dying namespace leave their cgroups a moment later
            if os.path.exists(self.cgroup):
                problems.append(f"cgroup left: {self.cgroup}")
        if self.dir is not None and not host_mounts_under(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
            if os.path.exists(self.dir):
                problems.append(f"directory left: {self.dir}")
        try:
            atexit.unregister(self.cleanup)
        except Exception:
            pass
        return problems
