"""docs/security.md's threat tables: every row names a test, and every test it names exists.

The standing rule (a new input surface gets its table, a test per row) is
only real if a row cannot point at a test that was renamed or never written.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
# tests/x/test_y.py::test_name, or ::test_name after a full reference in the same cell
REF = re.compile(r"(tests/[\w/]+\.py)?::(\w+)")
FILE = re.compile(r"tests/[\w/]+\.py")


def _tables() -> list[tuple[str, list[str]]]:
    text = DOC.read_text()
    start = text.index("## Threat tables, one per input surface")
    end = text.index("\n## ", start + 1)
    rows: list[tuple[str, list[str]]] = []
    section = ""
    for line in text[start:end].splitlines():
        if line.startswith("### "):
            section = line[4:]
        elif line.startswith("| ") and not line.startswith("| Who can write it"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((section, cells))
    return rows


@cache
def _functions(path: str) -> frozenset[str]:
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def test_every_surface_the_issue_names_has_a_table() -> None:
    sections = {s for s, _ in _tables()}
    for surface in (
        "Queue tree",
        "Watch folder",
        "Watch folder state",
        "Metrics directory",
        "Doorbell sockets",
        "Bucket objects and keys",
        "Job processes and output",
        "Job environment",
        "Config files",
        "Python payloads",
    ):
        assert surface in sections, surface


def test_every_row_names_a_test_that_exists() -> None:
    rows = _tables()
    assert len(rows) > 50
    for section, cells in rows:
        assert len(cells) == 4, (section, cells)
        test_cell = cells[3]
        refs = REF.findall(test_cell)
        files = FILE.findall(test_cell)
        assert refs or files, f"{section}: a row without a test: {cells[1]}"
        current = None
        for path, name in refs:
            current = path or current
            assert current is not None, (section, test_cell)
            assert (ROOT / current).is_file(), f"{section}: {current} does not exist"
            assert name in _functions(current), f"{section}: {current}::{name} does not exist"
        for path in files:
            assert (ROOT / path).is_file(), f"{section}: {path} does not exist"
