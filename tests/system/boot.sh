#!/bin/sh
# Runs as PID 1 of fresh PID, mount, UTS, IPC, network and cgroup namespaces
# (started by tests/system/sysroot.py through `unshare`), builds a throwaway
# root and execs systemd in it. NEVER run this outside those namespaces: every
# mount below would land on the host.
#
#   boot.sh LAYERS SPOOL PYHOME UNIT [DIR...]
#
# LAYERS  a tmpfs (mounted by the harness on the host) holding upper/, work/
#         and root/ (the mount point of the overlay)
# SPOOL   an ext4 directory bind-mounted at /var/lib/steadq: SteadQ refuses
#         overlayfs and tmpfs, so the queues need a real file system
# PYHOME  the Python installation the project's venv was built with; bind-
#         mounted read-only at /opt/steadq-python (see docs/testing.md: the
#         host's interpreter lives under /root, which ProtectHome=yes hides)
# UNIT    the unit systemd boots into (--unit=)
# DIR     directories bind-mounted read-only at the same path (a checkout or
#         venv below /tmp or /run, which are fresh tmpfs instances in the root)
#
# Safety: the overlay's lower layer is the host's / (read-only through the
# overlay: every write goes to the tmpfs upper layer). /run, /tmp and /dev are
# new tmpfs instances INSIDE the new root, so systemd-tmpfiles and
# systemd-journald (which creates /dev/log) never see the host's /tmp or /dev.
# /sys and /proc/sys are read-only, so no unit can write host sysctls or
# trigger host devices; the only writable kernel interface is a cgroup2 mount
# rooted (via the cgroup namespace) at the harness's own sub-cgroup.
set -eu
if [ "$$" != 1 ]; then
    echo "boot.sh: refusing to run: not PID 1 of a new PID namespace" >&2
    exit 1
fi
L=$1
SPOOL=$2
PYHOME=$3
UNIT=$4
shift 4
R=$L/root

mount --make-rprivate /
mount -t overlay steadq-sysroot -o "lowerdir=/,upperdir=$L/upper,workdir=$L/work" "$R"

mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"
mount -o remount,bind,ro "$R/proc/sys"
if [ -e "$R/proc/sysrq-trigger" ]; then
    mount --bind "$R/proc/sysrq-trigger" "$R/proc/sysrq-trigger"
    mount -o remount,bind,ro "$R/proc/sysrq-trigger"
fi

# /sys without its sub-mounts (the host's cgroup v1 hierarchies stay out), read-only.
mount --bind /sys "$R/sys"
mount -o remount,bind,ro,nosuid,nodev,noexec "$R/sys"
# The cgroup namespace makes this cgroup2 mount show only the harness's sub-cgroup.
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"

# A private /dev with the pseudo-devices only (like systemd-nspawn): nothing the
# container creates in /dev (e.g. the /dev/log symlink) reaches the host's /dev.
mount -t tmpfs -o mode=755,nosuid,size=4m steadq-dev "$R/dev"
for n in null zero full random urandom tty; do
    touch "$R/dev/$n"
    mount --bind "/dev/$n" "$R/dev/$n"
done
# systemd's console output goes to the harness's log file (our stdout).
touch "$R/dev/console"
mount --bind /proc/self/fd/1 "$R/dev/console"
mkdir "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5,nosuid,noexec devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=64m steadq-shm "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"

mount -t tmpfs -o mode=755,nosuid,nodev,size=64m steadq-run "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=256m steadq-tmp "$R/tmp"

mkdir -p "$R/opt/steadq-python" "$R/var/lib/steadq"
mount --bind "$PYHOME" "$R/opt/steadq-python"
mount -o remount,bind,ro "$R/opt/steadq-python"
mount --bind "$SPOOL" "$R/var/lib/steadq"
for d in "$@"; do
    mkdir -p "$R$d"
    mount --bind "$d" "$R$d"
    mount -o remount,bind,ro "$R$d"
done

cd "$R"
mkdir run/oldroot
pivot_root . run/oldroot
cd /
umount -l /run/oldroot
rmdir /run/oldroot

exec env -i container=steadq-test PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --system "--unit=$UNIT" </dev/null
