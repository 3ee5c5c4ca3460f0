"""Witness.names_single_file is the two checks a witnessed move needs, written out in one frame.

It restates ``matches`` and ``is_single_regular`` for the hot path, so this
pins it to them over every combination that decides either: identity, file
type and link count.
"""

from __future__ import annotations

import os
import stat

import pytest

from steadqd.fs.tree import Witness, is_single_regular

_KINDS = (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR)


def _stat(mode: int, ino: int, dev: int, nlink: int) -> os.stat_result:
    return os.stat_result((mode | 0o600, ino, dev, nlink, 0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("nlink", [0, 1, 2])
@pytest.mark.parametrize(("dev", "ino"), [(7, 42), (8, 42), (7, 43), (8, 43)])
def test_names_single_file_is_matches_and_single_regular(kind: int, nlink: int, dev: int, ino: int) -> None:
    witness = Witness(7, 42)
    st = _stat(kind, ino, dev, nlink)
    assert witness.names_single_file(st) == (witness.matches(st) and is_single_regular(st))


def test_only_the_witnessed_single_regular_file_is_named() -> None:
    witness = Witness(7, 42)
    assert witness.names_single_file(_stat(stat.S_IFREG, 42, 7, 1))
    assert not witness.names_single_file(_stat(stat.S_IFREG, 42, 7, 2))  # a second name: not single
    assert not witness.names_single_file(_stat(stat.S_IFDIR, 42, 7, 1))
    assert not witness.names_single_file(_stat(stat.S_IFREG, 43, 7, 1))
