"""Names from the tree never reach the terminal raw (issue 15, item 7).

A group member of a shared queue can create any file name in ``ready/``;
``steadq fsck`` used to print it as it was, so ESC sequences reached the
terminal and a newline forged an extra output line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from steadqd import Queue
from tests.cli.helpers import STEADQ, steadq

HOSTILE = "x\nOK\x1b[2J\r.sqj"  # ASCII: a non-ASCII name is shown as <bytes:hex> already


def test_fsck_escapes_a_hostile_name(queue: Queue, queue_path: str) -> None:
    with open(os.path.join(queue_path, "ready", "0000", HOSTILE), "w"):
        pass
    res = steadq("fsck", queue_path)
    for stream in (res.out, res.err):
        assert "\x1b" not in stream and "\r" not in stream
    assert not any(line.startswith("OK") for line in res.out_lines)  # no forged line
    (line,) = [ln for ln in res.out_lines if ln.startswith("ERROR ")]
    assert "x\\nOK\\x1b[2J\\r.sqj" in line


def test_printable_keeps_ordinary_text() -> None:
    from steadqd.text import printable

    assert printable("ready/0000/ab.sqj: état ok, 3 jobs") == "ready/0000/ab.sqj: état ok, 3 jobs"
    assert printable("\x00\x7f\x9b\u2028") == "\\x00\\x7f\\x9b\\u2028"


def test_bulk_put_print_ids_escapes_a_source_name_that_is_not_utf8(qpath: str, tmp_path: Path) -> None:
    """A byte that is not UTF-8 (0x9b is CSI to an 8-bit terminal) went out raw through surrogateescape."""
    source = tmp_path / "in"
    source.mkdir()
    (source / os.fsdecode(b"frame\x9b2J\xff")).write_bytes(b"x")
    assert STEADQ is not None
    p = subprocess.run([STEADQ, "put", "--dir", source, "--print-ids", qpath], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.splitlines()
    assert line.split(b" ", 1)[1] == b"frame\\x9b2J\\xff"


def test_printable_escapes_undecodable_bytes_as_the_bytes_they_were() -> None:
    from steadqd.text import printable

    assert printable(b"a\x9b\xffz".decode("utf-8", "surrogateescape")) == "a\\x9b\\xffz"
