"""The two context managers every public call of :class:`steadqd.fs.handle.Queue` enters.

``mutation`` turns any failure of a mutation into one of the three outcome
classes (errors.md); ``Validated`` holds a leased job's source file open and
checked while a payload is read. Both pin the directory cache for the block.
"""

from __future__ import annotations

import errno

from steadqd.errors import EnqueueIncomplete, ErrorKind, LeaseLost, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.fs.context import Context, not_committed
from steadqd.fs.lease import Lease, Source, validate_source

__all__ = ["Validated", "mutation"]


class Validated:
    """``with handle._validated(lease) as src:`` (a class, not a generator: every payload() enters one)."""

    __slots__ = ("ctx", "lease", "src")

    def __init__(self, ctx: Context, lease: Lease) -> None:
        self.ctx = ctx
        self.lease = lease

    def __enter__(self) -> Source:
        tree = self.ctx.tree
        tree.pin()
        try:
            self.src = validate_source(self.ctx, self.lease, poison=False)
        except OSError as e:
            tree.unpin()
            raise not_committed(e, "open leased file") from e
        except BaseException:
            tree.unpin()
            raise
        return self.src

    def __exit__(self, *exc: object) -> None:
        try:
            self.src.close()
        finally:
            self.ctx.tree.unpin()


class mutation:
    """Every failure of a mutation is one of the three outcome classes.

    Errors from validation or from before the linearization point (bad
    input, busy locks, I/O before the rename) become NotCommitted with
    their kind; OutcomeUnknown, LeaseLost and EnqueueIncomplete (some jobs
    published) pass through unchanged. The
    directory cache is pinned for the block. (A class, not a generator:
    every public call enters one or more of these.)
    """

    __slots__ = ("what", "tree")

    def __init__(self, what: str, ctx: Context) -> None:
        self.what = what
        self.tree = ctx.tree

    def __enter__(self) -> None:
        self.tree.pin()

    def __exit__(self, _type: object, e: BaseException | None, _tb: object) -> None:
        self.tree.unpin()
        if e is None or isinstance(e, (NotCommitted, OutcomeUnknown, LeaseLost, EnqueueIncomplete)):
            return
        if isinstance(e, SteadQError):
            raise NotCommitted(f"{self.what}: {e.message}", e.kind) from e
        if isinstance(e, OSError):
            if e.errno == errno.ENOENT:
                raise NotCommitted(f"{self.what}: {e.strerror}", ErrorKind.IO_FAILURE) from e
            raise not_committed(e, self.what) from e
