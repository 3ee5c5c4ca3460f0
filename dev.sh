#!/usr/bin/env bash
# One entry point for people and CI.
#   ./dev.sh demo   install everything, then run the demo queue under ./var/ (--s3: on a bucket, embedded SeaweedFS)
#   ./dev.sh test   install everything, run the static checks, then the test suite
#   ./dev.sh check  the static checks alone: ruff check, ruff format --check, mypy, lint-imports
#   ./dev.sh mutate the mutation run (mutmut, niced; --sample 5 ~8 min; docs/testing.md), not part of test
#   ./dev.sh test-ceph  the Ceph RGW suite alone (pytest -m ceph; also part of test; docs/testing.md)
# Installs Debian packages only when missing (needs root for that), then a
# project virtualenv in .venv with the package in editable mode.
set -euo pipefail
cd "$(dirname "$0")"

# zsh, fish, groff-base and man-db: tests/cli drive the completion scripts and check the man pages.
# systemd-journal-remote: tests/cli/test_history.py writes real journal files with it (no journald needed).
# libssl-dev: the editable install builds the C claim core (steadqd/fs/compiled, OpenSSL SHA-256), and
# tests/test_ccore_bench.py builds benchmarks/ccore (the earlier C envelope core) to run it against the Python.
DEB_PACKAGES=(gcc pkg-config libsystemd-dev libffi-dev libssl-dev e2fsprogs xfsprogs btrfs-progs util-linux zsh fish groff-base man-db
    systemd-journal-remote)
# tests/stowq/ceph.py runs a mon, a memstore OSD and radosgw as plain processes; no recommends (ceph-base's
# would bring ceph-mds and a time daemon such as chrony, neither wanted on a test machine).
CEPH_PACKAGES=(ceph-mon ceph-osd radosgw)
# promtool: tests/packaging/test_monitoring.py checks and unit-tests the shipped alert rules. Debian has it only
# in the prometheus package (19 MB download, 96 MB installed, no other package ships it); its postinst enables the
# Prometheus server's unit too, which on a machine booted with systemd then listens on :9090 (stop it if unwanted).
MONITORING_PACKAGES=(prometheus)
# tests/system/test_cockpit_e2e.py: the offline test root sees the host's packages, so Cockpit (small: 14 packages
# with --no-install-recommends) and the browser that drives its page (chromium with chromium-driver, ~300 MB
# installed) must be on the host. cockpit-ws's postinst enables cockpit.socket; the test root starts it itself.
# dbus: that root runs its own system bus (as every machine with Cockpit does), for a user's `systemctl is-active`.
COCKPIT_PACKAGES=(cockpit-ws cockpit-bridge cockpit-system dbus chromium chromium-driver)
# tests/system install the .deb into an offline root that sees the host's packages, so its Depends must be on the
# host (tests/system/test_packages_e2e.py, HOST_DEPENDENCIES); a fresh Debian 12 lacks python3-systemd.
PACKAGE_DEPENDS=(python3-systemd python3-cffi python3-yaml)

install_system_packages() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    local wanted=("${DEB_PACKAGES[@]}" "${PACKAGE_DEPENDS[@]}")
    python3 -c 'import venv, ensurepip' 2>/dev/null || wanted+=(python3-venv)
    # shellcheck source=packaging/apt-ensure.sh
    . packaging/apt-ensure.sh
    apt_ensure dev.sh "${wanted[@]}"
    apt_ensure dev.sh --no-install-recommends "${CEPH_PACKAGES[@]}"
    apt_ensure dev.sh --no-install-recommends "${MONITORING_PACKAGES[@]}"
    apt_ensure dev.sh --no-install-recommends "${COCKPIT_PACKAGES[@]}"
}

setup() {
    install_system_packages
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
}

# The static checks CI enforces: lint, formatting, types, and the import layers
# (pyproject.toml's import-linter contracts; docs/architecture.md draws them).
static_checks() {
    local failed=0
    .venv/bin/ruff check --quiet . || failed=1
    .venv/bin/ruff format --check --quiet . || { echo "dev.sh: run '.venv/bin/ruff format .'" >&2; failed=1; }
    .venv/bin/mypy || failed=1
    local layers
    layers=$(.venv/bin/lint-imports --no-cache 2>&1) || { printf '%s\n' "$layers" >&2; failed=1; }
    [ "$failed" = 0 ] || { echo "dev.sh: static checks failed (see above)" >&2; return 1; }
    echo "static checks: ruff, ruff format, mypy, import layers: all passed"
}

case "${1:-}" in
    demo)
        shift
        setup
        exec .venv/bin/steadqd demo "$@"
        ;;
    test)
        shift
        setup
        static_checks
        # Two worker processes, one per core; tests that must share one worker carry an xdist_group
        # (tests/conftest.py). The 30 slowest tests in every log: where the suite's time goes
        # (docs/testing.md, "Suite time").
        exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=30 "$@"
        ;;
    check)
        shift
        setup
        static_checks
        ;;
    mutate)
        shift
        setup
        exec nice -n 19 .venv/bin/python -m tests.mutation "$@"
        ;;
    test-ceph)
        shift
        setup
        exec .venv/bin/python -m pytest -q -m ceph tests/stowq "$@"
        ;;
    setup)
        setup
        ;;
    *)
        echo "usage: ./dev.sh demo|test|check|mutate|test-ceph|setup [args]" >&2
        exit 2
        ;;
esac
