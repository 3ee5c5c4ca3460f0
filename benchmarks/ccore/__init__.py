"""Issue 35's prototype (b): the envelope check of a job file in C, in a scratch copy of ``steadqd`` only.

Measured, it did not win (docs/performance.md, "Compiled hot path: the
prototypes"), so the product carries no trace of it: no dormant branch in
``steadqd/fs/verify.py``. (What won is the C claim core, steadqd/fs/compiled: a whole
claim per call; the scratch copy is made without its built module, so it claims in Python.) :func:`make_tree` rebuilds
the tree that was measured from the checkout, as ``benchmarks/compiled.py``
does for prototype (a):

- ``steadqd`` copied (sources only) to a scratch directory;
- ``hook.patch`` applied to the copy: ``verify.read_envelope`` asks the C
  first, ``JobHeader.decoded`` unpacks a header the C accepted, and the
  payload checks skip the digest the C already compared;
- ``ccore.py`` copied in as ``steadqd/fs/ccore.py`` (which path runs;
  ``STEADQ_PURE_PYTHON=1`` forces the Python);
- ``core.c`` built by cffi into the copy as ``steadqd.fs._core``
  (``build.py``: a C compiler, cffi, OpenSSL's headers).

``python -m benchmarks.lifecycle_cpu --ccore`` measures the copy against
itself under ``STEADQ_PURE_PYTHON=1``; tests/test_ccore_bench.py runs the C
against the Python on generated and hostile files.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from benchmarks.ccore import build
from benchmarks.common import copy_tree

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH = os.path.join(HERE, "hook.patch")


def make_tree(dest: str) -> str:
    """``dest/steadqd``: the checkout's package with the C envelope core hooked in and built; return ``dest``.

    Raises SystemExit when ``hook.patch`` no longer applies (the checkout's verify.py or records.py moved on),
    and cffi's ``VerificationError`` when the C cannot be built here.
    """
    copy_tree(dest)
    fs_dir = os.path.join(dest, "steadqd", "fs")
    # git apply outside a repository works like patch(1); the ceiling keeps it so even when ``dest`` lies
    # inside one (else it would apply the paths relative to that repository's top).
    ceiling = {**os.environ, "GIT_CEILING_DIRECTORIES": os.path.dirname(os.path.abspath(dest))}
    r = subprocess.run(
        ["git", "apply", "-p1", PATCH], cwd=dest, env=ceiling, capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise SystemExit(f"benchmarks/ccore/hook.patch no longer applies to the checkout's steadqd: {r.stderr}")
    shutil.copy(os.path.join(HERE, "ccore.py"), os.path.join(fs_dir, "ccore.py"))
    build.build(fs_dir)
    return dest
