"""Which envelope check runs: the compiled C core or the Python that defines it (issue 35, prototype (b)).

Copied by ``benchmarks/ccore`` into a scratch copy of ``steadqd`` as
``steadqd/fs/ccore.py``, never part of the product. ``steadqd.fs._core`` is
``core.c`` built by cffi in API mode (``build.py``). It only ever
*accepts*: when it does not, the Python in ``records``/``verify`` runs on
the same bytes and raises the spec's error. Without the module, or with
``STEADQ_PURE_PYTHON=1``, the Python runs alone; :func:`core_path` says
which and why, for the tests that run the core on both.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["PURE_PYTHON_ENV", "LIB", "core_path"]

PURE_PYTHON_ENV = "STEADQ_PURE_PYTHON"


def _load() -> tuple[Any, str]:
    forced = os.environ.get(PURE_PYTHON_ENV, "")
    if forced not in ("", "0"):
        return None, f"python ({PURE_PYTHON_ENV}={forced})"
    try:
        from steadqd.fs import _core  # type: ignore[attr-defined]  # built by cffi; absent without a compiler
    except ImportError as e:
        return None, f"python (the compiled core is not built: {e})"
    return _core.lib, f"compiled ({os.path.basename(_core.__file__)})"


# The C functions (sq_envelope, sq_payload) or None; read once at import, as the hot path asks per job.
LIB, _WHY = _load()


def core_path() -> tuple[str, str]:
    """("compiled" or "python", the reason): which envelope check this process runs."""
    return ("compiled" if LIB is not None else "python"), _WHY
