#!/usr/bin/env bash
# Build the steadqd and cockpit-steadq Debian packages and check them with lintian (`make deb`).
#
#   packaging/build-deb.sh [--out DIR] [--work DIR] [--version VERSION] [--no-lintian]
#
#   --out DIR          where the two .debs, .buildinfo, .changes and lintian.txt go (default: dist/)
#   --work DIR         scratch directory for the staged source tree (default: build/deb/)
#   --version VERSION  build VERSION instead of the one in packaging/debian/changelog, by adding a
#                      changelog entry in the staged copy (upgrade tests: a "newer" package)
#   --no-lintian       skip lintian
#
# dpkg-buildpackage needs debian/ at the top of the source tree, so the build runs in a staged
# copy: the files the packages are built from (steadqd/, pyproject.toml, setup.py, README.md, docs/, units/,
# etc/, cockpit/, packaging/vendor/) plus packaging/debian/ as debian/. The checkout itself is never written
# to except for --out. Build dependencies come from Debian only (apt-get, when missing and root);
# nothing is downloaded from PyPI. Exit status: non-zero when the build fails or lintian reports an
# error (E:); warnings are listed in docs/packaging.md.
set -euo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$SRC/dist"
WORK="$SRC/build/deb"
VERSION=""
LINTIAN=1

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        --version) VERSION="$2"; shift 2 ;;
        --no-lintian) LINTIAN=0; shift ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

BUILD_DEPS=(build-essential debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
            python3-systemd python3-cffi python3-yaml libssl-dev lintian)

install_build_deps() {
    # shellcheck source=apt-ensure.sh
    . "$SRC/packaging/apt-ensure.sh"
    apt_ensure build-deb.sh --no-install-recommends "${BUILD_DEPS[@]}"
}

stage() {
    local dst="$1"
    rm -rf "$dst"
    mkdir -p "$dst"
    # Only what the package is built from; no caches, no egg-info, no tests.
    tar -C "$SRC" --exclude='__pycache__' --exclude='*.pyc' --exclude='*.egg-info' \
        -cf - steadqd pyproject.toml setup.py README.md docs man units etc monitoring cockpit packaging/vendor | tar -C "$dst" -xf -
    cp -r "$SRC/packaging/debian" "$dst/debian"
    # dh_installsysusers/dh_installtmpfiles --name=steadq read these names; the single source of
    # truth stays in units/.
    cp "$SRC/units/steadq.sysusers.conf" "$dst/debian/steadqd.steadq.sysusers"
    cp "$SRC/units/steadq.tmpfiles.conf" "$dst/debian/steadqd.steadq.tmpfiles"
    if [ -n "$VERSION" ]; then
        local old
        old="$(cat "$dst/debian/changelog")"
        {
            echo "steadqd ($VERSION) unstable; urgency=medium"
            echo
            echo "  * Rebuild as version $VERSION (packaging/build-deb.sh --version)."
            echo
            echo " -- steadqd maintainers <steadqd@example.org>  $(date -R)"
            echo
            echo "$old"
        } >"$dst/debian/changelog"
    fi
}

install_build_deps

PKG_VERSION="$(cd "$SRC/packaging" && dpkg-parsechangelog -l debian/changelog -S Version)"
PY_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$SRC/pyproject.toml" | head -1)"
if [ "${PKG_VERSION%%[-+~]*}" != "$PY_VERSION" ]; then
    echo "build-deb.sh: packaging/debian/changelog is at $PKG_VERSION but pyproject.toml at $PY_VERSION;" \
         "add a changelog entry for $PY_VERSION" >&2
    exit 1
fi

mkdir -p "$WORK" "$OUT"
WORK="$(cd "$WORK" && pwd)"
OUT="$(cd "$OUT" && pwd)"
TREE="$WORK/steadqd-${VERSION:-$PKG_VERSION}"
stage "$TREE"
rm -f "$WORK"/steadqd_* "$WORK"/cockpit-steadq_*

# A clean environment: Debian's own python3 and tools only. A developer's PATH may put pyenv, a
# virtualenv or /usr/local first, and pybuild would then build for that interpreter.
CLEAN_ENV=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "HOME=${HOME:-/root}" "LC_ALL=C.UTF-8" "TERM=dumb"
           ${DEB_BUILD_OPTIONS:+"DEB_BUILD_OPTIONS=$DEB_BUILD_OPTIONS"})
(cd "$TREE" && "${CLEAN_ENV[@]}" dpkg-buildpackage -us -uc -b) >"$WORK/build.log" 2>&1 || {
    tail -n 60 "$WORK/build.log" >&2
    echo "build-deb.sh: dpkg-buildpackage failed; full log: $WORK/build.log" >&2
    exit 1
}

DEB="$(ls "$WORK"/steadqd_*_"$(dpkg --print-architecture)".deb)"
# The Cockpit page: Architecture: all, from the same source and version.
COCKPIT_DEB="$(ls "$WORK"/cockpit-steadq_*_all.deb)"
cp "$DEB" "$COCKPIT_DEB" "$WORK"/steadqd_*.buildinfo "$WORK"/steadqd_*.changes "$OUT"/
echo "build-deb.sh: built $OUT/$(basename "$DEB") and $OUT/$(basename "$COCKPIT_DEB")"

if [ "$LINTIAN" -eq 1 ]; then
    # lintian exits non-zero on errors (--fail-on error); the full report is kept next to the .deb.
    status=0
    "${CLEAN_ENV[@]}" lintian --info --display-info --fail-on error "$OUT/$(basename "$DEB")" \
        "$OUT/$(basename "$COCKPIT_DEB")" >"$OUT/lintian.txt" 2>&1 || status=$?
    cat "$OUT/lintian.txt"
    if [ "$status" -ne 0 ]; then
        echo "build-deb.sh: lintian reported errors (status $status); see $OUT/lintian.txt" >&2
        exit 1
    fi
    echo "build-deb.sh: lintian: no errors ($(grep -c '^W:' "$OUT/lintian.txt" || true) warnings)"
fi
