"""Operator tools for the two places jobs end up when nobody will process them: ``dead/`` and ``quarantine/``.

As ``steadqd.s3.admin`` answers them for a bucket: the dead letters
(``dead``: list, export, remove, requeue), the quarantined objects
(``quarantine``: list, inspect, export, remove), and the file handling both
share (``files``: an export written whole or not at all, a durable unlink).
"""

from steadqd.fs.admin.dead import (
    DeadFile,
    DeadJob,
    export_dead,
    find_dead,
    list_dead,
    list_dead_files,
    remove_dead,
    requeue_dead,
)
from steadqd.fs.admin.quarantine import (
    QuarantinedObject,
    export_quarantine,
    find_quarantined,
    inspect_quarantine,
    list_quarantine,
    remove_quarantine,
)

__all__ = [
    "DeadFile",
    "DeadJob",
    "QuarantinedObject",
    "export_dead",
    "export_quarantine",
    "find_dead",
    "find_quarantined",
    "inspect_quarantine",
    "list_dead",
    "list_dead_files",
    "list_quarantine",
    "remove_dead",
    "remove_quarantine",
    "requeue_dead",
]
