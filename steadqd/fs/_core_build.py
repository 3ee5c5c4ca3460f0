"""cffi API-mode (out-of-line) build of ``steadqd.fs._core`` from ``steadqd/fs/core.c`` (issue 35, prototype (b)).

setup.py names this file in ``cffi_modules``; ``python steadqd/fs/_core_build.py``
builds the module in place by hand. SHA-256 comes from the system's OpenSSL
libcrypto, the library Python's own hashlib uses.
"""

from __future__ import annotations

import os

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

if __name__ == "__main__":
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        built = ffibuilder.compile(tmpdir=tmp, verbose=False)
        shutil.copy(built, os.path.join(_HERE, os.path.basename(built)))
