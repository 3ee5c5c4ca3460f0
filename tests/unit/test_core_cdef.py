"""api.h is the one source of the C core's constants, structs and prototypes (issue 35).

build.py hands cffi the header's text between its cdef markers; only the ``extern
"Python"`` callbacks are the build's own. These tests fail when the two drift apart: a declaration
written outside the markers, a callback whose type is not the table entry it fills, a module built
from another header, or an op the replay cannot name.
"""

from __future__ import annotations

import importlib.util
import os
import re

import cffi
import pytest

from steadqd.fs.compiled import bridge

HERE = os.path.dirname(bridge.__file__)
HEADER = os.path.join(HERE, "api.h")


def _build_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("claim_core_build", os.path.join(HERE, "build.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _defines(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define (SQ_\w+) (\d+)", _strip_comments(text), flags=re.M)}


def test_the_build_declares_what_the_header_declares() -> None:
    build = _build_module()
    section = build.header_cdef(HEADER)
    assert build.CDEF == section + build.CALLBACKS
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    begin, end = text.index(build.BEGIN), text.index(build.END)
    outside = _strip_comments(text[:begin] + text[end + len(build.END) :])
    for line in outside.splitlines():
        line = line.strip()
        # Only the include guard and includes live outside the markers: cffi would not see anything else.
        assert not line or re.fullmatch(r"#(ifndef|define|endif|include)\b.*", line), line
        assert not line.startswith("#define SQ_"), line
    assert "extern" not in section  # the callbacks are the build's, never C's


def test_the_header_section_parses_alone() -> None:
    ffi = cffi.FFI()
    ffi.cdef(_build_module().CDEF)
    for name in ("struct sq_stat", "struct sq_sys", "struct sq_rec", "struct sq_queue", "struct sq_claim"):
        assert ffi.sizeof(name) > 0


def test_each_callback_has_its_table_entrys_type() -> None:
    ffi = cffi.FFI()
    ffi.cdef(_build_module().CDEF)
    fields = dict(ffi.typeof("struct sq_sys").fields)
    callbacks = re.findall(r'extern "Python" [^;]*?\bsq_py_(\w+)\(', _build_module().CALLBACKS)
    assert sorted(callbacks) == sorted(fields), "one callback per table entry"
    for entry, field in fields.items():
        declared = re.search(rf'extern "Python" ([^;]*?)\bsq_py_{entry}\(([^)]*)\);', _build_module().CALLBACKS)
        assert declared is not None
        want = ffi.typeof(f"{declared[1].strip()}(*)({declared[2]})")
        assert field.type is want, (entry, field.type, want)


@pytest.mark.skipif(bridge.lib is None, reason=bridge.path())
def test_the_built_module_has_the_headers_constants() -> None:
    with open(HEADER, encoding="utf-8") as f:
        defines = _defines(f.read())
    assert defines, "the header defines the SQ_ constants"
    for name, value in defines.items():
        assert getattr(bridge.lib, name) == value, f"{name}: the module was built from another header"
    ops = {v for k, v in defines.items() if k.startswith("SQ_OP_")}
    assert set(bridge._OP_NAMES) == ops, "every recorded op has its syscall_hook name"
    assert bridge.MOVED == defines["SQ_MOVED"] and bridge.STOP_PURE == defines["SQ_STOP_PURE"]
