"""The two context managers every public call of :class:`steadqd.fs.handle.Queue` enters.

``mutation`` turns any failure of a mutation into one of the three outcome
classes (errors.md); ``Validated`` holds a leased job's source file open and
checked while a payload is read. Both pin the directory cache for the block.
The hottest calls (enqueue, ack, payload()) take the same steps without the
context-manager object: :func:`guarded` and :func:`validated_source`.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, TypeVar

from steadqd.errors import EnqueueIncomplete, ErrorKind, LeaseLost, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.fs.context import Context, not_committed
from steadqd.fs.lease import Lease, Source, validate_source

__all__ = ["Validated", "guarded", "mutation", "raise_outcome", "validated_source"]

T = TypeVar("T")


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
            self.src = validated_source(self.ctx, self.lease)
        except BaseException:
            tree.unpin()
            raise
        return self.src

    def __exit__(self, *exc: object) -> None:
        try:
            self.src.close()
        finally:
            self.ctx.tree.unpin()


def validated_source(ctx: Context, lease: Lease) -> Source:
    """The lease's source validated for reading (the cache pinned by the caller); an OSError is NotCommitted."""
    try:
        return validate_source(ctx, lease, poison=False)
    except OSError as e:
        raise not_committed(e, "open leased file") from e


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
        if e is not None:
            raise_outcome(self.what, e)


def raise_outcome(what: str, e: BaseException) -> None:
    """:class:`mutation`'s rule for a failure ``e`` of mutation ``what``: raise
    its NotCommitted, or return when ``e`` passes through unchanged (the caller re-raises it)."""
    if isinstance(e, (NotCommitted, OutcomeUnknown, LeaseLost, EnqueueIncomplete)):
        return
    if isinstance(e, SteadQError):
        raise NotCommitted(f"{what}: {e.message}", e.kind) from e
    if isinstance(e, OSError):
        if e.errno == errno.ENOENT:
            raise NotCommitted(f"{what}: {e.strerror}", ErrorKind.IO_FAILURE) from e
        raise not_committed(e, what) from e


def guarded(what: str, ctx: Context, fn: Callable[..., T], *args: Any) -> T:
    """``with mutation(what, ctx): return fn(*args)`` in one frame, the same
    steps in the same order (pin; the call; unpin; the failure's outcome): the
    enqueue and ack of every job come here, and the context manager is an
    object and two method calls more."""
    tree = ctx.tree
    tree.pin()
    try:
        result = fn(*args)
    except BaseException as e:
        tree.unpin()
        raise_outcome(what, e)
        raise
    tree.unpin()
    return result
