"""Regenerate the committed seed corpus ``tests/fuzz/corpus/<family>/`` from ``targets.seeds()``.

Each file is one harness input: byte 0 selects the parser within the family
(``targets.dispatch``), the rest is a valid vector. Run from the repository
root: ``.venv/bin/python -m tests.fuzz.make_corpus``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.fuzz.targets import seeds

CORPUS = Path(__file__).resolve().parent / "corpus"


def main() -> None:
    for family, index, data in seeds():
        entry = bytes([index]) + data
        out = CORPUS / family / f"seed-{index}-{hashlib.sha256(entry).hexdigest()[:16]}"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(entry)


if __name__ == "__main__":
    main()
