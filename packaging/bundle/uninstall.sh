#!/bin/sh
# Uninstall the steadqd appliance bundle.
#
#   uninstall.sh [--prefix /opt/steadq] [--root DIR] [--purge]
#
# Run as PREFIX/share/steadq/uninstall.sh (the prefix is then found by itself) or from the
# unpacked bundle. Stops every queue unit (workers drain first), disables steadq.target, removes
# the units, the sysusers.d/tmpfiles.d files, the /usr/local/bin links, the Cockpit page if it
# installed one, and the prefix.
#
# Always kept: /var/lib/steadq (the queues and every job in them), the steadq user and group
# (files in the queues are owned by their IDs), /etc/steadq/queues/*.yaml that you wrote, and the
# enablement of queue instances (`systemctl enable steadq-worker@QUEUE`), so a reinstall starts
# the same queues again and they finish the jobs left on disk.
# --purge also removes /etc/steadq/queues/example.yaml and those instance enablement links;
# /var/lib/steadq is still kept.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=""
ROOT=/
PURGE=0

die() { echo "uninstall.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
        --root) [ $# -ge 2 ] || die "--root needs a value"; ROOT=$2; shift 2 ;;
        --purge) PURGE=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

[ -d "$ROOT" ] || die "--root $ROOT is not a directory"
ROOT=$(cd "$ROOT" && pwd)
[ "$ROOT" = / ] && R="" || R=$ROOT

if [ -z "$PREFIX" ]; then
    if [ -e "$HERE/../../.steadq-bundle" ]; then
        # Installed copy: PREFIX/share/steadq/uninstall.sh (HERE is seen from the running system).
        D=$(cd "$HERE/../.." && pwd)
        PREFIX=${D#"$R"}
    else
        PREFIX=/opt/steadq
    fi
fi
case "$PREFIX" in
    /?*) PREFIX=${PREFIX%/} ;;
    *) die "--prefix must be an absolute path other than /" ;;
esac
D=$R$PREFIX
[ -e "$D/.steadq-bundle" ] || die "$D is not a steadq bundle installation (no .steadq-bundle marker)"

LIVE=0
if [ -z "$R" ]; then
    [ "$(id -u)" -eq 0 ] || die "run as root (or use --root DIR)"
    if [ -d /run/systemd/system ]; then LIVE=1; fi
fi

INSTANCES="steadq-worker@*.service steadq-sweeper@*.service steadq-promoter@*.service steadq@*.target"
if [ "$LIVE" -eq 1 ]; then
    # Stopping steadq.target stops every unit PartOf= it; the patterns catch instances started
    # while it was inactive. Workers drain (ExecStop=) before the sweeper and promoter stop.
    # shellcheck disable=SC2086
    systemctl stop steadq.target $INSTANCES || true
    systemctl disable steadq.target || true
elif command -v systemctl >/dev/null 2>&1; then
    systemctl --root="$ROOT" disable steadq.target >/dev/null 2>&1 || true
fi

if [ -f "$D/share/steadq/installed-files" ]; then
    while IFS= read -r f; do
        case "$f" in
            /usr/local/bin/*)
                # Only our own links.
                if [ -L "$R$f" ]; then
                    case "$(readlink "$R$f")" in "$PREFIX"/bin/*) rm -f "$R$f" ;; esac
                fi ;;
            /*) rm -f "$R$f" ;;
        esac
    done <"$D/share/steadq/installed-files"
    # The Cockpit page's directory, once its files (listed above) are gone.
    if grep -qx /usr/share/cockpit/steadq/manifest.json "$D/share/steadq/installed-files"; then
        rmdir "$R/usr/share/cockpit/steadq" 2>/dev/null || true
    fi
fi

if [ "$PURGE" -eq 1 ]; then
    rm -f "$R/etc/steadq/queues/example.yaml"
    rmdir "$R/etc/steadq/queues" "$R/etc/steadq" 2>/dev/null || true
    for l in "$R"/etc/systemd/system/steadq.target.wants/*; do
        if [ -L "$l" ]; then rm -f "$l"; fi
    done
    rmdir "$R/etc/systemd/system/steadq.target.wants" 2>/dev/null || true
fi

rm -rf "$D"

if [ "$LIVE" -eq 1 ]; then
    systemctl daemon-reload
    systemctl reset-failed 'steadq*' 2>/dev/null || true
fi

echo "uninstall.sh: removed steadqd from $D."
echo "Kept: /var/lib/steadq (queues and jobs), the steadq user and group, /etc/steadq/queues/*.yaml you wrote."
