#!/usr/bin/env bash
# One entry point for people and CI.
#   ./dev.sh demo   install everything, then run the demo queue under ./var/
#   ./dev.sh test   install everything, then run the test suite
# Installs Debian packages only when missing (needs root for that), then a
# project virtualenv in .venv with the package in editable mode.
set -euo pipefail
cd "$(dirname "$0")"

DEB_PACKAGES=(gcc pkg-config libsystemd-dev libffi-dev e2fsprogs xfsprogs btrfs-progs util-linux)

install_system_packages() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    local wanted=("${DEB_PACKAGES[@]}")
    python3 -c 'import venv, ensurepip' 2>/dev/null || wanted+=(python3-venv)
    # shellcheck source=packaging/apt-ensure.sh
    . packaging/apt-ensure.sh
    apt_ensure dev.sh "${wanted[@]}"
}

setup() {
    install_system_packages
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
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
        exec .venv/bin/python -m pytest -q "$@"
        ;;
    setup)
        setup
        ;;
    *)
        echo "usage: ./dev.sh demo|test|setup [args]" >&2
        exit 2
        ;;
esac
