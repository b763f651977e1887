"""Builds the optional C extension of the csimd backend (prism_csimd._csimd, cffi API mode).

Everything else is declared in pyproject.toml. The extension is optional: when it cannot be
compiled (no C compiler, no OpenMP, a failing compiler) the install still succeeds, a warning
is printed, and the csimd backend reports itself unavailable with the reason. Its translation units
are compiled in parallel: as many at a time as the process has CPUs, or MAX_JOBS (or build_ext's
``--parallel N``) where set.
"""

import importlib.util
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SCRIPT = os.path.join(HERE, "csrc", "build_csimd.py")


def _build_script():
    """csrc/build_csimd.py as a module (its parallel compile); it is there whenever an extension is built."""
    spec = importlib.util.spec_from_file_location("_csimd_build_script", BUILD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OptionalBuildExt(build_ext):
    """build_ext that compiles an extension's sources in parallel, retries without OpenMP and then gives
    up quietly on failure."""

    failed: set[str] = set()

    def build_extension(self, ext):
        try:
            script = _build_script()
            script.compile_in_parallel(self.compiler, int(self.parallel) if self.parallel else script.build_jobs())
        except Exception as e:  # noqa: BLE001 - the serial compile still builds it
            sys.stderr.write(f"warning: {ext.name}'s sources are compiled one at a time ({type(e).__name__}: {e})\n")
        if "-g1" not in ext.extra_compile_args:  # a sanitized build asks for its line tables itself
            # Python's CFLAGS ask for -g: debug info makes a quarter of csimd's compile time (13 of 46 s of CPU)
            # and no error report reads it
            ext.extra_compile_args = [*ext.extra_compile_args, "-g0"]
        try:
            super().build_extension(ext)
            return
        except Exception as e:  # noqa: BLE001 - CompileError, LinkError, missing compiler, ...
            first = e
        if "-fopenmp" in ext.extra_compile_args:
            ext.extra_compile_args = [f for f in ext.extra_compile_args if f != "-fopenmp"]
            ext.extra_link_args = [f for f in ext.extra_link_args if f != "-fopenmp"]
            try:
                super().build_extension(ext)
                sys.stderr.write(f"warning: {ext.name} built without OpenMP ({first})\n")
                return
            except Exception as e:  # noqa: BLE001
                first = e
        self.failed.add(ext.name)
        sys.stderr.write(f"warning: the optional extension {ext.name} was not built ({type(first).__name__}: "
                         f"{first}); the csimd backend will report itself unavailable\n")

    def _without_failed(self, method):
        keep = self.extensions
        self.extensions = [e for e in keep if e.name not in self.failed]
        try:
            return method()
        finally:
            self.extensions = keep

    def copy_extensions_to_source(self):
        return self._without_failed(super().copy_extensions_to_source)

    def get_outputs(self):
        return self._without_failed(super().get_outputs)

    def get_output_mapping(self):
        return self._without_failed(super().get_output_mapping)


kwargs = {}
try:
    import cffi  # noqa: F401 - a build requirement; without it the backend is simply not built

    if os.path.isfile(BUILD_SCRIPT):
        kwargs["cffi_modules"] = ["csrc/build_csimd.py:ffibuilder"]
    else:
        sys.stderr.write("warning: csrc/build_csimd.py is missing; the csimd backend's extension is not built\n")
except ImportError:
    sys.stderr.write("warning: cffi is missing; the csimd backend's extension is not built\n")

setup(cmdclass={"build_ext": OptionalBuildExt}, **kwargs)
