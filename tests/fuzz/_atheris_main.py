"""Shared body of the atheris harnesses: instrument steadqd, then fuzz one parser family.

Kept apart from ``targets.py`` so the hypothesis tests never import atheris.
The instrumented import must happen before anything imports steadqd, which
is why each ``atheris_<family>.py`` calls ``main`` as its first action.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(family: str, extra_instrumented: tuple[str, ...] = ()) -> None:
    """Run libFuzzer on ``targets.dispatch(family, data)`` with the command-line options given."""
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    import atheris  # only the harnesses need it

    with atheris.instrument_imports(include=["steadqd", "tests.fuzz", *extra_instrumented]):
        from tests.fuzz import targets

    def one_input(data: bytes) -> None:
        targets.dispatch(family, data)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
