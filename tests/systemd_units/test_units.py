"""The systemd units, sysusers.d/tmpfiles.d files and their documentation, checked offline.

Nothing here boots systemd (tests/system does that in a throwaway root). What we
can check without a running manager, we check with systemd's own tools:

* ``systemd-analyze verify`` on every unit, which parses them exactly as PID 1
  would, loads their dependencies and checks that the executables exist;
* ``systemctl --root enable`` for the [Install] sections;
* ``systemd-sysusers --root`` and ``systemd-tmpfiles --root`` on a scratch root;
* ``systemd-analyze security --offline`` whose findings docs/security-units.md
  must explain.

Why ``--root`` and not a rewritten copy of the units: ``verify`` refuses a unit
whose ExecStart= binary does not exist, and the units name /usr/bin/steadqd
(where the packages install it), which does not exist on a development host. We
could rewrite ExecStart= in a temporary copy to point at the venv's console
script, but then we would verify a file we do not ship. Instead we build a
small root that holds the host's own unit directory (so sysinit.target and
friends resolve), our unit files unmodified, and copies of the few executables
the units name (/usr/bin/steadqd from the venv, kill, sh, sleep). Copies, not
symlinks: with --root, systemd resolves absolute symlinks inside the root.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from steadqd.daemon import main as cli
from steadqd.daemon.config import PromoterConfig, RetrySettings, SweeperConfig, parse_config
from steadqd.daemon.service import EXIT_CONFIG
from steadqd.durations import parse_duration
from steadqd.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "units"
DOCS = REPO / "docs"
ROLES = ("worker", "sweeper", "promoter")
SERVICES = {role: f"steadq-{role}@.service" for role in ROLES}
TARGETS = ("steadq@.target", "steadq.target")
UNIT_FILES = (*SERVICES.values(), *TARGETS)
INSTANCE = "demo"
HOST_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
# Executables named by the units, besides /usr/bin/steadqd.
UNIT_TOOLS = ("kill", "sh", "sleep")
# A UTF-8 locale makes the security table's glyphs (✓ ✗ →) deterministic.
TOOL_ENV = {**os.environ, "LC_ALL": "C.UTF-8", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "cat"}

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


# --- a minimal systemd unit-file reader -------------------------------------------


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)] in file order; keys may repeat, as in systemd.

    Enough of systemd's syntax for our own files: comments (# ;), sections,
    backslash line continuations. It is no substitute for `verify`, only a way
    to assert what the files say.
    """
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        assert current is not None, f"{path}: assignment outside a section: {line}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def single(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= appears {len(found)} times, expected once"
    return found[0]


def words(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> set[str]:
    """All space-separated words of every assignment of a list-valued key."""
    return {w for v in values(unit, section, key) for w in v.split()}


_TIMESPAN_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def timespan(value: str) -> float:
    """Seconds of a systemd time span as our units write it ("30s", "5min", "2min", "90")."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), f"not a time span: {value!r}"
    return sum(float(n) * _TIMESPAN_UNITS[u or "s"] for n, u in parts)


def comment_above(path: Path, prefix: str) -> str:
    """The comment block directly above the first line starting with ``prefix``."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            block: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].startswith("#"):
                block.insert(0, lines[j])
                j -= 1
            return "\n".join(block)
    raise AssertionError(f"{path.name}: no line starts with {prefix!r}")


@pytest.fixture(scope="module")
def units() -> dict[str, dict[str, list[tuple[str, str]]]]:
    return {name: read_unit(UNITS / name) for name in UNIT_FILES}


# --- the scratch root ----------------------------------------------------------------


def build_root(root: Path) -> Path:
    """A root with the host's units, ours, and the executables ours name (see module doc)."""
    host_units = next((d for d in HOST_UNIT_DIRS if os.path.isdir(d)), None)
    if host_units is None:
        pytest.skip("no systemd unit directory on this host")
    unit_dir = root / "usr/lib/systemd/system"
    shutil.copytree(host_units, unit_dir, symlinks=True)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "bin").symlink_to("usr/bin")  # usr-merged, like Debian 12: /bin/kill is /usr/bin/kill
    (root / "lib").symlink_to("usr/lib")
    for tool in UNIT_TOOLS:
        found = shutil.which(tool) or f"/bin/{tool}"
        shutil.copy2(os.path.realpath(found), root / "usr/bin" / tool)
    script = Path(sys.executable).with_name("steadqd")  # the console script of this venv
    if script.exists():
        shutil.copy2(script, root / "usr/bin/steadqd")
    else:  # an uninstalled checkout: verify only needs an executable file there
        (root / "usr/bin/steadqd").write_text("#!/bin/sh\nexit 1\n")
        (root / "usr/bin/steadqd").chmod(0o755)
    for name in UNIT_FILES:
        shutil.copy2(UNITS / name, unit_dir / name)
    return root


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_root(tmp_path_factory.mktemp("unitroot"))


def instance_names() -> list[str]:
    return [f"steadq-{r}@{INSTANCE}.service" for r in ROLES] + [f"steadq@{INSTANCE}.target", "steadq.target"]


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "--no-pager", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=TOOL_ENV,
        timeout=60,
    )


# --- systemd-analyze verify ---------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("unit", instance_names())
def test_verify_is_clean(unit_root: Path, unit: str) -> None:
    """verify prints nothing about our units and succeeds (it exits 0 even on warnings)."""
    res = analyze("verify", f"--root={unit_root}", unit)
    out = (res.stdout + res.stderr).strip()
    ours = [line for line in out.splitlines() if "steadq" in line]
    assert not ours, "systemd-analyze verify complained:\n" + out
    assert res.returncode == 0, f"systemd-analyze verify exited {res.returncode}:\n{out}"


@needs_analyze
def test_verify_reports_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: an unknown key and a missing binary are both reported."""
    root = build_root(tmp_path / "root")
    worker = root / "usr/lib/systemd/system" / SERVICES["worker"]
    worker.write_text(worker.read_text().replace("[Service]\n", "[Service]\nNoSuchSetting=1\n", 1))
    res = analyze("verify", f"--root={root}", f"steadq-worker@{INSTANCE}.service")
    assert "NoSuchSetting" in res.stdout + res.stderr
    (root / "usr/bin/steadqd").unlink()
    res = analyze("verify", f"--root={root}", f"steadq-worker@{INSTANCE}.service")
    assert res.returncode != 0 and "/usr/bin/steadqd" in res.stdout + res.stderr


# --- what the units say --------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_service_contract(units: dict, role: str) -> None:
    """Each role runs `steadqd ROLE %i` as a notify service that systemd restarts sensibly."""
    u = units[SERVICES[role]]
    assert role in cli.ROLES
    assert single(u, "Service", "ExecStart") == f"/usr/bin/steadqd {role} %i"
    assert single(u, "Service", "Type") == "notify"
    assert single(u, "Service", "NotifyAccess") == "main"
    # A reload validates the file first (a failure sends no signal and fails the reload), then signals.
    assert values(u, "Service", "ExecReload") == ["/usr/bin/steadqd check-config %i", "/bin/kill -HUP $MAINPID"]
    assert timespan(single(u, "Service", "WatchdogSec")) >= 10
    assert single(u, "Service", "Restart") == "on-failure"
    assert timespan(single(u, "Service", "RestartSec")) > 0
    # A configuration error is the daemon's EX_CONFIG; restarting cannot fix it.
    assert str(EXIT_CONFIG) in words(u, "Service", "RestartPreventExitStatus")
    assert int(single(u, "Unit", "StartLimitBurst")) > 1
    assert timespan(single(u, "Unit", "StartLimitIntervalSec")) > 0
    assert single(u, "Service", "KillMode") == "mixed"
    assert timespan(single(u, "Service", "TimeoutStopSec")) > 0
    assert single(u, "Service", "User") == "steadq"
    assert single(u, "Service", "Group") == "steadq"
    assert not values(u, "Service", "DynamicUser"), "a dynamic user would lock producers out"
    assert single(u, "Service", "UMask") == "0007"
    assert single(u, "Service", "LimitCORE") == "0", "a core dump would hold the store's credentials"
    assert "%i" in single(u, "Unit", "Description")


COMMON_HARDENING = {
    "ProtectSystem": "strict",
    "ReadWritePaths": "/var/lib/steadq",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "PrivateIPC": "yes",
    "PrivateMounts": "yes",
    "RemoveIPC": "yes",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
}


@pytest.mark.parametrize("role", ROLES)
def test_hardening(units: dict, role: str) -> None:
    u = units[SERVICES[role]]
    for key, want in COMMON_HARDENING.items():
        if key == "ReadWritePaths":  # and the role locks (the worker: the doorbells' and job progress's too)
            extra = (
                ["-/run/steadq/doorbell", "-/run/steadq/roles", "-/run/steadq/progress"]
                if role == "worker"
                else ["-/run/steadq/roles"]
            )
            assert values(u, "Service", key) == [want, *extra]
            continue
        assert single(u, "Service", key) == want, f"{SERVICES[role]}: {key}="
    assert values(u, "Service", "SystemCallFilter")[0] == "@system-service"
    assert not values(u, "Service", "ProcSubset"), "ProcSubset=pid would hide /proc/sys/kernel/random/boot_id"
    assert not values(u, "Service", "AmbientCapabilities") or single(u, "Service", "AmbientCapabilities") == ""


def test_worker_exceptions_are_deliberate_and_commented(units: dict) -> None:
    """The worker leaves open exactly what job commands need, and says why next to it."""
    u = units[SERVICES["worker"]]
    path = UNITS / SERVICES["worker"]
    text = path.read_text()
    assert not values(u, "Service", "MemoryDenyWriteExecute"), "would break JIT runtimes in job commands"
    assert "MemoryDenyWriteExecute" in text and "JIT" in text
    assert words(u, "Service", "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert not values(u, "Service", "PrivateNetwork")
    assert values(u, "Service", "SystemCallFilter") == ["@system-service"]
    for prefix in (
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateDevices=",
        "CapabilityBoundingSet=",
        "RestrictNamespaces=",
    ):
        assert "drop-in" in comment_above(path, prefix), f"{prefix} needs a comment naming the drop-in override"
    assert "CAP_SETUID" in comment_above(path, "CapabilityBoundingSet=")
    assert "network" in comment_above(path, "RestrictAddressFamilies=")
    assert "KillMode=control-group" in comment_above(path, "KillMode=")


@pytest.mark.parametrize("role", ["sweeper", "promoter"])
def test_roles_without_jobs_are_locked_down_further(units: dict, role: str) -> None:
    u = units[SERVICES[role]]
    assert single(u, "Service", "MemoryDenyWriteExecute") == "yes"
    assert "~@privileged" in words(u, "Service", "SystemCallFilter")


def test_the_promoter_has_no_network_and_the_sweeper_only_ip_for_bucket_queues(units: dict) -> None:
    """The promoter never needs a network; a bucket queue's sweeper must reach its object store."""
    promoter = units[SERVICES["promoter"]]
    assert single(promoter, "Service", "PrivateNetwork") == "yes"
    assert single(promoter, "Service", "IPAddressDeny") == "any"
    assert single(promoter, "Service", "RestrictAddressFamilies") == "AF_UNIX"
    sweeper = units[SERVICES["sweeper"]]
    assert not values(sweeper, "Service", "PrivateNetwork")
    assert not values(sweeper, "Service", "IPAddressDeny")
    assert words(sweeper, "Service", "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}
    comment = comment_above(UNITS / SERVICES["sweeper"], "RestrictAddressFamilies=")
    assert "bucket" in comment and "drop-in" in comment


def _resolves(name: str) -> bool:
    """A steadq unit name as written in a dependency names a file we ship."""
    template = re.sub(r"@[^.]*\.", "@.", name)
    return (UNITS / name).exists() or (UNITS / template).exists()


def test_dependencies(units: dict) -> None:
    worker = units[SERVICES["worker"]]
    pulled = {"steadq-sweeper@%i.service", "steadq-promoter@%i.service"}
    assert pulled <= words(worker, "Unit", "Wants")
    assert pulled <= words(worker, "Unit", "After")
    assert not words(worker, "Unit", "Requires") & pulled, "a failed sweeper must not stop the jobs"
    assert pulled <= words(worker, "Unit", "PropagatesReloadTo")
    for role in ROLES:
        part_of = words(units[SERVICES[role]], "Unit", "PartOf")
        assert {"steadq@%i.target", "steadq.target"} <= part_of
        assert "/var/lib/steadq" in words(units[SERVICES[role]], "Unit", "RequiresMountsFor")
    assert "steadq-worker@%i.service" in words(units[SERVICES["sweeper"]], "Unit", "PartOf")
    assert {f"steadq-{r}@%i.service" for r in ROLES} <= words(units["steadq@.target"], "Unit", "Wants")
    for name, u in units.items():
        for section in u.values():
            for key, value in section:
                for word in value.split():
                    if word.startswith("steadq") and key in {
                        "Wants",
                        "After",
                        "PartOf",
                        "PropagatesReloadTo",
                        "WantedBy",
                    }:
                        assert _resolves(word), f"{name}: {key}={word} names no unit in units/"


def test_install_sections(units: dict) -> None:
    for name in (*SERVICES.values(), "steadq@.target"):
        assert values(units[name], "Install", "WantedBy") == ["steadq.target"], name
    assert values(units["steadq.target"], "Install", "WantedBy") == ["multi-user.target"]


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="systemctl is not installed")
def test_enable_links_instances_into_steadq_target(tmp_path: Path) -> None:
    """`systemctl enable` (offline, --root) creates the links the docs promise."""
    root = build_root(tmp_path / "root")
    res = subprocess.run(
        [
            "systemctl",
            f"--root={root}",
            "enable",
            "steadq.target",
            "steadq-worker@render.service",
            "steadq-sweeper@solo.service",
            "steadq@other.target",
        ],
        capture_output=True,
        text=True,
        env=TOOL_ENV,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    etc = root / "etc/systemd/system"
    # Targets may be spelled /lib/... or /usr/lib/... depending on the host's layout.
    links = {str(p.relative_to(etc)): os.path.basename(os.readlink(p)) for p in etc.rglob("*") if p.is_symlink()}
    assert links == {
        "multi-user.target.wants/steadq.target": "steadq.target",
        "steadq.target.wants/steadq-worker@render.service": "steadq-worker@.service",
        "steadq.target.wants/steadq-sweeper@solo.service": "steadq-sweeper@.service",
        "steadq.target.wants/steadq@other.target": "steadq@.target",
    }


# --- the two-phase stop ------------------------------------------------------------------------


def _exec_stop_argv() -> list[str]:
    value = single(read_unit(UNITS / SERVICES["worker"]), "Service", "ExecStop")
    # systemd's own unescaping of what we use: "$$" is a literal "$" (no ${VAR} expansion is used).
    assert re.search(r"(?<!\$)\$(?!\$)", value.replace("$$", "")) is None, (
        "ExecStop= must not rely on systemd expansion"
    )
    return shlex.split(value.replace("$$", "$"))


_DAEMON = """
import signal, sys, time
def term(*_):
    print("TERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
while True:
    time.sleep(3600)
"""


def test_exec_stop_signals_once_and_waits_for_exit() -> None:
    """Phase 1: exactly one SIGTERM to MAINPID, then it returns only after the daemon is gone."""
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON], stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "up\n"
        # systemd reaps its main process; here a thread does, or the zombie would look alive to `kill -0`.
        reaper = threading.Thread(target=daemon.wait, daemon=True)
        reaper.start()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MAINPID": str(daemon.pid)}
        res = subprocess.run(_exec_stop_argv(), env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        reaper.join(timeout=60)
        assert daemon.returncode == 0
        assert daemon.stdout.read() == "TERM\n"
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_exec_stop_without_main_pid_does_nothing() -> None:
    """After a crash systemd leaves MAINPID unset; the stop command must not fail or signal anything."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    res = subprocess.run(_exec_stop_argv(), env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stderr


# --- sysusers.d and tmpfiles.d --------------------------------------------------------------------


def _config_lines(path: Path) -> list[list[str]]:
    return [
        shlex.split(line)
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_sysusers_line() -> None:
    assert _config_lines(UNITS / "steadq.sysusers.conf") == [
        ["u", "steadq", "-", "SteadQ job queue", "/var/lib/steadq"]
    ]


def test_tmpfiles_line_never_ages_anything_out() -> None:
    lines = _config_lines(UNITS / "steadq.tmpfiles.conf")
    assert lines == [
        ["d", "/var/lib/steadq", "2770", "steadq", "steadq", "-"],
        ["d", "/run/steadq", "3770", "steadq", "steadq", "-"],
        ["d", "/run/steadq/doorbell", "3770", "steadq", "steadq", "-"],
        ["d", "/run/steadq/roles", "3770", "steadq", "steadq", "-"],
        ["d", "/run/steadq/progress", "0755", "steadq", "steadq", "-"],
    ]


@pytest.fixture
def spool_root(tmp_path: Path) -> Path:
    """A scratch root with the steadq user created by our sysusers.d file."""
    if shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None:
        pytest.skip("systemd-sysusers/systemd-tmpfiles are not installed")
    if os.geteuid() != 0:
        pytest.skip("creating files owned by another user needs root")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    res = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(UNITS / "steadq.sysusers.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return root


def _tmpfiles(root: Path, *actions: str) -> None:
    res = subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", *actions, str(UNITS / "steadq.tmpfiles.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


def _passwd_entry(root: Path, name: str) -> list[str]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields
    raise AssertionError(f"{name} not in {root}/etc/passwd")


def test_sysusers_creates_a_system_user_and_group(spool_root: Path) -> None:
    _, _, uid, gid, gecos, home, shell = _passwd_entry(spool_root, "steadq")
    assert int(uid) < 1000 and uid == gid, "a system user with its own group"
    assert (gecos, home) == ("SteadQ job queue", "/var/lib/steadq")
    assert shell.endswith("nologin")
    assert any(line.startswith(f"steadq:x:{gid}:") for line in (spool_root / "etc/group").read_text().splitlines())


def test_tmpfiles_creates_the_setgid_spool_and_never_cleans_it(spool_root: Path) -> None:
    _tmpfiles(spool_root, "--create")
    spool = spool_root / "var/lib/steadq"
    st = spool.stat()
    uid, gid = int(_passwd_entry(spool_root, "steadq")[2]), int(_passwd_entry(spool_root, "steadq")[3])
    assert stat.S_IMODE(st.st_mode) == 0o2770 and (st.st_uid, st.st_gid) == (uid, gid)
    # A job that has waited ten years is still a job: --clean/--remove must leave it alone.
    job = spool / "render/ready/0000/old.sqj"
    job.parent.mkdir(parents=True)
    job.write_bytes(b"x")
    ten_years_ago = time.time() - 10 * 365 * 86400
    for p in (job, job.parent, job.parent.parent, job.parent.parent.parent):
        os.utime(p, (ten_years_ago, ten_years_ago))
    spool.chmod(0o755)
    _tmpfiles(spool_root, "--create", "--clean", "--remove")
    assert job.read_bytes() == b"x"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o2770, "--create restores the mode"


# --- docs/security-units.md -------------------------------------------------------------------------


def _exposures(unit_root: Path, role: str) -> tuple[list[str], str]:
    res = analyze("security", "--offline=true", f"--root={unit_root}", f"steadq-{role}@{INSTANCE}.service")
    assert res.returncode == 0, res.stderr
    found = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("✗")]
    overall = next(line for line in res.stdout.splitlines() if line.startswith("→ Overall exposure level"))
    return found, overall


@needs_analyze
def test_security_doc_explains_every_exposure(unit_root: Path) -> None:
    """Every ✗ of `systemd-analyze security` is explained in the right part of the doc."""
    doc = (DOCS / "security-units.md").read_text().replace("\\|", "|")
    worker_part = doc[doc.index("Worker (`steadq-worker@.service`)") : doc.index("Sweeper and promoter (")]
    others_part = doc[doc.index("Sweeper and promoter (") :]
    for role, part in (("worker", worker_part), ("sweeper", others_part), ("promoter", others_part)):
        found, overall = _exposures(unit_root, role)
        assert found, f"{role}: parsed no exposures; did the output format change?"
        missing = [f for f in found if f"`{f}`" not in part]
        assert not missing, f"docs/security-units.md does not explain these {role} exposures: {missing}"
        assert overall in doc, f"the recorded score is stale; record: {overall}"


def test_security_doc_records_the_worker_table() -> None:
    doc = (DOCS / "security-units.md").read_text()
    assert "Overall exposure level for steadq-worker@demo.service" in doc
    assert doc.count("✗ ") >= 5 and "✓ NoNewPrivileges=" in doc


# --- docs/configuration.md --------------------------------------------------------------------------


def _allowed(text: str) -> set[str]:
    """The schema's own list of keys allowed at one place, from its unknown-key error."""
    with pytest.raises(ConfigError) as e:
        parse_config(text, path="probe.yaml", name="probe")
    m = re.search(r"allowed here: ([^)]*)\)", str(e.value))
    assert m, str(e.value)
    return set(m.group(1).split(", "))


def _schema() -> dict[str, set[str]]:
    w = "queue: /srv/q\nworker:\n  command: [x]\n"
    return {
        "": _allowed("queue: /srv/q\nzz_unknown: 1\n"),
        "worker": _allowed(w + "  zz_unknown: 1\n"),
        "worker.exit_status": _allowed(w + "  exit_status: {zz_unknown: 1}\n"),
        "worker.retry": _allowed(w + "  retry: {zz_unknown: 1}\n"),
        "sweeper": _allowed("queue: /srv/q\nsweeper: {zz_unknown: 1}\n"),
        "promoter": _allowed("queue: /srv/q\npromoter: {zz_unknown: 1}\n"),
        "s3": _allowed("queue: s3://bucket/q\ns3: {zz_unknown: 1}\n"),
    }


def _section(doc: str, heading: str) -> str:
    start = doc.index(heading)
    level = heading.split(" ", 1)[0] + " "
    nxt = [i for i in (doc.find("\n" + level, start + 1), doc.find("\n## ", start + 1)) if i != -1]
    return doc[start : min(nxt) if nxt else len(doc)]


def test_configuration_doc_documents_every_key() -> None:
    doc = (DOCS / "configuration.md").read_text()
    schema = _schema()
    assert schema[""] == {
        "queue",
        "allow_unsupported_fs",
        "metrics_textfile",
        "worker",
        "sweeper",
        "promoter",
        "inbox",
        "s3",
    }
    assert "## `queue` (top level)" in doc
    assert "## `allow_unsupported_fs` (top level)" in doc
    assert "## `metrics_textfile` (top level)" in doc
    for key in schema["worker"]:
        assert f"`worker.{key}`" in doc, f"worker.{key} is not documented"
    tables = {
        "worker.exit_status": _section(doc, "### `worker.exit_status`"),
        "worker.retry": _section(doc, "### `worker.retry`"),
        "sweeper": _section(doc, "## `sweeper:`"),
        "promoter": _section(doc, "## `promoter:`"),
        "s3": _section(doc, "## `s3:`"),
    }
    for where, text in tables.items():
        for key in schema[where]:
            assert f"| `{key}` |" in text, f"{where}.{key} has no row in its table"


def _table_defaults(section: str) -> dict[str, str]:
    """key -> the Default column of a `| Key | Type | Default | ...` table."""
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[2].startswith("`"):
            out[cells[0].strip("`")] = cells[2].strip("`")
    return out


def test_configuration_doc_defaults_match_the_code() -> None:
    doc = (DOCS / "configuration.md").read_text()
    expected = {
        "### `worker.retry`": RetrySettings(),
        "## `sweeper:`": SweeperConfig(),
        "## `promoter:`": PromoterConfig(),
    }
    for heading, defaults in expected.items():
        table = _table_defaults(_section(doc, heading))
        assert table, heading
        for key, shown in table.items():
            want = getattr(defaults, key)
            if isinstance(want, bool):
                assert shown == str(want).lower(), f"{heading} {key}"
            elif isinstance(want, int):
                assert int(shown.replace(",", "")) == want, f"{heading} {key}"
            else:
                assert parse_duration(shown) == pytest.approx(want), f"{heading} {key}"


def test_configuration_doc_examples_are_valid() -> None:
    """Every YAML example in the reference passes the real validator."""
    doc = (DOCS / "configuration.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        first = yaml.safe_load(block)
        if "queue" in first:
            text = block
        elif set(first) <= {"worker", "sweeper", "promoter"}:
            text = "queue: /var/lib/steadq/doc\n" + block
        else:  # a fragment of the worker section
            text = "queue: /var/lib/steadq/doc\nworker:\n  command: [/bin/true]\n" + "".join(
                "  " + line + "\n" for line in block.splitlines()
            )
        parse_config(text, path="configuration.md", name="doc")


def test_docs_exist_and_point_at_each_other() -> None:
    sec = (DOCS / "security-units.md").read_text()
    conf = (DOCS / "configuration.md").read_text()
    assert "docs/security-units.md" in conf and "docs/configuration.md" in sec
    for name in (*UNIT_FILES, "steadq.sysusers.conf", "steadq.tmpfiles.conf"):
        assert f"units/{name}" in sec, f"{name} is not listed in docs/security-units.md"


def _iter_unit_texts() -> Iterator[tuple[str, str]]:
    for name in UNIT_FILES:
        yield name, (UNITS / name).read_text()


def test_no_dynamic_user_or_state_directory() -> None:
    """StateDirectory= would chown the shared spool to the service user on every start."""
    for name, text in _iter_unit_texts():
        assert "\nDynamicUser=" not in text and "\nStateDirectory=" not in text, name
