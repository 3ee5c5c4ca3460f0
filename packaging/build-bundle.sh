#!/usr/bin/env bash
# Build the offline appliance bundle (`make bundle`):
#   dist/steadqd-bundle-<version>-<arch>.tar.gz
#
#   packaging/build-bundle.sh [--out DIR] [--work DIR]
#
# The tarball holds a private, relocatable Python environment (steadqd and the wheels it needs:
# cffi, PyYAML, inotify_simple, systemd-python, installed into venv/lib/pythonX.Y/site-packages
# and byte-compiled), the units, the sysusers.d/tmpfiles.d files, the example configuration, the
# docs, the Cockpit page (cockpit/: install.sh installs it where Cockpit is) and install.sh /
# uninstall.sh (packaging/bundle/). It is built with Debian's own
# /usr/bin/python3, never a pyenv or virtualenv interpreter, because the target runs the
# packages with its /usr/bin/python3.X: compiled modules (cffi's backend, PyYAML's _yaml,
# systemd's _journal) only load into the same minor version, which MANIFEST records and
# install.sh checks. Wheels come from PyPI (systemd-python has no wheels: it is compiled here
# against libsystemd-dev; at run time it needs libsystemd0, which every systemd system has).
set -euo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$SRC/dist"
WORK="$SRC/build/bundle"
PY=/usr/bin/python3

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        *) echo "build-bundle.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

BUILD_DEPS=(python3 python3-venv python3-dev libsystemd-dev pkg-config gcc libssl-dev)

install_build_deps() {
    # shellcheck source=apt-ensure.sh
    . "$SRC/packaging/apt-ensure.sh"
    apt_ensure build-bundle.sh --no-install-recommends "${BUILD_DEPS[@]}"
}

install_build_deps

PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "build-bundle.sh: $PY is Python $PYVER; steadqd needs >= 3.11" >&2
    exit 1
fi
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$SRC/pyproject.toml" | head -1)"
ARCH="$(uname -m)"
NAME="steadqd-bundle-$VERSION-$ARCH"

mkdir -p "$WORK" "$OUT"
WORK="$(cd "$WORK" && pwd)"
OUT="$(cd "$OUT" && pwd)"
rm -rf "$WORK/src" "$WORK/buildenv" "$WORK/wheels" "${WORK:?}/${NAME:?}"

# Clean environment: Debian's python3 and tools only (no pyenv shims, no active virtualenv).
# pip's own configuration files (/etc/pip.conf, ~/.config/pip) still apply: they say which index
# mirror to use.
CLEAN_ENV=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "HOME=${HOME:-/root}" "LC_ALL=C.UTF-8"
           "PIP_DISABLE_PIP_VERSION_CHECK=1" "PIP_NO_INPUT=1")

# Build steadqd from a staged copy: pip builds in the source tree and would leave build/ and
# *.egg-info in the checkout.
mkdir -p "$WORK/src"
tar -C "$SRC" --exclude='__pycache__' --exclude='*.pyc' --exclude='*.egg-info' \
    -cf - steadqd pyproject.toml setup.py README.md | tar -C "$WORK/src" -xf -

"${CLEAN_ENV[@]}" "$PY" -m venv "$WORK/buildenv"
# --use-pep517: systemd-python ships only an sdist without pyproject.toml; Debian's bundled pip
# would otherwise run `setup.py bdist_wheel` in the build venv, which has no `wheel` package.
{
    "${CLEAN_ENV[@]}" "$WORK/buildenv/bin/pip" wheel -q --use-pep517 --wheel-dir "$WORK/wheels" "$WORK/src"
    SP="$WORK/$NAME/venv/lib/python$PYVER/site-packages"
    mkdir -p "$SP"
    "${CLEAN_ENV[@]}" "$WORK/buildenv/bin/pip" install -q --no-index --find-links "$WORK/wheels" \
        --no-compile --target "$SP" steadqd
} >"$WORK/pip.log" 2>&1 || {
    tail -n 40 "$WORK/pip.log" >&2
    echo "build-bundle.sh: building the wheels failed; full log: $WORK/pip.log" >&2
    exit 1
}
# --target also writes console scripts with this build's paths: install.sh writes its own.
rm -rf "${SP:?}/bin"
# Byte-compile with the target's interpreter version, so the hardened units (read-only /opt)
# never try to write __pycache__.
"${CLEAN_ENV[@]}" "$PY" -m compileall -q "$SP" >/dev/null

B="$WORK/$NAME"
mkdir -p "$B/units" "$B/etc" "$B/docs" "$B/licenses" "$B/monitoring"
cp "$SRC"/units/*.service "$SRC"/units/*.target "$B/units/"
cp "$SRC/units/steadq.sysusers.conf" "$SRC/units/steadq.tmpfiles.conf" "$B/"
cp "$SRC/etc/steadq/queues/example.yaml" "$B/etc/example.yaml"
cp "$SRC"/docs/*.md "$SRC/README.md" "$B/docs/"
cp "$SRC"/monitoring/* "$B/monitoring/"
# The Cockpit page as the cockpit-steadq .deb ships it: cockpit/ is its one source.
mkdir -p "$B/cockpit"
cp "$SRC"/cockpit/* "$B/cockpit/"
# Man pages as written (man/), completion scripts from the programs just built, as the .deb has them.
mkdir -p "$B/man" "$B/completions"
cp "$SRC"/man/*.1 "$SRC"/man/*.5 "$B/man/"
for entry in steadq:steadqd.cli.main:main steadqd:steadqd.daemon.main:daemon_main; do
    IFS=: read -r prog module fn <<<"$entry"
    for sh in bash zsh fish; do
        "${CLEAN_ENV[@]}" PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$SP" "$PY" -c \
            "import sys; from $module import $fn; sys.exit($fn(['completion', '$sh']))" >"$B/completions/$prog.$sh"
    done
done
cp "$SRC/packaging/vendor/inotify_simple/LICENSE" "$B/licenses/inotify_simple.LICENSE"
install -m 0755 "$SRC/packaging/bundle/install.sh" "$SRC/packaging/bundle/uninstall.sh" "$B/"
cp "$SRC/packaging/bundle/README.txt" "$B/"

{
    echo "# steadqd appliance bundle (sourced by install.sh; KEY=VALUE, shell syntax)"
    echo "VERSION=$VERSION"
    echo "ARCH=$ARCH"
    echo "PYTHON_VERSION=$PYVER"
    echo "BUILT_WITH=\"$("$PY" -c 'import sys; print(sys.version.split()[0])') ($PY)\""
    echo "GLIBC=$(ldd --version | head -1 | awk '{print $NF}')"
    echo "# packages:"
    "${CLEAN_ENV[@]}" "$WORK/buildenv/bin/pip" list --path "$SP" --format=freeze 2>/dev/null | sed 's/^/#   /'
} >"$B/MANIFEST"

TARBALL="$OUT/$NAME.tar.gz"
# Sorted, root-owned entries; mtimes are kept (the .pyc files are validated against them).
tar -C "$WORK" --sort=name --owner=0 --group=0 --numeric-owner -czf "$TARBALL.tmp" "$NAME"
mv "$TARBALL.tmp" "$TARBALL"
echo "build-bundle.sh: built $TARBALL ($(du -h "$TARBALL" | cut -f1))"
