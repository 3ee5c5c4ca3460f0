#!/bin/sh
# Install the steadqd appliance bundle (offline). Run from the unpacked bundle:
#
#   ./install.sh [--prefix /opt/steadq] [--root DIR] [--no-symlinks]
#
#   --prefix P     where the private Python environment goes (default /opt/steadq). The units
#                  run P/bin/steadqd.
#   --root DIR     install into the file system tree at DIR instead of / (an image being built,
#                  a container root, a test). Nothing is started; systemd-sysusers,
#                  systemd-tmpfiles and `systemctl enable` act on DIR with their --root options.
#   --no-symlinks  do not create /usr/local/bin/steadq and /usr/local/bin/steadqd
#
# What it does: copies the environment to P (bin/python is a link to the system's
# /usr/bin/python3.X, which the bundle was built for; see MANIFEST), writes P/bin/steadq and
# P/bin/steadqd, installs the units into /etc/systemd/system with ExecStart= pointing at P,
# sysusers.d/tmpfiles.d files into /etc, creates the steadq user and /var/lib/steadq,
# installs the example queue file as P/share/steadq/examples/example.yaml (never a live
# config in /etc/steadq/queues: it names no real queue or command), and enables steadq.target. Queue
# templates (steadq-worker@ etc.) are never enabled: `systemctl enable --now
# steadq-worker@QUEUE` does that. Where Cockpit is (cockpit-bridge), the page "Job queues"
# goes to /usr/share/cockpit/steadq/ (as the cockpit-steadq .deb puts it); else it is skipped,
# saying so. Re-running it upgrades in place and restarts running queue units. Nothing is
# downloaded.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=/opt/steadq
ROOT=/
SYMLINKS=1

die() { echo "install.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
        --root) [ $# -ge 2 ] || die "--root needs a value"; ROOT=$2; shift 2 ;;
        --no-symlinks) SYMLINKS=0; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

case "$PREFIX" in
    /?*) PREFIX=${PREFIX%/} ;;
    *) die "--prefix must be an absolute path other than /" ;;
esac
case "$PREFIX" in *[!A-Za-z0-9/._+-]*) die "--prefix may only contain letters, digits and / . _ + -" ;; esac
[ -d "$ROOT" ] || die "--root $ROOT is not a directory"
ROOT=$(cd "$ROOT" && pwd)
[ "$ROOT" = / ] && R="" || R=$ROOT
LIVE=0
if [ -z "$R" ]; then
    [ "$(id -u)" -eq 0 ] || die "run as root (or use --root DIR)"
    if [ -d /run/systemd/system ]; then LIVE=1; fi
fi

# shellcheck source=/dev/null
. "$HERE/MANIFEST"

# The interpreter the compiled modules were built for.
PY=""
for cand in "/usr/bin/python$PYTHON_VERSION" "/usr/local/bin/python$PYTHON_VERSION"; do
    if [ -x "$R$cand" ]; then PY=$cand; break; fi
done
[ -n "$PY" ] || die "this bundle needs Python $PYTHON_VERSION at /usr/bin/python$PYTHON_VERSION (Debian 12: apt-get install python3); found none in ${ROOT}"

D=$R$PREFIX
if [ -e "$D" ] && [ ! -e "$D/.steadq-bundle" ] && [ -n "$(ls -A "$D" 2>/dev/null)" ]; then
    die "$D exists, is not empty and is not a steadq bundle installation; choose another --prefix"
fi
UPGRADE=0
if [ -e "$D/.steadq-bundle" ]; then UPGRADE=1; fi

echo "install.sh: installing steadqd $VERSION into $D"

# --- the private Python environment -------------------------------------------------------------
# Replace lib/ as a whole (an upgrade must not keep modules the new version dropped); copy first,
# then swap, so a failed copy leaves the old installation intact.
mkdir -p "$D/bin" "$D/share/steadq" "$D/share/doc/steadqd"
rm -rf "$D/lib.new"
cp -a "$HERE/venv/lib" "$D/lib.new"
rm -rf "$D/lib.old"
if [ -d "$D/lib" ]; then mv "$D/lib" "$D/lib.old"; fi
mv "$D/lib.new" "$D/lib"
rm -rf "$D/lib.old"
ln -sfn "$PY" "$D/bin/python"
ln -sfn python "$D/bin/python3"
cat >"$D/pyvenv.cfg" <<EOF
home = $(dirname "$PY")
include-system-site-packages = false
version = $PYTHON_VERSION
EOF
# Console scripts. They find the environment relative to themselves (readlink -f also resolves
# /usr/local/bin/steadqd -> P/bin/steadqd), so the tree works wherever it is mounted. -I: no
# PYTHONPATH, no user site-packages, no current directory on sys.path.
write_script() { # name module function
    cat >"$D/bin/$1" <<EOF
#!/bin/sh
# $1 from the steadqd appliance bundle $VERSION: runs the bundle's private Python environment.
here=\$(dirname "\$(readlink -f "\$0")")
exec "\$here/python" -I -c 'import sys; sys.argv[0] = "$1"; from $2 import $3 as main; sys.exit(main())' "\$@"
EOF
    chmod 0755 "$D/bin/$1"
}
write_script steadqd steadqd.daemon.main daemon_main
write_script steadq steadqd.cli.main main
cp "$HERE"/docs/*.md "$D/share/doc/steadqd/"
# man finds P/share/man through P/bin on PATH; the completions sit where each shell's
# packages put theirs, under P (source them, or link them into /usr/share when wanted).
mkdir -p "$D/share/man/man1" "$D/share/man/man5" "$D/share/bash-completion/completions" \
    "$D/share/zsh/vendor-completions" "$D/share/fish/vendor_completions.d"
cp "$HERE"/man/*.1 "$D/share/man/man1/"
cp "$HERE"/man/*.5 "$D/share/man/man5/"
for prog in steadq steadqd; do
    cp "$HERE/completions/$prog.bash" "$D/share/bash-completion/completions/$prog"
    cp "$HERE/completions/$prog.zsh" "$D/share/zsh/vendor-completions/_$prog"
    cp "$HERE/completions/$prog.fish" "$D/share/fish/vendor_completions.d/$prog.fish"
done
cp -r "$HERE/licenses" "$D/share/doc/steadqd/"
# The Grafana dashboard and Prometheus alert rules (the .deb: /usr/share/steadqd/monitoring/).
mkdir -p "$D/share/steadq/monitoring"
cp "$HERE"/monitoring/* "$D/share/steadq/monitoring/"
cp "$HERE/MANIFEST" "$D/share/steadq/MANIFEST"
install -m 0755 "$HERE/uninstall.sh" "$D/share/steadq/uninstall.sh"

# --- system integration -------------------------------------------------------------------------
UNITDIR=$R/etc/systemd/system
mkdir -p "$UNITDIR" "$R/etc/sysusers.d" "$R/etc/tmpfiles.d" "$R/etc/steadq/queues"
FILES="$D/share/steadq/installed-files"
: >"$FILES.new"
for u in "$HERE"/units/*; do
    name=$(basename "$u")
    # The units are written for the Debian package (/usr/bin/steadqd, docs in
    # /usr/share/doc/steadqd); point them at this prefix instead.
    sed -e "/^Exec\(Start\|Reload\)=/s#/usr/bin/steadqd#$PREFIX/bin/steadqd#" \
        -e "/^Documentation=/s#file:/usr/share/doc/steadqd/#file:$PREFIX/share/doc/steadqd/#g" \
        "$u" >"$UNITDIR/$name.tmp"
    chmod 0644 "$UNITDIR/$name.tmp"
    mv "$UNITDIR/$name.tmp" "$UNITDIR/$name"
    echo "/etc/systemd/system/$name" >>"$FILES.new"
done
install -m 0644 "$HERE/steadq.sysusers.conf" "$R/etc/sysusers.d/steadq.conf"
install -m 0644 "$HERE/steadq.tmpfiles.conf" "$R/etc/tmpfiles.d/steadq.conf"
echo /etc/sysusers.d/steadq.conf >>"$FILES.new"
echo /etc/tmpfiles.d/steadq.conf >>"$FILES.new"
install -D -m 0644 "$HERE/etc/example.yaml" "$D/share/steadq/examples/example.yaml"
if [ "$SYMLINKS" -eq 1 ]; then
    mkdir -p "$R/usr/local/bin"
    for s in steadq steadqd; do
        link=$R/usr/local/bin/$s
        if [ -e "$link" ] && [ ! -L "$link" ]; then
            echo "install.sh: $link exists and is not a symlink; left alone" >&2
            continue
        fi
        ln -sfn "$PREFIX/bin/$s" "$link"
        echo "/usr/local/bin/$s" >>"$FILES.new"
    done
fi

# The Cockpit page (the cockpit-steadq .deb's files): Cockpit serves /usr/share/cockpit/NAME/ to
# the logged-in user, whose session runs `steadq` from PATH (/usr/local/bin). Cockpit is there
# when cockpit-bridge is (it reads the pages; base1/ is its own). A page directory this bundle did
# not install (the .deb's) is left alone; ours is replaced whole, and removed when Cockpit is gone.
PAGE=/usr/share/cockpit/steadq
PAGE_OURS=0
if [ -f "$FILES" ] && grep -qx "$PAGE/manifest.json" "$FILES"; then PAGE_OURS=1; fi
if [ -x "$R/usr/bin/cockpit-bridge" ] || [ -d "$R/usr/share/cockpit/base1" ]; then
    if [ -e "$R$PAGE" ] && [ "$PAGE_OURS" -eq 0 ]; then
        echo "install.sh: $PAGE exists and is not from this bundle (the cockpit-steadq package?); left alone" >&2
    else
        rm -rf "$R$PAGE.new"
        install -d -m 0755 "$R$PAGE.new"
        for f in "$HERE"/cockpit/*; do
            install -m 0644 "$f" "$R$PAGE.new/"
            echo "$PAGE/$(basename "$f")" >>"$FILES.new"
        done
        rm -rf "$R$PAGE"
        mv "$R$PAGE.new" "$R$PAGE"
        echo "install.sh: Cockpit found: installed the page \"Job queues\" into $PAGE"
        if [ "$SYMLINKS" -eq 0 ]; then
            echo "install.sh: the page runs \`steadq\` from PATH: without the /usr/local/bin links, put $PREFIX/bin there" >&2
        fi
    fi
else
    if [ "$PAGE_OURS" -eq 1 ]; then rm -rf "$R$PAGE"; fi
    echo "install.sh: Cockpit not found (no cockpit-bridge): its page \"Job queues\" is skipped"
fi
mv "$FILES.new" "$FILES"
: >"$D/.steadq-bundle"

# The user before the spool that belongs to it.
if command -v systemd-sysusers >/dev/null 2>&1; then
    if [ -z "$R" ]; then systemd-sysusers /etc/sysusers.d/steadq.conf
    else systemd-sysusers --root="$R" steadq.conf; fi
else
    die "systemd-sysusers not found: this bundle needs systemd"
fi
if [ -z "$R" ]; then systemd-tmpfiles --create /etc/tmpfiles.d/steadq.conf
else systemd-tmpfiles --root="$R" --create steadq.conf; fi

if [ "$LIVE" -eq 1 ]; then
    systemctl daemon-reload
    systemctl enable --now steadq.target
    if [ "$UPGRADE" -eq 1 ]; then
        # Running queue units restart into the new code (they are PartOf=steadq.target; the
        # instance patterns also catch units started while steadq.target was inactive).
        systemctl try-restart steadq.target 'steadq-worker@*.service' 'steadq-sweeper@*.service' \
            'steadq-promoter@*.service'
    fi
    # Every module imports with the target's interpreter.
    "$D/bin/steadqd" --help >/dev/null
else
    systemctl --root="$ROOT" enable steadq.target
fi

echo "install.sh: done. Configure a queue in /etc/steadq/queues/QUEUE.yaml (start from"
echo "  $PREFIX/share/steadq/examples/example.yaml), create it with"
echo "  runuser -u steadq -- $PREFIX/bin/steadq init /var/lib/steadq/QUEUE"
echo "and start it with: systemctl enable --now steadq-worker@QUEUE"
echo "Uninstall: $PREFIX/share/steadq/uninstall.sh (keeps /var/lib/steadq)"
