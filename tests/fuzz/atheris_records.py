"""atheris (libFuzzer) harness for the records parsers; see targets.FAMILIES["records"] and docs/security.md.

Usage (from the repository root; new corpus entries go to the FIRST directory,
so give a scratch directory first to keep the committed seeds unchanged)::

    .venv/bin/python tests/fuzz/atheris_records.py /tmp/corpus-records tests/fuzz/corpus/records -max_total_time=60
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fuzz._atheris_main import main  # noqa: E402

if __name__ == "__main__":
    main("records", ())
