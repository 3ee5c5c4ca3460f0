"""``python -m benchmarks``: the one command of the benchmark suite.

    .venv/bin/python -m benchmarks run [--quick|--smoke] [--full-scale] [--out DIR] [--dir SCRATCH]
                                       [--fs host|ext4|xfs|btrfs]
    .venv/bin/python -m benchmarks report RESULTS.json [--out DIR]
    .venv/bin/python -m benchmarks install-peers

``run`` measures everything side by side in one run on one disk and writes
``results.json``, ``results.md``, ``profile.txt`` and PNG plots to ``--out``.
The scratch directory must be on the disk being measured (never tmpfs). With
``--fs ext4|xfs|btrfs`` the sections run on a fresh filesystem of that type on a
loop device whose sparse image lives in the scratch directory (see loopdisk.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import loopdisk
from .common import PROFILES, REPO, log, signals_unwind
from .runner import PEERS, SECTIONS, Runner

PEER_PACKAGES = ["persist-queue", "litequeue", "huey", "rq", "redis", "matplotlib"]
TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6


def install_peers() -> int:
    """pip-install the peers into *this* interpreter (benchmark only, never project deps); apt redis-server."""
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEER_PACKAGES])
    if shutil.which("redis-server") is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        rc |= subprocess.call(["apt-get", "install", "-y", "-qq", "redis-server"], env=env)
    return rc


def write_outputs(results: dict, out: str) -> None:
    from . import report

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=False, default=str)
    prof = results.get("profile")
    if isinstance(prof, dict) and "text" in prof:
        with open(os.path.join(out, "profile.txt"), "w") as f:
            f.write(prof["text"])
    files, note = report.plots(results, out)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(results, files, note))


def _remove_scratch(base: str, created: bool) -> None:
    """Delete the scratch dir we created, unless a mount is still below it.

    rmtree would descend into a mount that failed to go away; better to leave the
    directory (and say so) than to delete through it.
    """
    if not created:
        return
    left = loopdisk.mounts_under(base)
    if left:
        log(f"not removing {base}: still mounted below it: {', '.join(left)}")
        return
    shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks", description="steadqd benchmarks against the floor and the peers"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark suite")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="short run (< 3 minutes)")
    g.add_argument("--smoke", action="store_true", help="tiny run proving the harness works (CI; numbers meaningless)")
    r.add_argument(
        "--full-scale", action="store_true", help="also measure scaling at 1,000,000 ready jobs (~4 GB, minutes)"
    )
    r.add_argument("--out", help="output directory (default benchmarks/results/<profile>)")
    r.add_argument("--dir", help="scratch directory on the disk to measure (default /var/tmp/steadqd-bench-<pid>)")
    r.add_argument(
        "--fs",
        choices=loopdisk.FS_CHOICES,
        default="host",
        help="host: measure the scratch dir's own filesystem; ext4/xfs/btrfs: a fresh one on a loop device "
        "whose sparse image lives in the scratch dir (needs root)",
    )
    r.add_argument(
        "--loop-direct-io",
        choices=("on", "off"),
        default=loopdisk.DEFAULT_DIRECT_IO,
        help=f"losetup --direct-io for --fs runs (default {loopdisk.DEFAULT_DIRECT_IO})",
    )
    r.add_argument(
        "--image-in-ram",
        action="store_true",
        help="with --fs: keep the loop image in a fresh directory under /dev/shm (loop direct I/O off): the same "
        "journaled filesystem with cheap fsyncs, where CPU decides",
    )
    r.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {','.join(SECTIONS)}")
    r.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {','.join(PEERS)}")
    r.add_argument("--install-peers", action="store_true", help="pip/apt-install the peers first")
    r.add_argument(
        "--reference",
        metavar="PATH",
        help="the reference implementation's steadq binary: section bench runs its bench beside steadqd's",
    )
    rep = sub.add_parser("report", help="re-render results.md and plots from a results.json")
    rep.add_argument("results")
    rep.add_argument("--out")
    sub.add_parser(
        "install-peers", help="pip-install the peer queues and matplotlib into this venv, apt-install redis-server"
    )
    a = ap.parse_args(argv)

    if a.cmd == "install-peers":
        return install_peers()
    if a.cmd == "report":
        with open(a.results) as f:
            results = json.load(f)
        write_outputs(results, a.out or os.path.dirname(os.path.abspath(a.results)))
        return 0

    profile = PROFILES["smoke" if a.smoke else "quick" if a.quick else "full"]
    sections = tuple(s for s in a.sections.split(",") if s)
    bad = [s for s in sections if s not in SECTIONS]
    peers = tuple(p for p in a.peers.split(",") if p)
    bad += [p for p in peers if p not in PEERS]
    if bad:
        ap.error(f"unknown section/peer: {', '.join(bad)}")
    if a.reference is not None and not (os.path.isfile(a.reference) and os.access(a.reference, os.X_OK)):
        ap.error(f"--reference {a.reference}: not an executable file (give the reference's built steadq binary)")
    if a.install_peers:
        install_peers()
    out = a.out or os.path.join(REPO, "benchmarks", "results", profile.name)
    if a.image_in_ram and a.fs == "host":
        ap.error("--image-in-ram needs --fs ext4|xfs|btrfs (it says where the loop image lives)")
    if a.fs != "host":
        try:
            loopdisk.check_can_build(a.fs)
        except loopdisk.LoopDiskError as e:
            print(f"python -m benchmarks: {e}", file=sys.stderr)
            return 2
    base = a.dir or f"/var/tmp/steadqd-bench-{os.getpid()}"
    created_base = a.dir is None
    os.makedirs(base, exist_ok=True)
    from steadqd.fs import linux

    magic = linux.statfs_type(base)
    if magic in (TMPFS_MAGIC, RAMFS_MAGIC):
        print(f"{base} is on tmpfs/ramfs: fsync is free there, the numbers would mean nothing", file=sys.stderr)
        if created_base:
            os.rmdir(base)
        return 2
    log(f"profile {profile.name}, scratch {base}, fs {a.fs}, out {out}")
    t = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(signals_unwind())
            measured, setup = base, None
            if a.fs != "host":
                image_dir, direct_io = None, a.loop_direct_io
                if a.image_in_ram:  # tmpfs has no O_DIRECT: the loop reads and writes through the page cache
                    image_dir = stack.enter_context(
                        tempfile.TemporaryDirectory(prefix="steadqd-bench-", dir="/dev/shm")
                    )
                    direct_io = "off"
                measured, loop = stack.enter_context(
                    loopdisk.loop_filesystem(
                        a.fs, base, full_scale=a.full_scale, direct_io=direct_io, image_dir=image_dir
                    )
                )
                setup = loop.to_json()
            runner = Runner(
                profile,
                measured,
                full_scale=a.full_scale,
                sections=sections,
                peers=peers,
                fs=a.fs,
                loop_setup=setup,
                reference=a.reference,
            )
            results = runner.run()
    except loopdisk.LoopDiskError as e:
        print(f"python -m benchmarks: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        log("interrupted; scratch torn down, no results written")
        return 130
    finally:
        _remove_scratch(base, created_base)
    write_outputs(results, out)
    log(f"done in {time.monotonic() - t:.0f}s: {out}/results.md")
    print(os.path.join(out, "results.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
