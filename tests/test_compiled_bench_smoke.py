"""benchmarks/compiled.py's compile step works on one small module; no speed is asserted.

The benchmark compares a scratch copy of ``steadqd`` with some ``steadqd/fs``
modules compiled by mypyc against the same copy in Python. This compiles one
small hot module (``scan_order``) the way the benchmark does, runs strict
lifecycles on the copy, and checks that the side really loaded the extension
(and that the check refuses a side that did not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import compiled, lifecycle_cpu


def test_one_module_compiles_and_the_copy_runs_it(tmp_path: Path) -> None:
    tree = compiled.copy_tree(str(tmp_path / "compiled"))
    built = compiled.compile_tree(tree, ["scan_order"])
    assert [p for p in built if Path(p).name.startswith("scan_order.cpython-")], built
    got = compiled.lifecycles(tree, ["scan_order"], "/dev/shm", 5)
    assert got["jobs_per_s"] > 0
    with pytest.raises(SystemExit, match="extension modules loaded"):
        compiled.lifecycles(tree, [], "/dev/shm", 1)  # the copy loads scan_order's .so: not a pure side


def test_python_classes_are_marked_above_their_decorators() -> None:
    src = "from __future__ import annotations\n\n@dataclass(frozen=True)\nclass JobName:\n    x: int\n"
    out = compiled.mark_python_classes(src, ["JobName"])
    assert "@mypyc_attr(native_class=False)\n@dataclass(frozen=True)\nclass JobName:" in out
    assert out.index("from mypy_extensions import mypyc_attr") < out.index("@mypyc_attr")
    with pytest.raises(SystemExit, match="Witness not found"):
        compiled.mark_python_classes(src, ["Witness"])


def test_a_module_the_benchmark_leaves_out_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not compiled here"):
        compiled.compile_tree(str(tmp_path), ["libc"])
    lifecycle_cpu.check_extensions({"steadqd.fs.names": "/x/names.py"}, [])  # a pure side passes
