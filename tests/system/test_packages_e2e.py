"""The Debian package and the appliance bundle, installed into a clean root booted with real systemd.

Why: tests/packaging proves the artefacts are built right (contents, maintainer scripts, lintian),
but only a real systemd shows that they *work* as an administrator uses them (issue 7, "Done
when"): `apt-get install ./steadqd_*.deb` offline creates the user and the spool, enables
steadq.target and no template; `systemctl enable --now steadq-worker@demo` runs jobs; an upgrade
to a higher version restarts the worker (new MainPID) and keeps every queued job; `apt-get remove`
stops the units and leaves every job on disk; a reinstall starts the enabled queue again and
finishes them; purge keeps /var/lib/steadq. The bundle goes through the same cycle with
install.sh / a second install.sh (upgrade) / uninstall.sh / install.sh, and installs the Cockpit
page where cockpit-bridge is (listed by ``cockpit-bridge --packages``), skipping it where not.
The .deb also carries issue 32's pause and unique keys as an administrator meets them: ``steadq
pause`` shown by ``systemctl status``, held jobs run after ``steadq resume``, ``put --unique`` twice.

Each cycle boots its OWN root (not the tier's shared ``system_root``, which installs the project
by hand and would conflict with the package). Both roots have the host's / as the overlay's lower
layer and no network, so the .deb's dependencies (python3-systemd, python3-cffi, python3-yaml)
must be installed on the host: the test skips naming them otherwise. The artefacts are built
once per session with packaging/build-deb.sh (twice: the second with ``--version 0.1.0+1``, what
``make deb DEB_VERSION=0.1.0+1`` runs) and build-bundle.sh into pytest's temporary directory
(tests/package_builds.py: the first .deb and the bundle are the ones tests/packaging checked),
linked into one directory that is bind-mounted read-only into the roots.

Timing: the builds take ~25 s, each cycle ~30-60 s. The only timing premise is that a burst of
jobs of 0.5 s each is not finished before the upgrade/removal starts; it is checked (the queue
must still hold ready jobs), never assumed, and a violated premise fails with that message.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import package_builds
from tests.prereq import opted_out

from . import sysroot
from .conftest import EXTRA_BINDS, _ns_inode, _processes_in, _unavailable, main_pid, queue_state, wait_for
from .sysroot import SystemdRoot

pytestmark = [pytest.mark.system, pytest.mark.packaging]

UPGRADE_VERSION = "0.1.0+1"
HOST_DEPENDENCIES = ("python3", *package_builds.package_depends())
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
QUEUE = "/var/lib/steadq/demo"
RESULTS = "/var/lib/steadq/results"
JOB = "/usr/local/bin/steadq-e2e-job"
UNITS = ("steadq-worker@demo.service", "steadq-sweeper@demo.service", "steadq-promoter@demo.service")
DEADLINE = 90.0  # generous for a loaded 2-core box; every wait ends as soon as its fact holds

HOLD = f"{RESULTS}/hold"
HOLD_CAP_S = 4  # a held job's longest run: what a drain waits for, and the pace while held

# The job command: payloads containing "slow" take 0.5 s, and while HOLD exists up to
# HOLD_CAP_S, so the upgrade and the removal find jobs still queued however slowly apt runs
# on a loaded machine (24 jobs at 0.5 s were once all done before the removal stopped the
# worker). Every run appends "<job_id> <attempt> <worker pid> start|done" to runs.log ($PPID
# is the daemon that spawned it, so the log shows which worker process, before or after an
# upgrade, ran each job).
JOB_SCRIPT = rf"""#!/bin/sh
set -u
payload=$(cat)
log={RESULTS}/runs.log
echo "$STEADQ_JOB_ID $STEADQ_ATTEMPT $PPID start" >> "$log"
case "$payload" in *slow*)
    sleep 0.5
    i=0
    while [ -e {HOLD} ] && [ $i -lt {HOLD_CAP_S * 10 - 5} ]; do sleep 0.1; i=$((i + 1)); done ;;
esac
echo "$STEADQ_JOB_ID $STEADQ_ATTEMPT $PPID done" >> "$log"
"""


def _host_has(package: str) -> bool:
    """The host has ``package`` installed (the offline roots see the host's packages)."""
    st = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return "install ok installed" in st.stdout


@dataclass(frozen=True)
class Artefacts:
    deb: Path  # the version in packaging/debian/changelog
    deb_upgrade: Path  # the same tree rebuilt as UPGRADE_VERSION
    bundle: Path  # steadqd-bundle-<version>-<arch>.tar.gz
    dist: Path  # the directory holding them, bind-mounted into the roots


def _build_unavailable(reason: str) -> None:
    """A build that cannot run skips (fails under STEADQ_PACKAGING_TESTS=1, like tests/packaging)."""
    if os.environ.get("STEADQ_PACKAGING_TESTS", "").strip() == "1":
        pytest.fail(reason)
    pytest.skip(f"packages unavailable: {reason}")


def package_prerequisites() -> None:
    """Skip (or fail, as the tier's settings say) where the package roots cannot run: no system
    tier here, not a Debian system, or the .deb's dependencies missing on the host."""
    if os.environ.get("STEADQ_SYSTEM_TESTS") == "skip":
        opted_out("system tests disabled (STEADQ_SYSTEM_TESTS=skip)")
    if os.environ.get("STEADQ_PACKAGING_TESTS", "").strip() == "0":
        opted_out("STEADQ_PACKAGING_TESTS=0")
    try:
        sysroot.check_prerequisites()
    except sysroot.Unavailable as e:
        _unavailable(str(e))
    if shutil.which("dpkg-query") is None:
        _build_unavailable("not a Debian system (no dpkg-query)")
    # The roots are offline and see the host's packages: the .deb's Depends must be there.
    for dep in HOST_DEPENDENCIES:
        if not _host_has(dep):
            _build_unavailable(
                f"{dep} is not installed on the host (the offline test root needs it; ./dev.sh setup installs it)"
            )


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Artefacts:
    """Both .deb versions and the bundle, built once for this module (what `make deb`/`make bundle` run)."""
    package_prerequisites()
    # The first .deb and the bundle are tests/packaging's builds when it ran in this session.
    builds = [
        package_builds.build(tmp_path_factory, "build-deb.sh"),
        package_builds.build(tmp_path_factory, "build-deb.sh", "--no-lintian", "--version", UPGRADE_VERSION),
        package_builds.build(tmp_path_factory, "build-bundle.sh"),
    ]
    dist = tmp_path_factory.mktemp("pkg-e2e") / "dist"
    dist.mkdir()
    for built in builds:
        if built.failure:
            _build_unavailable(built.failure)
        for artefact in [*built.out.glob("*.deb"), *built.out.glob("*.tar.gz")]:
            os.link(artefact, dist / artefact.name)
    arch = subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()  # any: steadq-exec is compiled
    debs = sorted(dist.glob(f"steadqd_*_{arch}.deb"))
    upgrade = [d for d in debs if d.name == f"steadqd_{UPGRADE_VERSION}_{arch}.deb"]
    first = [d for d in debs if d not in upgrade]
    bundles = sorted(dist.glob("steadqd-bundle-*.tar.gz"))
    assert len(first) == 1 and len(upgrade) == 1 and len(bundles) == 1, (debs, bundles)
    # The root's /tmp is a fresh tmpfs: dist is bind-mounted (read-only) at the same path.
    # (apt-get reads the .deb as root: "unsandboxed" download notice, harmless.)
    return Artefacts(deb=first[0], deb_upgrade=upgrade[0], bundle=bundles[0], dist=dist)


@contextlib.contextmanager
def root_with_deb(
    tmp_path_factory: pytest.TempPathFactory, *also: str, masked: Sequence[str] = sysroot.MASKED_UNITS
) -> Iterator[SystemdRoot]:
    """A booted root with this session's first .deb installed by apt-get (offline), plus the packages
    of the same build named by ``also`` (glob patterns, e.g. ``cockpit-steadq_*_all.deb``); ``masked``
    as :func:`booted_root`.

    The one way the single-package system tests get their root: the prerequisites are checked (skip
    or fail as the tier says), the build is tests/package_builds' (shared with tests/packaging)."""
    package_prerequisites()
    built = package_builds.build(tmp_path_factory, "build-deb.sh")
    if built.failure:
        _build_unavailable(built.failure)
    arch = subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()
    (deb,) = sorted(built.out.glob(f"steadqd_*_{arch}.deb"))
    extra = [str(found) for pattern in also for found in sorted(built.out.glob(pattern))[:1]]
    assert len(extra) == len(also), (also, sorted(built.out.iterdir()))
    with booted_root(built.out, masked=masked) as root:
        _apt(root, "install", str(deb), *extra)
        yield root


@contextlib.contextmanager
def booted_root(dist: Path, masked: Sequence[str] = sysroot.MASKED_UNITS) -> Iterator[SystemdRoot]:
    """A freshly booted root WITHOUT the project installed, ``dist`` bound into it; torn down and leak-checked.

    ``masked``: the units masked before boot (e.g. :data:`sysroot.MASKED_WITH_DBUS` for a root with a
    system bus); the host's services (:data:`sysroot.HOST_SERVICES`) are masked whatever it says."""
    sysroot.reap_stale()
    root = SystemdRoot(masked=masked, binds=(*EXTRA_BINDS, str(dist)))
    pid_ns = None
    problems: list[str] = []
    try:
        state = root.boot()
        pid_ns = _ns_inode(root.pid1, "pid") if root.pid1 else None
        if state != "running":
            raise AssertionError(f"the test root booted {state}; failed units:\n{root.failed_units()}")
        root.stop_foreign_units()
        # A container image's /usr/sbin/policy-rc.d ("exit 101", Docker's default) makes
        # deb-systemd-invoke skip every start/stop/restart of maintainer scripts. A real system has
        # none; remove it in the overlay only (a whiteout in the upper layer, the host keeps it).
        root.run("rm", "-f", "/usr/sbin/policy-rc.d")
        yield root
    finally:
        problems = root.cleanup()
        if pid_ns is not None:
            left: list[int] = []
            for _ in range(50):
                left = _processes_in(pid_ns)
                if not left:
                    break
                time.sleep(0.1)
            else:
                problems.append(f"processes left in the test root's PID namespace: {left}")
        if root.dir is not None and (os.path.exists(root.dir) or sysroot.host_mounts_under(root.dir)):
            problems.append(f"{root.dir} or a mount below it is still there")
    if problems:
        raise AssertionError("the package test root leaked:\n" + "\n".join(problems))


@pytest.fixture
def clean_root(artefacts: Artefacts) -> Iterator[SystemdRoot]:
    """A freshly booted root WITHOUT the project installed; torn down and leak-checked afterwards."""
    with booted_root(artefacts.dist) as root:
        yield root


# -- helpers ------------------------------------------------------------------------------------


def _runs(root: SystemdRoot) -> list[tuple[str, str, str, str]]:
    """(job_id, attempt, worker pid, start|done) per line of the job command's log (host view)."""
    try:
        text = Path(root.host_path(f"{RESULTS}/runs.log")).read_text()
    except FileNotFoundError:
        return []
    return [tuple(line.split()) for line in text.splitlines() if line.strip()]  # type: ignore[misc]


def _put(root: SystemdRoot, steadq: str, payloads: list[str], queue: str = QUEUE) -> list[str]:
    """Enqueue one job per payload (bulk, as the steadq user); returns the job ids in order."""
    lines = "".join(f'"{p}"\n' for p in payloads)
    r = root.run(steadq, "put", queue, "--jsonl", "-", "--print-ids", user="steadq", input=lines)
    ids = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert len(ids) == len(payloads), r.stdout + r.stderr
    return ids


def _wait_done_once(root: SystemdRoot, ids: list[str], what: str, name: str = "demo") -> None:
    """Every job of ``ids`` has a receipt and ran exactly once (one start, one done)."""
    wanted = set(ids)

    def finished() -> bool:
        return wanted <= queue_state(root, name)["receipts"]

    wait_for(f"receipts for every job ({what})", finished, timeout=DEADLINE, interval=0.25)
    runs = [r for r in _runs(root) if r[0] in wanted]
    for event in ("start", "done"):
        counts = Counter(r[0] for r in runs if r[3] == event)
        assert counts == Counter({i: 1 for i in ids}), f"{what}: {event} counts {counts}"


def _active(root: SystemdRoot, unit: str) -> str:
    return root.run("systemctl", "is-active", unit, check=False).stdout.strip()


def _steadq_processes(root: SystemdRoot) -> str:
    return root.run("pgrep", "-a", "-u", "steadq", check=False).stdout.strip()


def _check_fresh_install(root: SystemdRoot, steadq: str) -> None:
    """User, spool, steadq.target enabled and active, no template instance enabled by the installer."""
    assert root.run("getent", "passwd", "steadq").stdout.strip()
    assert root.run("getent", "group", "steadq").stdout.strip()
    assert root.run("stat", "-c", "%a %U %G", "/var/lib/steadq").stdout.split() == ["2770", "steadq", "steadq"]
    assert root.run("systemctl", "is-enabled", "steadq.target").stdout.strip() == "enabled"
    wait_for("steadq.target active", lambda: _active(root, "steadq.target") == "active")
    # Enablement links are symlinks (the bundle's unit files in /etc/systemd/system are not).
    links = root.run("find", "/etc/systemd/system", "-type", "l", "-name", "steadq*@*", check=False).stdout.strip()
    assert links == "", f"the installer enabled a template instance: {links}"
    for unit in UNITS:
        assert _active(root, unit) == "inactive", unit
    # No live queue file: the example names no real queue or command, and would fail check-config.
    found = root.run("find", "/etc/steadq/queues", "-name", "*.yaml", check=False).stdout.strip()
    assert found == "", f"the installer put a queue config in place: {found}"
    root.run(steadq, "--help")


def _setup_demo(root: SystemdRoot, steadq: str, example: str, name: str = "demo") -> None:
    """What docs/packaging.md tells the administrator: a shared queue and <name>.yaml from the example."""
    queue, conf = f"/var/lib/steadq/{name}", f"/etc/steadq/queues/{name}.yaml"
    root.run("install", "-m", "0755", "/dev/stdin", JOB, input=JOB_SCRIPT)
    root.run("install", "-d", "-m", "2770", "-o", "steadq", "-g", "steadq", RESULTS)
    root.run(steadq, "init", queue, "--shared", "--shards", "4", user="steadq")
    assert root.run("stat", "-c", "%a %U %G", queue).stdout.split() == ["2770", "steadq", "steadq"]
    root.sh(
        f"""
        sed -e 's#^queue: .*#queue: {queue}#' \\
            -e 's#^  command: .*#  command: ["{JOB}"]#' \\
            -e 's#^  concurrency: [0-9]*#  concurrency: 1#' \\
            {example} > {conf}
        grep -q '^queue: {queue}$' {conf}
        grep -q '^  command: \\["{JOB}"\\]$' {conf}
        grep -q '^  concurrency: 1 ' {conf}
        """
    )
    # A file made from the example passes the service user's checks.
    r = root.run(steadq + "d", "check-config", "--open", name, check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)


def _still_queued(root: SystemdRoot, ids: list[str], when: str) -> set[str]:
    """The premise of the upgrade/removal checks: some of ``ids`` have not run yet."""
    ready = queue_state(root, "demo")["ready"] & set(ids)
    assert ready, f"premise: jobs must still be queued {when}, but all of them already ran"
    return ready


def _hold(root: SystemdRoot, on: bool) -> None:
    """Slow jobs run at HOLD_CAP_S each while the hold is on (see JOB_SCRIPT)."""
    if on:
        root.run("touch", HOLD)
    else:
        root.run("rm", "-f", HOLD)


@dataclass(frozen=True)
class Installer:
    """How one artefact is installed, upgraded, removed and reinstalled inside the root."""

    steadq: str  # the CLI path it installs
    example: str  # where it puts the example queue file (never /etc/steadq/queues: not a live config)
    install: Callable[[SystemdRoot], None]
    upgrade: Callable[[SystemdRoot], None]
    remove: Callable[[SystemdRoot], None]
    removed_paths: tuple[str, ...]  # gone after remove


def _cycle(root: SystemdRoot, inst: Installer) -> None:
    """install -> enable, jobs run -> upgrade under load -> remove under load -> reinstall -> all done."""
    assert root.run("getent", "passwd", "steadq", check=False).returncode != 0, "the clean root already has steadq"
    t0 = time.monotonic()
    inst.install(root)
    _check_fresh_install(root, inst.steadq)
    _setup_demo(root, inst.steadq, inst.example)

    # 1. enable --now runs jobs.
    root.run("systemctl", "enable", "--now", "steadq-worker@demo")
    for unit in UNITS:
        wait_for(f"{unit} active", lambda u=unit: _active(root, u) == "active")
    first = _put(root, inst.steadq, ["hello-1", "hello-2", "hello-3"])
    _wait_done_once(root, first, "after install")

    # 2. upgrade while jobs are queued: worker restarted, no job lost or run twice.
    pid_before = main_pid(root, "steadq-worker@demo.service")
    assert pid_before > 0
    _hold(root, True)
    burst = _put(root, inst.steadq, [f"slow-up-{i}" for i in range(24)])
    _still_queued(root, burst, "when the upgrade starts")
    inst.upgrade(root)
    wait_for("worker active after the upgrade", lambda: _active(root, "steadq-worker@demo.service") == "active")
    pid_after = main_pid(root, "steadq-worker@demo.service")
    assert pid_after not in (0, pid_before), f"the upgrade did not restart the worker (MainPID {pid_before})"
    _hold(root, False)
    _wait_done_once(root, burst, "across the upgrade")
    ran_by = {r[2] for r in _runs(root) if r[0] in set(burst) and r[3] == "done"}
    assert str(pid_after) in ran_by, f"no queued job ran in the upgraded worker {pid_after}: {ran_by}"

    # 3. remove while jobs are queued: units stopped, every job still on disk.
    _hold(root, True)
    burst2 = _put(root, inst.steadq, [f"slow-rm-{i}" for i in range(16)])
    _still_queued(root, burst2, "when the removal starts")
    inst.remove(root)
    for unit in (*UNITS, "steadq.target"):
        assert _active(root, unit) in ("inactive", "unknown"), f"{unit} still {_active(root, unit)} after removal"
    assert _steadq_processes(root) == "", "steadq processes survived the removal"
    for path in inst.removed_paths:
        assert root.run("test", "-e", path, check=False).returncode != 0, f"{path} survived the removal"
    state = queue_state(root, "demo")
    assert not state["leased"] & set(burst2), "a drained worker left a lease behind"
    assert set(burst2) <= state["ready"] | state["receipts"], "a queued job vanished with the removal"
    assert state["ready"] & set(burst2), "no queued job was left on disk to test the reinstall with"
    assert set(first) | set(burst) <= state["receipts"], "receipts vanished with the removal"
    assert root.run("stat", "-c", "%a %U %G", "/var/lib/steadq").stdout.split() == ["2770", "steadq", "steadq"]
    assert root.run("test", "-f", "/etc/steadq/queues/demo.yaml", check=False).returncode == 0
    assert root.run("getent", "passwd", "steadq").stdout.strip()

    # 4. reinstall: the still-enabled queue starts again by itself and finishes every job.
    _hold(root, False)
    inst.upgrade(root)
    wait_for("worker active after the reinstall", lambda: _active(root, "steadq-worker@demo.service") == "active")
    _wait_done_once(root, burst2, "across remove + reinstall")
    final = queue_state(root, "demo")
    assert not final["ready"] and not final["leased"] and not final["dead"], final
    print(f"cycle took {time.monotonic() - t0:.1f}s")


# -- the Debian package -------------------------------------------------------------------------


def _apt(root: SystemdRoot, *args: str) -> subprocess.CompletedProcess[str]:
    return root.run("apt-get", "-y", "-q", *args, env=APT_ENV, timeout=180)


def test_deb_install_enable_upgrade_remove_reinstall_purge(clean_root: SystemdRoot, artefacts: Artefacts) -> None:
    root = clean_root
    deb, deb2 = str(artefacts.deb), str(artefacts.deb_upgrade)

    def version() -> str:
        return root.run("dpkg-query", "-W", "-f=${Version}", "steadqd").stdout.strip()

    def install(r: SystemdRoot) -> None:
        _apt(r, "install", deb)
        assert version() == artefacts.deb.name.split("_")[1]

    def upgrade(r: SystemdRoot) -> None:
        _apt(r, "install", deb2)
        assert version() == UPGRADE_VERSION

    def remove(r: SystemdRoot) -> None:
        _apt(r, "remove", "steadqd")
        st = r.run("dpkg-query", "-W", "-f=${Status}", "steadqd", check=False).stdout
        assert "config-files" in st, st

    _cycle(
        root,
        Installer(
            steadq="/usr/bin/steadq",
            example="/usr/share/doc/steadqd/examples/example.yaml",
            install=install,
            upgrade=upgrade,
            remove=remove,
            removed_paths=("/usr/bin/steadq", "/usr/bin/steadqd", "/lib/systemd/system/steadq-worker@.service"),
        ),
    )

    # purge: says what it leaves; the queues, the user and the admin's config stay.
    r = _apt(root, "purge", "steadqd")
    assert "/var/lib/steadq" in r.stdout + r.stderr, "purge did not say what it leaves"
    assert root.run("dpkg-query", "-W", "steadqd", check=False).returncode != 0 or "not-installed" in (
        root.run("dpkg-query", "-W", "-f=${Status}", "steadqd", check=False).stdout
    )
    assert root.run("test", "-e", "/etc/steadq/queues/example.yaml", check=False).returncode != 0
    assert root.run("test", "-f", "/etc/steadq/queues/demo.yaml", check=False).returncode == 0
    assert root.run("getent", "passwd", "steadq").stdout.strip()
    wants = root.run("find", "/etc/systemd/system", "-type", "l", "-name", "steadq*@*", check=False).stdout.strip()
    assert wants == "", f"purge left instance links: {wants}"
    receipts = queue_state(root, "demo")["receipts"]
    assert len(receipts) == 3 + 24 + 16, "purge touched the queue"


def test_deb_pause_shows_in_systemctl_status_and_put_unique_refuses_a_second(
    clean_root: SystemdRoot, artefacts: Artefacts
) -> None:
    """Issue 32 #2, #5 as an administrator meets them with the .deb: ``steadq pause transcode --reason
    maintenance`` (the queue by its name) makes ``systemctl status`` say "paused" with the reason, jobs
    put meanwhile wait, ``steadq resume`` runs them; ``put --unique`` twice makes one job, exit 1 the
    second time naming it."""
    root, name = clean_root, "transcode"
    queue, unit = f"/var/lib/steadq/{name}", f"steadq-worker@{name}.service"
    _apt(root, "install", str(artefacts.deb))
    _setup_demo(root, "/usr/bin/steadq", "/usr/share/doc/steadqd/examples/example.yaml", name)
    root.run("systemctl", "enable", "--now", unit)
    wait_for(f"{unit} active", lambda: _active(root, unit) == "active")
    first = _put(root, "/usr/bin/steadq", ["before"], queue)
    _wait_done_once(root, first, "before the pause", name)

    r = root.run("steadq", "pause", name, "--reason", "maintenance", user="steadq")
    assert "paused" in r.stdout and "maintenance" in r.stdout, r.stdout

    def status() -> str:
        """The unit's ``Status:`` line of ``systemctl status`` (the journal lines below it name the pause too)."""
        out = root.run("systemctl", "status", unit, check=False).stdout
        return next((line.strip() for line in out.splitlines() if line.strip().startswith("Status:")), "")

    wait_for(
        "systemctl status to show the pause", lambda: re.search(r"paused since .* by steadq@.*: maintenance", status())
    )
    held = _put(root, "/usr/bin/steadq", ["held-1", "held-2", "held-3"], queue)
    stats = root.run("steadq", "stats", name, user="steadq").stdout
    assert "paused: yes" in stats and "maintenance" in stats, stats
    time.sleep(2.0)  # the pause was visible well over 1 s ago: no claim may start from here on
    assert queue_state(root, name)["ready"] >= set(held), "a job was claimed from a paused queue"
    assert not {r[0] for r in _runs(root)} & set(held), "a held job ran while paused"
    assert "paused" in status()
    assert "queue paused since" in root.run("journalctl", "-u", unit, "--no-pager", check=False).stdout

    r = root.run("steadq", "resume", name, user="steadq")
    assert "resumed" in r.stdout, r.stdout
    _wait_done_once(root, held, "after the resume", name)
    wait_for("the pause gone from systemctl status", lambda: status() and "paused" not in status())

    one = root.run("steadq", "put", name, "--unique", "nightly-report", user="steadq", input="x", check=False)
    two = root.run("steadq", "put", name, "--unique", "nightly-report", user="steadq", input="y", check=False)
    assert one.returncode == 0, (one.stdout, one.stderr)
    jid = one.stdout.split("job_id: ")[1].split()[0]
    assert two.returncode == 1 and f"job_id: {jid}" in two.stdout, (two.stdout, two.stderr)
    _wait_done_once(root, [jid], "the unique job", name)
    state = queue_state(root, name)
    assert state["receipts"] == {*first, *held, jid} and not state["ready"] | state["leased"] | state["dead"], state


# -- the appliance bundle -----------------------------------------------------------------------


def _unpack_bundle(root: SystemdRoot, artefacts: Artefacts) -> str:
    """``tar xzf`` the bundle in /root/bundle inside the root; returns its top directory there."""
    top = re.sub(r"\.tar\.gz$", "", artefacts.bundle.name)
    root.run("mkdir", "-p", "/root/bundle")
    root.run("tar", "-C", "/root/bundle", "-xzf", str(artefacts.bundle))
    unpacked = f"/root/bundle/{top}"
    assert root.run("test", "-x", f"{unpacked}/install.sh", check=False).returncode == 0, "no install.sh at the top"
    return unpacked


def test_bundle_install_enable_upgrade_uninstall_reinstall(clean_root: SystemdRoot, artefacts: Artefacts) -> None:
    root = clean_root
    unpacked = _unpack_bundle(root, artefacts)

    def install(r: SystemdRoot) -> None:
        r.run("sh", "-c", f"cd {unpacked} && ./install.sh", timeout=180)
        assert r.run("readlink", "/usr/local/bin/steadq").stdout.strip() == "/opt/steadq/bin/steadq"
        unit = r.run("systemctl", "cat", "steadq-worker@.service").stdout
        assert "ExecStart=/opt/steadq/bin/steadqd worker %i" in unit

    def remove(r: SystemdRoot) -> None:
        r.run("/opt/steadq/share/steadq/uninstall.sh", timeout=180)

    _cycle(
        root,
        Installer(
            steadq="/usr/local/bin/steadq",
            example="/opt/steadq/share/steadq/examples/example.yaml",
            install=install,
            upgrade=install,
            remove=remove,
            removed_paths=("/opt/steadq", "/usr/local/bin/steadq", "/etc/systemd/system/steadq-worker@.service"),
        ),
    )


COCKPIT_PAGE = "/usr/share/cockpit/steadq"


def _cockpit_packages(root: SystemdRoot) -> dict[str, str]:
    """``cockpit-bridge --packages`` in the root (offline): package name -> its directory."""
    out = root.run("cockpit-bridge", "--packages").stdout
    return {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.strip() and " = " not in line}


def _page_digests(root: SystemdRoot) -> dict[str, str]:
    """sha256 of each file in the root's page directory, by name ({} when it is absent)."""
    out = root.sh(f"if [ -d {COCKPIT_PAGE} ]; then cd {COCKPIT_PAGE} && sha256sum -- *; fi").stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def test_bundle_installs_the_cockpit_page_where_cockpit_is_and_skips_it_where_not(
    clean_root: SystemdRoot, artefacts: Artefacts
) -> None:
    """Issue 34: the bundle carries cockpit-steadq's page. On a root with cockpit-bridge, install.sh
    puts it where Cockpit finds it (``cockpit-bridge --packages`` lists ``steadq``), an upgrade
    replaces it and uninstall.sh removes it; once Cockpit is removed, install.sh skips it in one line."""
    if not _host_has("cockpit-bridge"):
        _build_unavailable("cockpit-bridge is not installed on the host (the offline root needs it; ./dev.sh setup)")
    root = clean_root
    unpacked = _unpack_bundle(root, artefacts)
    source = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (package_builds.REPO / "cockpit").iterdir()}
    assert "steadq" not in _cockpit_packages(root)

    def install() -> list[str]:
        out = root.run("sh", "-c", f"cd {unpacked} && ./install.sh", timeout=180).stdout
        return [line for line in out.splitlines() if "Cockpit" in line]

    assert install() == [f'install.sh: Cockpit found: installed the page "Job queues" into {COCKPIT_PAGE}']
    assert _page_digests(root) == source
    assert _cockpit_packages(root).get("steadq") == COCKPIT_PAGE

    # Upgrade (install.sh again) over a page edited on the target: the bundle's files come back.
    root.sh(f"echo '// edited' >> {COCKPIT_PAGE}/steadq.js && touch {COCKPIT_PAGE}/stray.js")
    install()
    assert _page_digests(root) == source
    assert _cockpit_packages(root).get("steadq") == COCKPIT_PAGE

    root.run("/opt/steadq/share/steadq/uninstall.sh", timeout=180)
    assert root.run("test", "-e", COCKPIT_PAGE, check=False).returncode != 0, "uninstall.sh left the page"
    assert "steadq" not in _cockpit_packages(root)

    # The same root without Cockpit: apt-get removes it (offline; cockpit-ws and -system go with it).
    _apt(root, "remove", "cockpit-bridge")
    assert root.run("test", "-e", "/usr/bin/cockpit-bridge", check=False).returncode != 0
    assert install() == ['install.sh: Cockpit not found (no cockpit-bridge): its page "Job queues" is skipped']
    assert root.run("test", "-e", COCKPIT_PAGE, check=False).returncode != 0
    root.run("/opt/steadq/share/steadq/uninstall.sh", timeout=180)
