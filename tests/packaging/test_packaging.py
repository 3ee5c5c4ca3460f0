"""The Debian package and the appliance bundle, built the way `make deb` / `make bundle` build them.

Why these tests exist: a package that builds is not yet a package that works. They check what an
administrator relies on and what no unit test of the library sees: the .deb contains the units,
sysusers.d/tmpfiles.d entries, console scripts, bash completion and no live queue file; its maintainer scripts enable
steadq.target but never a template, restart on upgrade, stop instances on removal and never
touch /var/lib/steadq; lintian has no errors; the packaged code runs a real queue round trip with
Debian's own python3-cffi/python3-yaml and the vendored inotify_simple. For the bundle: install.sh
into a scratch root produces a working private environment and units that point at it, and
uninstall.sh removes it while the spool survives.

Both artefacts are built once per session into pytest's temporary directory (never into the
checkout's dist/), by tests/package_builds.py, which tests/system/test_packages_e2e.py shares. The two builds take about 30 s together on the 2-core CI machine once the
build dependencies are installed (the first run on a fresh machine adds the apt-get install and
the PyPI downloads, well under the 3-minute budget), so they run by default.
STEADQ_PACKAGING_TESTS=0 skips the build tests; =1 makes a missing prerequisite a failure instead
of a skip. Installing the .deb on a real systemd (enable, upgrade, remove, reinstall) belongs to
the systemd test bed (issue 6); docs/packaging.md describes that cycle.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import package_builds
from tests.prereq import opted_out

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packaging"
SYSTEM_PYTHON = Path("/usr/bin/python3")
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

UNIT_FILES = sorted(p.name for p in (REPO / "units").iterdir() if p.suffix in (".service", ".target"))
TEMPLATES = [u for u in UNIT_FILES if "@" in u]

# A queue round trip through the public API: what a freshly installed package must be able to do.
SMOKE = r"""
import sys
import inotify_simple
from steadqd import Queue
print("inotify_simple", inotify_simple.__file__)
q = Queue.init(sys.argv[1], shards=4)
job_id = q.enqueue(b"packaged hello")
lease = q.lease()
assert lease is not None and lease.payload() == b"packaged hello", lease
q.ack(lease)
assert q.lease() is None
q.close()
print("roundtrip ok", job_id)
"""


def _mode() -> str:
    """'0' skip builds, '1' builds are mandatory, '' build when the machine can."""
    return os.environ.get("STEADQ_PACKAGING_TESTS", "").strip()


def _unavailable(reason: str) -> None:
    """Skip (default) or fail (STEADQ_PACKAGING_TESTS=1) when a build prerequisite is missing."""
    if _mode() == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _require_build_host() -> None:
    if _mode() == "0":
        opted_out("STEADQ_PACKAGING_TESTS=0")
    if shutil.which("dpkg-query") is None or not SYSTEM_PYTHON.exists():
        _unavailable("not a Debian system (no dpkg-query or /usr/bin/python3)")
    if os.geteuid() != 0:
        # The build scripts install missing build dependencies with apt-get, which needs root.
        _unavailable("packaging builds run as root (they may apt-get install build dependencies)")


def _run(
    cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run a command, failing the test with its output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def _clean_env(**extra: str) -> dict[str, str]:
    """Debian's tools only: no pyenv shims or virtualenv from the developer's PATH."""
    env = {"PATH": CLEAN_PATH, "HOME": os.environ.get("HOME", "/root"), "LC_ALL": "C.UTF-8"}
    env.update(extra)
    return env


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pyproject_version() -> str:
    m = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert m, "no version in pyproject.toml"
    return m.group(1)


def _deb_arch() -> str:
    """The package is Architecture: any (steadq-exec, the job commands' exec helper, is compiled)."""
    return subprocess.check_output(["dpkg", "--print-architecture"], text=True).strip()


# --------------------------------------------------------------------------------------------
# Static checks: no build needed, always run.
# --------------------------------------------------------------------------------------------


def test_vendored_inotify_simple_is_pristine() -> None:
    """The vendored module is byte-identical to the PyPI sdist recorded in its README and copyright."""
    vendor = PKG / "vendor" / "inotify_simple"
    readme = (vendor / "README.md").read_text()
    for name in ("inotify_simple.py", "LICENSE"):
        digest = _sha256(vendor / name)
        assert f"`{name}`" in readme and digest in readme, f"{name} changed without updating the README ({digest})"
    version = re.search(r"__version__ = '([^']+)'", (vendor / "inotify_simple.py").read_text())
    assert version and version.group(1) == "2.0.1"
    copyright_text = (PKG / "debian" / "copyright").read_text()
    assert "Files: packaging/vendor/inotify_simple/*" in copyright_text
    assert "2016 Chris Billington" in copyright_text and "License: BSD-2-Clause" in copyright_text


def test_dev_sh_installs_what_the_package_depends_on() -> None:
    """tests/system install the .deb into an offline root that sees the host's packages: on a fresh Debian
    the README's test command must bring its Depends (CI on a fresh machine lacked python3-systemd)."""
    script = (package_builds.REPO / "dev.sh").read_text()
    listed = re.search(r"^PACKAGE_DEPENDS=\(([^)]*)\)", script, re.M)
    assert listed is not None, "dev.sh: no PACKAGE_DEPENDS=(...) list"
    depends = package_builds.package_depends()
    assert {"python3-cffi", "python3-systemd", "python3-yaml"} <= set(depends)
    assert set(depends) <= set(listed.group(1).split())


def test_changelog_version_matches_pyproject() -> None:
    """build-deb.sh refuses a mismatch; catch it before anyone runs `make deb`."""
    first = (PKG / "debian" / "changelog").read_text().splitlines()[0]
    m = re.match(r"steadqd \(([^)]+)\) ", first)
    assert m, first
    assert re.split(r"[-+~]", m.group(1))[0] == _pyproject_version()


def test_every_unit_is_installed_by_the_package() -> None:
    """A unit added to units/ must not silently miss the .deb (the bundle copies units/* whole)."""
    lines = (PKG / "debian" / "steadqd.install").read_text().split("\n")
    for unit in UNIT_FILES:
        assert f"units/{unit} lib/systemd/system/" in lines, unit


def test_scripts_parse_with_posix_sh() -> None:
    """install.sh/uninstall.sh run under /bin/sh (dash on Debian): no bashisms that break parsing."""
    for script in ("install.sh", "uninstall.sh"):
        path = PKG / "bundle" / script
        assert path.read_text().startswith("#!/bin/sh\n")
        assert os.access(path, os.X_OK), f"{script} is not executable"
        _run(["sh", "-n", str(path)])
    for script in ("build-deb.sh", "build-bundle.sh"):
        assert os.access(PKG / script, os.X_OK)
        _run(["bash", "-n", str(PKG / script)])


def test_makefile_and_docs_name_the_commands() -> None:
    """`make deb` and `make bundle` are the documented entry points; keep Makefile and docs in step."""
    makefile = (REPO / "Makefile").read_text()
    for target in ("deb", "bundle", "clean-packaging"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    doc = (REPO / "docs" / "packaging.md").read_text()
    for phrase in (
        "make deb",
        "make bundle",
        "make clean-packaging",
        "lintian",
        "inotify_simple",
        "apt-get install ./",
        "install.sh",
        "uninstall.sh",
        "/var/lib/steadq",
    ):
        assert phrase in doc, phrase


# --------------------------------------------------------------------------------------------
# The Debian package.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DebBuild:
    deb: Path
    out: Path
    contents: str  # `dpkg-deb -c`
    control: Path  # extracted DEBIAN/ directory
    tree: Path  # extracted file system tree


@pytest.fixture(scope="session")
def deb_build(tmp_path_factory: pytest.TempPathFactory) -> DebBuild:
    """`packaging/build-deb.sh` (what `make deb` runs), the session's one build (tests/package_builds.py)."""
    _require_build_host()
    built = package_builds.build(tmp_path_factory, "build-deb.sh")
    if built.failure:
        pytest.fail(built.failure)
    base = tmp_path_factory.mktemp("deb")
    out = built.out
    debs = sorted(out.glob(f"steadqd_*_{_deb_arch()}.deb"))
    assert len(debs) == 1, debs
    deb = debs[0]
    contents = _run(["dpkg-deb", "-c", str(deb)]).stdout
    control = base / "DEBIAN"
    _run(["dpkg-deb", "-e", str(deb), str(control)])
    tree = base / "tree"
    _run(["dpkg-deb", "-x", str(deb), str(tree)])
    return DebBuild(deb=deb, out=out, contents=contents, control=control, tree=tree)


def _paths(contents: str) -> set[str]:
    """File names from `dpkg-deb -c` (last column, without the leading '.', links without target)."""
    names = set()
    for line in contents.splitlines():
        name = line.split(None, 5)[5].split(" -> ")[0]
        names.add(name[1:] if name.startswith("./") else name)
    return names


def test_deb_has_version_from_pyproject(deb_build: DebBuild) -> None:
    assert deb_build.deb.name == f"steadqd_{_pyproject_version()}_{_deb_arch()}.deb"


def test_lintian_reports_no_errors(deb_build: DebBuild) -> None:
    """build-deb.sh runs lintian --fail-on error; the saved report must show no E: line either."""
    report = (deb_build.out / "lintian.txt").read_text()
    errors = [line for line in report.splitlines() if line.startswith("E:")]
    assert errors == [], report


def test_deb_contents(deb_build: DebBuild) -> None:
    """Units, sysusers/tmpfiles, console scripts, bash completion, the example, docs the units link to, vendored module."""
    paths = _paths(deb_build.contents)
    expected = {f"/lib/systemd/system/{u}" for u in UNIT_FILES} | {
        "/usr/lib/sysusers.d/steadq.conf",
        "/usr/lib/tmpfiles.d/steadq.conf",
        "/usr/bin/steadqd",
        "/usr/bin/steadq",
        # The example is documentation, not a live queue config (it names no real queue or command).
        "/usr/share/doc/steadqd/examples/example.yaml",
        "/usr/share/bash-completion/completions/steadq",
        # Uncompressed: the units' Documentation= links point at these exact names.
        "/usr/share/doc/steadqd/configuration.md",
        "/usr/share/doc/steadqd/security-units.md",
        "/usr/share/doc/steadqd/packaging.md",
        "/usr/share/doc/steadqd/copyright",
        "/usr/share/man/man1/steadq.1.gz",
        "/usr/share/man/man1/steadqd.1.gz",
        "/usr/share/steadqd/vendor/inotify_simple.py",
        "/usr/share/steadqd/monitoring/steadqd-alerts.yml",  # issue 34 #3: tests/packaging/test_monitoring.py
        "/usr/share/steadqd/monitoring/steadqd-grafana.json",
        "/usr/lib/python3/dist-packages/steadqd-vendor.pth",
        "/usr/lib/python3/dist-packages/steadqd/backend.py",
        "/usr/lib/python3/dist-packages/steadqd/fs/handle.py",
        "/usr/lib/python3/dist-packages/steadqd/cli/main.py",
        "/usr/lib/python3/dist-packages/steadqd/daemon/main.py",
        "/usr/lib/python3/dist-packages/steadqd/daemon/worker/run/steadq-exec",
    }
    assert expected <= paths, sorted(expected - paths)
    # The compiled job spawn (cffi, steadqd/daemon/worker/run/spawn.c): without it every job takes two execs.
    run_dir = "/usr/lib/python3/dist-packages/steadqd/daemon/worker/run/"
    assert any(p.startswith(run_dir + "_fastspawn.") and p.endswith(".so") for p in paths), sorted(
        p for p in paths if p.startswith(run_dir)
    )
    # The C core (cffi, steadqd/fs/compiled/*.c, libcrypto): without it claims and acks run in pure Python.
    core_dir = "/usr/lib/python3/dist-packages/steadqd/fs/compiled/"
    assert any(p.startswith(core_dir + "_core.") and p.endswith(".so") for p in paths), sorted(
        p for p in paths if p.startswith(core_dir)
    )
    # The spool is created by tmpfiles.d, never shipped: dpkg would otherwise own (and on removal
    # try to delete) the directory that holds the queues.
    assert not any(p.startswith("/var/lib/steadq") for p in paths)
    assert not any("__pycache__" in p for p in paths), "byte code is compiled at install time"
    assert not any(p.startswith("/etc/steadq/queues/") and p.endswith(".yaml") for p in paths)
    completion = (deb_build.tree / "usr/share/bash-completion/completions/steadq").read_text()
    assert "-F _steadq steadq" in completion, completion[-300:]
    # The units documentation links resolve inside the package.
    for unit in UNIT_FILES:
        text = (deb_build.tree / "lib/systemd/system" / unit).read_text()
        for target in re.findall(r"file:(/\S+)", text):
            assert (deb_build.tree / target.lstrip("/")).is_file(), f"{unit}: {target}"


def test_deb_ships_units_and_system_files_unchanged(deb_build: DebBuild) -> None:
    """The package installs exactly what tests/systemd_units verified (no copy that can drift)."""
    for unit in UNIT_FILES:
        assert (deb_build.tree / "lib/systemd/system" / unit).read_bytes() == (REPO / "units" / unit).read_bytes()
    assert (deb_build.tree / "usr/lib/sysusers.d/steadq.conf").read_bytes() == (
        REPO / "units/steadq.sysusers.conf"
    ).read_bytes()
    assert (deb_build.tree / "usr/lib/tmpfiles.d/steadq.conf").read_bytes() == (
        REPO / "units/steadq.tmpfiles.conf"
    ).read_bytes()
    assert (deb_build.tree / "usr/share/doc/steadqd/examples/example.yaml").read_bytes() == (
        REPO / "etc/steadq/queues/example.yaml"
    ).read_bytes()


def test_deb_conffile_and_dependencies(deb_build: DebBuild) -> None:
    conffiles = deb_build.control / "conffiles"
    assert not conffiles.exists() or conffiles.read_text().split() == [], conffiles.read_text()
    control = (deb_build.control / "control").read_text()
    depends = re.search(r"^Depends: (.*)$", control, re.M)
    assert depends, control
    names = {d.strip().split()[0] for d in depends.group(1).split(",")}
    assert {"python3-systemd", "python3-cffi", "python3-yaml"} <= names
    # The C claim core links OpenSSL's libcrypto: dh_shlibdeps names the runtime library (libssl3 on Debian 12).
    assert any(n.startswith("libssl") for n in names), names
    assert not any("inotify" in n for n in names), "Debian 12 has no python3-inotify-simple: it is vendored"
    # any, not all: steadq-exec, the job commands' exec helper (steadqd/daemon/worker/run/exec_helper.c), is compiled
    assert re.search(rf"^Architecture: {_deb_arch()}$", control, re.M)


def test_deb_maintainer_scripts(deb_build: DebBuild) -> None:
    """Enable steadq.target only, user before spool, restart on upgrade, stop on remove, keep the spool."""
    postinst = (deb_build.control / "postinst").read_text()
    enabled = re.findall(r"deb-systemd-helper enable '([^']+)'", postinst)
    assert enabled == ["steadq.target"], enabled
    for template in TEMPLATES:
        assert template not in postinst, f"template {template} must not be touched by postinst"
    sysusers = postinst.index("systemd-sysusers")
    tmpfiles = postinst.index("systemd-tmpfiles")
    assert sysusers < tmpfiles, "the steadq user must exist before tmpfiles.d gives it /var/lib/steadq"
    assert "_dh_action=restart" in postinst and "deb-systemd-invoke $_dh_action 'steadq.target'" in postinst
    assert re.search(r"py3compile -p steadqd(:\S+)? /usr/share/steadqd", postinst), postinst  # :ARCH, Architecture: any

    prerm = (deb_build.control / "prerm").read_text()
    assert "deb-systemd-invoke stop 'steadq.target'" in prerm
    assert "'steadq-worker@*.service'" in prerm
    assert not (deb_build.control / "preinst").exists() or "stop" not in (deb_build.control / "preinst").read_text(), (
        "with --restart-after-upgrade nothing is stopped before unpacking"
    )

    postrm = (deb_build.control / "postrm").read_text()
    assert "/var/lib/steadq" in postrm  # the purge message says it stays
    for script in ("postinst", "prerm", "postrm"):
        text = (deb_build.control / script).read_text()
        assert not re.search(r"rm\s+-[a-z]*r[a-z]*\s+\S*/var/lib/steadq", text), f"{script} deletes the spool"
        _run(["sh", "-n", str(deb_build.control / script)])


def test_cockpit_deb_ships_the_page_unchanged(deb_build: DebBuild, tmp_path: Path) -> None:
    """cockpit-steadq (issue 34 #1): built next to steadqd, Architecture: all, the four page files as they are."""
    debs = sorted(deb_build.out.glob(f"cockpit-steadq_{_pyproject_version()}_all.deb"))
    assert len(debs) == 1, sorted(p.name for p in deb_build.out.iterdir())
    control = _run(["dpkg-deb", "-f", str(debs[0]), "Architecture", "Depends", "Version"]).stdout
    assert "Architecture: all\n" in control, control
    depends = re.search(r"^Depends: (.*)$", control, re.M)
    assert depends, control
    names = [d.strip().split()[0] for d in depends.group(1).split(",")]
    assert names == ["cockpit-bridge", "steadqd"], names
    assert f"steadqd (>= {_pyproject_version()})" in depends.group(1), "the page reads this version's --json keys"
    page = sorted(p.name for p in (REPO / "cockpit").iterdir())
    shipped = {p for p in _paths(_run(["dpkg-deb", "-c", str(debs[0])]).stdout) if not p.endswith("/")}
    assert shipped == {f"/usr/share/cockpit/steadq/{name}" for name in page} | {
        "/usr/share/doc/cockpit-steadq/changelog.gz",
        "/usr/share/doc/cockpit-steadq/copyright",
        "/usr/share/lintian/overrides/cockpit-steadq",
    }, sorted(shipped)
    tree = tmp_path / "tree"
    _run(["dpkg-deb", "-x", str(debs[0]), str(tree)])
    for name in page:
        assert (tree / "usr/share/cockpit/steadq" / name).read_bytes() == (REPO / "cockpit" / name).read_bytes()
    assert not any("cockpit" in p for p in _paths(deb_build.contents)), "the page is not in steadqd's .deb"
    # lintian ran on both packages: nothing about cockpit-steadq but the overridden tag (masked as O:).
    report = (deb_build.out / "lintian.txt").read_text()
    tags = [line for line in report.splitlines() if re.match(r"^[EWIP]: cockpit-steadq", line)]
    assert tags == [], tags


def test_deb_vendored_inotify_simple_is_found_through_the_pth(deb_build: DebBuild) -> None:
    pth = (deb_build.tree / "usr/lib/python3/dist-packages/steadqd-vendor.pth").read_text().split()
    assert pth == ["/usr/share/steadqd/vendor"]
    assert (deb_build.tree / "usr/share/steadqd/vendor/inotify_simple.py").read_bytes() == (
        PKG / "vendor/inotify_simple/inotify_simple.py"
    ).read_bytes()


def test_deb_code_runs_with_debian_python_and_dependencies(deb_build: DebBuild, tmp_path: Path) -> None:
    """The packaged library and scripts work with Debian's python3, python3-cffi and python3-yaml.

    The tree is only extracted, not installed, so the .pth (an absolute /usr/share path) is
    replaced by PYTHONPATH entries for the same two directories.
    """
    site = deb_build.tree / "usr/lib/python3/dist-packages"
    vendor = deb_build.tree / "usr/share/steadqd/vendor"
    env = _clean_env(PYTHONPATH=f"{site}:{vendor}", PYTHONDONTWRITEBYTECODE="1")
    out = _run([str(SYSTEM_PYTHON), "-c", SMOKE, str(tmp_path / "q")], env=env).stdout
    assert f"inotify_simple {vendor}/inotify_simple.py" in out, out
    assert "roundtrip ok" in out
    for script in ("steadqd", "steadq"):
        path = deb_build.tree / "usr/bin" / script
        assert path.read_text().startswith("#!/usr/bin/python3\n")
        assert f"usage: {script}" in _run([str(path), "--help"], env=env).stdout


def test_deb_ships_every_man_page_and_completion(deb_build: DebBuild) -> None:
    """Each page of man/ as written, and completion for both programs in bash, zsh and fish,
    generated by the packaged programs (a script that failed to import would leave them empty)."""
    import gzip

    for page in sorted((REPO / "man").glob("*.[15]")):
        shipped = deb_build.tree / f"usr/share/man/man{page.suffix[1:]}/{page.name}.gz"
        assert gzip.decompress(shipped.read_bytes()) == page.read_bytes(), page.name
    share = deb_build.tree / "usr/share"
    for prog in ("steadq", "steadqd"):
        for path in (
            share / "bash-completion/completions" / prog,
            share / "zsh/vendor-completions" / f"_{prog}",
            share / "fish/vendor_completions.d" / f"{prog}.fish",
        ):
            assert f"complete -c {prog}" in path.read_text() or f"_{prog}()" in path.read_text(), path


# --------------------------------------------------------------------------------------------
# The appliance bundle.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bundle:
    tarball: Path
    unpacked: Path  # the bundle's top directory


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """`packaging/build-bundle.sh` (what `make bundle` runs), the session's one build (tests/package_builds.py)."""
    _require_build_host()
    built = package_builds.build(tmp_path_factory, "build-bundle.sh")
    if built.failure:
        pytest.fail(built.failure)
    base = tmp_path_factory.mktemp("bundle")
    tarballs = sorted(built.out.glob("steadqd-bundle-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    unpack = base / "unpacked"
    unpack.mkdir()
    with tarfile.open(tarballs[0]) as tf:
        tf.extractall(unpack, filter="tar")
    (top,) = list(unpack.iterdir())
    return Bundle(tarball=tarballs[0], unpacked=top)


@pytest.fixture
def fake_root(tmp_path: Path, bundle: Bundle) -> Iterator[Path]:
    """An empty file system root that has the interpreter the bundle was built for, as a target has."""
    if shutil.which("systemctl") is None or shutil.which("systemd-sysusers") is None:
        _unavailable("systemctl/systemd-sysusers missing: install.sh needs systemd")
    manifest = (bundle.unpacked / "MANIFEST").read_text()
    pyver = re.search(r"^PYTHON_VERSION=(\S+)$", manifest, re.M)
    assert pyver, manifest
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / f"usr/bin/python{pyver.group(1)}").symlink_to(f"/usr/bin/python{pyver.group(1)}")
    yield root


def _install(bundle: Bundle, root: Path) -> str:
    return _run([str(bundle.unpacked / "install.sh"), "--root", str(root)], env=_clean_env()).stdout


def test_bundle_name_and_manifest(bundle: Bundle) -> None:
    """Name carries version and architecture; MANIFEST names the interpreter the build used."""
    arch = os.uname().machine
    assert bundle.tarball.name == f"steadqd-bundle-{_pyproject_version()}-{arch}.tar.gz"
    manifest = (bundle.unpacked / "MANIFEST").read_text()
    sysver = _run([str(SYSTEM_PYTHON), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    assert f"PYTHON_VERSION={sysver}\n" in manifest
    assert "(/usr/bin/python3)" in manifest, "built with Debian's python3, not pyenv or a virtualenv"
    for pkg in ("cffi==", "PyYAML==", "inotify-simple==", "systemd-python==", "steadqd=="):
        assert pkg in manifest, pkg
    names = set(os.listdir(bundle.unpacked))
    assert {
        "install.sh",
        "uninstall.sh",
        "units",
        "venv",
        "steadq.sysusers.conf",
        "steadq.tmpfiles.conf",
        "README.txt",
        "licenses",
        "cockpit",
    } <= names
    assert sorted(os.listdir(bundle.unpacked / "units")) == UNIT_FILES
    # The compiled job spawn (cffi): built into the bundle's steadqd like the deb's.
    spawn = list((bundle.unpacked / "venv").glob("lib/python3*/site-packages/steadqd/daemon/worker/run/_fastspawn*.so"))
    assert len(spawn) == 1, spawn
    core = list((bundle.unpacked / "venv").glob("lib/python3*/site-packages/steadqd/fs/compiled/_core*.so"))
    assert len(core) == 1, core


COCKPIT_PAGE = "usr/share/cockpit/steadq"
PAGE_FILES = sorted(p.name for p in (REPO / "cockpit").iterdir())


def _assert_page_installed(root: Path) -> None:
    """The page in ``root`` is exactly cockpit/: the same names, the same bytes, world-readable."""
    page = root / COCKPIT_PAGE
    assert sorted(p.name for p in page.iterdir()) == PAGE_FILES
    for name in PAGE_FILES:
        assert (page / name).read_bytes() == (REPO / "cockpit" / name).read_bytes(), name
        assert oct((page / name).stat().st_mode & 0o777) == oct(0o644), name


def test_bundle_carries_the_cockpit_page_unchanged(bundle: Bundle) -> None:
    """The tarball's cockpit/ is the source tree's cockpit/, byte for byte (issue 34: the page in the bundle)."""
    with tarfile.open(bundle.tarball) as tf:
        members = {
            m.name.split("/", 2)[2]: m for m in tf.getmembers() if m.isfile() and m.name.split("/")[1:2] == ["cockpit"]
        }
        assert sorted(members) == PAGE_FILES, sorted(members)
        for name, member in members.items():
            f = tf.extractfile(member)
            assert f is not None
            assert f.read() == (REPO / "cockpit" / name).read_bytes(), name


def test_bundle_install_run_uninstall(bundle: Bundle, fake_root: Path, tmp_path: Path) -> None:
    """install.sh into a scratch root: working environment, rewritten units, user, spool; uninstall keeps the spool."""
    out = _install(bundle, fake_root)
    assert "installing steadqd" in out
    # No Cockpit in this root: its page is skipped, in one line, and nothing is written for it.
    skipped = [line for line in out.splitlines() if "Cockpit" in line]
    assert skipped == ['install.sh: Cockpit not found (no cockpit-bridge): its page "Job queues" is skipped'], out
    assert not (fake_root / "usr/share/cockpit").exists()
    prefix = fake_root / "opt/steadq"

    # The private environment runs and is isolated from the host's site-packages.
    steadqd = prefix / "bin/steadqd"
    assert "usage: steadqd" in _run([str(steadqd), "--help"], env=_clean_env()).stdout
    assert "usage: steadq" in _run([str(prefix / "bin/steadq"), "--help"], env=_clean_env()).stdout
    smoke = _run([str(prefix / "bin/python"), "-I", "-c", SMOKE, str(tmp_path / "q")], env=_clean_env()).stdout
    assert f"inotify_simple {prefix}/lib/python" in smoke and "roundtrip ok" in smoke, smoke
    journal = _run(
        [str(prefix / "bin/python"), "-I", "-c", "import systemd.journal, sys; print(systemd.journal.__file__)"],
        env=_clean_env(),
    ).stdout
    assert journal.startswith(str(prefix)), journal
    monitoring = prefix / "share/steadq/monitoring"
    assert sorted(p.name for p in monitoring.iterdir()) == ["steadqd-alerts.yml", "steadqd-grafana.json"]

    # Units point at the prefix, and only steadq.target is enabled.
    units = fake_root / "etc/systemd/system"
    for unit in UNIT_FILES:
        text = (units / unit).read_text()
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                assert line.startswith("ExecStart=/opt/steadq/bin/steadqd "), line
            if line.startswith("ExecReload=") and "steadqd" in line:
                assert line.startswith("ExecReload=/opt/steadq/bin/steadqd check-config "), line
        assert "file:/usr/share/doc" not in text
    wants = {p.relative_to(units).as_posix() for p in units.glob("*.wants/*")}
    assert wants == {"multi-user.target.wants/steadq.target"}, wants
    assert (fake_root / "etc/sysusers.d/steadq.conf").is_file()
    assert (fake_root / "etc/tmpfiles.d/steadq.conf").is_file()
    assert (prefix / "share/steadq/examples/example.yaml").is_file()
    for page in sorted((REPO / "man").glob("*.[15]")):
        assert (prefix / f"share/man/man{page.suffix[1:]}" / page.name).read_bytes() == page.read_bytes()
    assert "complete -F _steadqd steadqd" in (prefix / "share/bash-completion/completions/steadqd").read_text()
    assert (prefix / "share/zsh/vendor-completions/_steadq").read_text().startswith("#compdef steadq")
    assert "complete -c steadq " in (prefix / "share/fish/vendor_completions.d/steadq.fish").read_text()
    assert (fake_root / "etc/steadq/queues").is_dir() and not list((fake_root / "etc/steadq/queues").iterdir())
    assert os.readlink(fake_root / "usr/local/bin/steadqd") == "/opt/steadq/bin/steadqd"

    # systemd-sysusers created the user in the root, systemd-tmpfiles the spool for it.
    passwd = {line.split(":")[0]: line.split(":") for line in (fake_root / "etc/passwd").read_text().splitlines()}
    assert "steadq" in passwd
    spool = fake_root / "var/lib/steadq"
    st = spool.stat()
    assert oct(st.st_mode & 0o7777) == oct(0o2770)
    assert st.st_uid == int(passwd["steadq"][2])

    # Re-running install.sh is an in-place upgrade and keeps the admin's queue files.
    (fake_root / "etc/steadq/queues/render.yaml").write_text("# written by the admin\n")
    _install(bundle, fake_root)
    assert (fake_root / "etc/steadq/queues/render.yaml").read_text() == "# written by the admin\n"
    assert "usage: steadqd" in _run([str(steadqd), "--help"], env=_clean_env()).stdout

    # Uninstall from the installed copy: prefix, units, links gone; queues and user stay.
    queue_dir = spool / "render"
    queue_dir.mkdir()
    (queue_dir / "marker").write_text("a queued job\n")
    _run([str(prefix / "share/steadq/uninstall.sh"), "--root", str(fake_root)], env=_clean_env())
    assert not prefix.exists()
    for unit in UNIT_FILES:
        assert not (units / unit).exists(), unit
    assert not list(units.glob("*.wants/*"))
    assert not (fake_root / "usr/local/bin/steadqd").is_symlink()
    assert not (fake_root / "etc/sysusers.d/steadq.conf").exists()
    assert (queue_dir / "marker").read_text() == "a queued job\n"
    assert "steadq:" in (fake_root / "etc/passwd").read_text()
    assert (fake_root / "etc/steadq/queues/render.yaml").exists()


def test_bundle_installs_the_cockpit_page_where_cockpit_is(bundle: Bundle, fake_root: Path) -> None:
    """With cockpit-bridge in the root the page lands; an upgrade replaces it whole; a reinstall after
    Cockpit went removes it; uninstall.sh removes it."""
    bridge = fake_root / "usr/bin/cockpit-bridge"
    bridge.write_text("#!/bin/sh\n")  # a stand-in: install.sh only looks for it
    bridge.chmod(0o755)
    out = _install(bundle, fake_root)
    assert f'install.sh: Cockpit found: installed the page "Job queues" into /{COCKPIT_PAGE}' in out, out
    _assert_page_installed(fake_root)
    listed = (fake_root / "opt/steadq/share/steadq/installed-files").read_text().splitlines()
    assert {f"/{COCKPIT_PAGE}/{name}" for name in PAGE_FILES} <= set(listed), listed

    # Upgrade: the page is replaced as a whole (an edited file restored, a stray one gone).
    page = fake_root / COCKPIT_PAGE
    (page / "steadq.js").write_text("// edited on the target\n")
    (page / "old-version.js").write_text("// a file an older page had\n")
    _install(bundle, fake_root)
    _assert_page_installed(fake_root)

    # Cockpit removed since: the next install.sh skips the page and takes its own copy away.
    bridge.unlink()
    out = _install(bundle, fake_root)
    assert 'its page "Job queues" is skipped' in out, out
    assert not page.exists()
    assert f"/{COCKPIT_PAGE}/manifest.json" not in (fake_root / "opt/steadq/share/steadq/installed-files").read_text()

    # Cockpit back: installed again; uninstall.sh removes it, and nothing of Cockpit's own.
    bridge.write_text("#!/bin/sh\n")
    bridge.chmod(0o755)
    _install(bundle, fake_root)
    _assert_page_installed(fake_root)
    _run([str(fake_root / "opt/steadq/share/steadq/uninstall.sh"), "--root", str(fake_root)], env=_clean_env())
    assert not page.exists()
    assert (fake_root / "usr/share/cockpit").is_dir() and bridge.exists()


def test_bundle_leaves_a_cockpit_page_it_did_not_install_alone(bundle: Bundle, fake_root: Path) -> None:
    """The cockpit-steadq .deb's page (a directory not in installed-files) is neither overwritten nor removed."""
    (fake_root / "usr/share/cockpit/base1").mkdir(parents=True)  # cockpit-bridge's own page directory
    page = fake_root / COCKPIT_PAGE
    page.mkdir()
    (page / "manifest.json").write_text('{"from": "the cockpit-steadq package"}\n')
    proc = _run([str(bundle.unpacked / "install.sh"), "--root", str(fake_root)], env=_clean_env())
    assert "is not from this bundle (the cockpit-steadq package?); left alone" in proc.stderr, proc.stderr
    assert "Cockpit found" not in proc.stdout, proc.stdout
    assert sorted(os.listdir(page)) == ["manifest.json"]
    assert "/usr/share/cockpit" not in (fake_root / "opt/steadq/share/steadq/installed-files").read_text()
    _run([str(fake_root / "opt/steadq/share/steadq/uninstall.sh"), "--root", str(fake_root)], env=_clean_env())
    assert (page / "manifest.json").read_text() == '{"from": "the cockpit-steadq package"}\n'


def test_bundle_refuses_foreign_prefix_and_missing_python(bundle: Bundle, fake_root: Path) -> None:
    """install.sh never overwrites a directory it did not create and says what interpreter it needs."""
    foreign = fake_root / "opt/steadq"
    foreign.mkdir(parents=True)
    (foreign / "something").write_text("not ours\n")
    proc = subprocess.run(
        [str(bundle.unpacked / "install.sh"), "--root", str(fake_root)],
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    assert proc.returncode != 0 and "not a steadq bundle installation" in proc.stderr, proc.stderr
    assert (foreign / "something").read_text() == "not ours\n"

    bare = fake_root.parent / "bare"
    bare.mkdir()
    proc = subprocess.run(
        [str(bundle.unpacked / "install.sh"), "--root", str(bare)], capture_output=True, text=True, env=_clean_env()
    )
    assert proc.returncode != 0 and "needs Python" in proc.stderr, proc.stderr
    assert not (bare / "opt").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
