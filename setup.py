"""Builds ``steadq-exec``, the job commands' exec helper (steadqd/daemon/worker/run/exec_helper.c), and
``_fastspawn``, the one-exec spawn that replaces it where built (steadqd/daemon/worker/run/spawn.c, cffi),
and ``_core``, the claim's, ack's and enqueue's happy paths in C (steadqd/fs/compiled/*.c, cffi).

Everything else is in pyproject.toml. The helper is an executable, not an
extension module, so it is linked by hand after ``build_ext``; the
distribution says it has extension modules so that ``build_ext`` runs at all
(and the wheel is marked platform-specific, which it is). In an editable
install the helper is written next to its source, as extensions are.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

HELPER_SOURCE = os.path.join("steadqd", "daemon", "worker", "run", "exec_helper.c")
HELPER_NAME = "steadq-exec"


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


class BuildExecHelper(build_ext):
    def run(self) -> None:
        super().run()
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        compiler: Any = new_compiler()
        customize_compiler(compiler)  # CC, CFLAGS and LDFLAGS from the environment (dpkg-buildflags)
        objects = compiler.compile([HELPER_SOURCE], output_dir=self.build_temp, extra_preargs=["-O2", "-Wall"])
        # customize_compiler gives LDFLAGS to shared objects only; an executable needs them too (hardening)
        ldflags = shlex.split(os.environ.get("LDFLAGS", ""))
        compiler.link_executable(objects, HELPER_NAME, output_dir=self._helper_dir(), extra_postargs=ldflags)

    def _helper_dir(self) -> str:
        if self.inplace:
            return os.path.dirname(HELPER_SOURCE)
        return os.path.join(self.build_lib, os.path.dirname(HELPER_SOURCE))

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), os.path.join(self._helper_dir(), HELPER_NAME)]


def have_libcrypto() -> bool:
    """Can this machine build against OpenSSL's libcrypto (libssl-dev)? Without it the C claim core is
    left out and claims run in pure Python (``steadq doctor`` says so), rather than the install failing."""
    import tempfile

    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler: Any = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(
                '#include <openssl/sha.h>\nint main(void) { unsigned char d[32]; SHA256((const unsigned char *)"", 0, d); return 0; }\n'
            )
        try:
            objects = compiler.compile([source], output_dir=tmp)
            compiler.link_executable(objects, "probe", output_dir=tmp, libraries=["crypto"])
        except Exception:  # noqa: BLE001 - any compile or link error means: not here
            return False
    return True


# The one-exec job spawn (steadqd/daemon/worker/run/spawn.c) and, where libcrypto can be linked, the C
# core (steadqd/fs/compiled: claim.c, settle.c, publish.c, verify.c, names.c, syscall_table.c): cffi extensions in API mode.
CFFI_MODULES = ["steadqd/daemon/worker/run/fastspawn_build.py:ffibuilder"]
if have_libcrypto():
    CFFI_MODULES.append("steadqd/fs/compiled/build.py:ffibuilder")
else:
    print("setup.py: OpenSSL's libcrypto headers not found (libssl-dev): the C claim core is not built")

setup(
    distclass=BinaryDistribution,
    cmdclass={"build_ext": BuildExecHelper},
    cffi_modules=CFFI_MODULES,
)
