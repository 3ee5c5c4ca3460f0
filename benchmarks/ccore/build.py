"""cffi API-mode (out-of-line) build of ``steadqd.fs._core`` from ``core.c`` beside this file (issue 35, prototype (b)).

Only ever built into a scratch copy of ``steadqd`` (:func:`benchmarks.ccore.make_tree`):
the product's setup.py does not know it. SHA-256 comes from the system's OpenSSL
libcrypto, the library Python's own hashlib uses (build needs a C compiler, cffi and
OpenSSL's headers: libssl-dev).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))

ffibuilder = FFI()
ffibuilder.cdef(
    """
    int sq_envelope(const unsigned char *head, size_t head_len, uint64_t file_size, uint64_t max_payload);
    int sq_payload(const unsigned char *data, size_t data_len, uint64_t offset, uint64_t length,
                   const unsigned char *digest);
    """
)
with open(os.path.join(_HERE, "core.c"), encoding="utf-8") as f:
    _SOURCE = f.read()
ffibuilder.set_source(
    "steadqd.fs._core",
    _SOURCE,
    libraries=["crypto"],
    # SHA256_Init/Update/Final are deprecated in OpenSSL 3 but kept; EVP's would allocate a context per call.
    extra_compile_args=["-O2", "-Wall", "-Wno-deprecated-declarations"],
)


def build(fs_dir: str) -> str:
    """Compile the module and copy it into ``fs_dir`` (a copy's ``steadqd/fs``); return its path.

    Raises cffi's ``VerificationError`` (or ``OSError``) without a compiler or OpenSSL's headers.
    """
    with tempfile.TemporaryDirectory() as tmp:
        built = ffibuilder.compile(tmpdir=tmp, verbose=False)
        return shutil.copy(built, os.path.join(fs_dir, os.path.basename(built)))
