"""Phase 3, temp cleanup (recovery.md): abandoned temp files disappear.

A temp of another boot belongs to no running writer and is deleted at once;
one of this boot only once it is older than the temp TTL (its name carries
its creation time; a name we cannot parse is not ours to judge).
"""

from __future__ import annotations

import os

from steadqd.constants import TEMP_EXT, TMP_DIR
from steadqd.fs.names import parse_temp_name
from steadqd.fs.recovery.state import Pass
from steadqd.fs.recovery.walk import Level, parse_boot, shard_level, walk
from steadqd.fs.tree import Indeterminate, MoveFailed, SourceMissing


def cleanup_temp(p: Pass) -> None:
    ttl = p.ctx.options.temp_ttl_ns
    # Names that are not boot directories are skipped silently (doctor probes live directly in tmp/).
    levels = (Level(parse_boot, None), shard_level(p))
    for (boot, _), fd, rel, raw in walk(p, TMP_DIR, levels):
        if not raw.endswith(TEMP_EXT.encode()):
            continue
        if boot == p.ctx.boot_raw:
            parsed = parse_temp_name(raw)
            if parsed is None or p.bt_now - parsed[0] <= ttl:
                continue  # young, or not ours to judge
        delete_temp(p, fd, rel, os.fsdecode(raw))


def delete_temp(p: Pass, dir_fd: int, rel: str, name: str) -> None:
    """Unlink + directory fsync; counted in ``temp_files_deleted``, as are
    the stale ``.compact-*.tmp`` files receipt compaction leaves behind."""
    p.op()
    try:
        p.ctx.tree.unlink(dir_fd, name)
    except SourceMissing:
        return
    except MoveFailed as e:
        p.error("temp_delete_failed", f"{rel}/{name}: {e}")
        return
    except Indeterminate as e:
        p.error("temp_delete_outcome_unknown", f"{rel}/{name}: {e}")
        return
    p.report.temp_files_deleted += 1
