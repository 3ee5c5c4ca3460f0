"""cffi (API, out-of-line) build of ``steadqd.fs.compiled._core`` from SOURCES (``setup.py`` runs it).

``python steadqd/fs/compiled/build.py`` builds it in place by hand; ``pip install -e .``
does it through setup.py's ``cffi_modules``. SHA-256 comes from the system's OpenSSL libcrypto
(build: libssl-dev; run: libssl3 / libcrypto, which Python's own hashlib links on Debian).
Without the module the claim runs in pure Python (steadqd.fs.compiled.bridge says which path runs).
"""

from __future__ import annotations

import os

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))

# One file per Python module it mirrors (core.h: what they share), the syscall table in its own.
SOURCES = ("claim.c", "lease.c", "settle.c", "publish.c", "verify.c", "names.c", "scan.c", "syscall_table.c")

BEGIN, END = "/* cdef-begin */", "/* cdef-end */"

# The callbacks of the hooked syscall table (bridge.py defines them): the only declarations that
# are not the header's, since C never names them. tests/unit/test_core_cdef.py checks that each
# has the type of the struct sq_sys entry it fills.
CALLBACKS = """
extern "Python" int sq_py_openat(int, const char *, int);
extern "Python" int sq_py_fstat(int, struct sq_stat *);
extern "Python" int64_t sq_py_pread(int, unsigned char *, int64_t, int64_t);
extern "Python" int sq_py_lstatat(int, const char *, struct sq_stat *);
extern "Python" int sq_py_rename_noreplace(int, const char *, int, const char *);
extern "Python" int sq_py_fsync(int);
extern "Python" int sq_py_tmpfile(int, int);
extern "Python" int64_t sq_py_write(int, const unsigned char *, int64_t);
extern "Python" int sq_py_link(int, int, const char *, int);
extern "Python" int64_t sq_py_getdents(int, unsigned char *, int64_t);
"""


def header_cdef(path: str = os.path.join(HERE, "api.h")) -> str:
    """The header's text between its cdef markers: constants, structs and prototypes, written once."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"{path}: no {BEGIN} ... {END} section")
    return text[begin + len(BEGIN) : end]


CDEF = header_cdef() + CALLBACKS

ffibuilder = cffi.FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "steadqd.fs.compiled._core",
    '#include "api.h"',
    sources=[os.path.relpath(os.path.join(HERE, f)) for f in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    depends=[os.path.relpath(os.path.join(HERE, f)) for f in ("api.h", "core.h")],
    libraries=["crypto"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    # The name `pip install -e .` gives it (a limited-API build): a by-hand build under the interpreter's own
    # suffix would be imported before it, and a later reinstall would leave that one, stale, in front.
    ffibuilder.compile(tmpdir=os.path.join(HERE, "..", "..", ".."), target="_core.abi3.so", verbose=True)
