"""SteadQ/1 on a local filesystem: the first backend.

A queue is a directory tree and a job one immutable file whose name encodes its
state; ownership moves by ``renameat2(RENAME_NOREPLACE)`` and durability by
fsync barriers. The modules follow the spec's chapters: the syscall layer
(``linux``), the pure format code (``names``, ``cbor``, ``records``), the
tree and its barriers (``tree``, ``watermark``, ``layout``, ``context``), the
transitions (``publish``, ``claim``, ``lease``, ``settle``), recovery, and the
operator's views and tools (``inspection``, ``admin``, ``resolve``).
``handle.Queue`` is the facade the rest of the package is reached through; the
daemons and the CLI see it only as ``steadqd.backend`` describes it.
"""
