"""cffi (API mode) build script of ``prism_csimd._csimd``.

Used by the project's ``setup.py`` (``cffi_modules``) at ``pip install``; no ``-march``
flag is passed: the AVX2 and AVX-512 kernels carry ``target`` attributes and are chosen at
run time. Environment:

* ``CSIMD_SANITIZE=1``: build with ``-fsanitize=address,undefined`` (see csrc/README.md).
* ``CSIMD_NO_OPENMP=1``: build without OpenMP (serial kernels).
* ``MAX_JOBS=N``: compile at most N translation units at a time (default: the CPUs this process may use);
  the variable PyTorch's and other projects' extension builds read. setuptools compiles one extension's
  sources one after another: ``compile_in_parallel`` makes the compiler of setup.py's build (and of
  this script's) run them side by side.

Run directly to build a module into a folder of its own (e.g. the sanitized one)::

    python csrc/build_csimd.py --sanitize --out build/csimd-asan
    # -> build/csimd-asan/prism_csimd/_csimd.*.so; select it with PRISM_CSIMD_LIBRARY=<that file>
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "prism_csimd._csimd"
# the translation units: the entry points, and one copy of the kernel template per path (csimd_kernels.h); a
# path of another architecture compiles to nothing, so one list serves every target (tests/test_arm64_qemu.py
# cross-compiles it)
SOURCES = ("csimd.c", "csimd_path_scalar.c", "csimd_path_avx2.c", "csimd_path_avxvnni.c", "csimd_path_avx512.c",
           "csimd_path_neon.c", "csimd_path_dotprod.c", "csimd_path_i8mm.c")

def cdef_from_header() -> str:
    """The declarations of csimd.h (the struct and the functions, comments and preprocessor
    lines dropped): the header is the one place the C interface is written."""
    text = (HERE / "csimd.h").read_text()
    body = text[text.index("typedef struct"): text.rindex("#endif")]
    return re.sub(r"/\*.*?\*/", "", body, flags=re.S)


def build_jobs() -> int:
    """How many sources to compile at a time: MAX_JOBS when set to a positive number, else the CPUs this
    process may run on (prism_core.contention.usable_cpus's rule; prism_core is not importable in an isolated
    build)."""
    value = os.environ.get("MAX_JOBS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_in_parallel(compiler, jobs: int) -> None:
    """Make a distutils/setuptools Unix compiler compile the sources of one call `jobs` at a time (threads,
    each waiting on its compiler process); the call still raises the first CompileError. Other compilers
    (MSVC's compile does not go through _compile) are left serial."""
    if jobs <= 1 or getattr(compiler, "compiler_type", "") != "unix":
        return

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for _ in pool.map(one, [o for o in objects if o in build]):
                pass
        return objects

    compiler.compile = compile


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


def make_ffi(sanitize: bool | None = None, openmp: bool | None = None, relative: bool = True) -> FFI:
    sanitize = _flag("CSIMD_SANITIZE") if sanitize is None else sanitize
    openmp = (not _flag("CSIMD_NO_OPENMP")) if openmp is None else openmp
    src_dir = Path("csrc") if relative and Path("csrc/csimd.c").is_file() else HERE
    # -fno-math-errno: sqrtf and friends compile to the vector instruction (no libm call for errno)
    cflags = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-fno-math-errno", "-Wno-unknown-pragmas"]
    ldflags: list[str] = []
    if openmp:
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    if sanitize:
        # -g1: line tables, all a sanitizer's stack trace reads (full -g costs a third of this build's CPU).
        # -fno-wrapv undoes Python's -fwrapv: signed overflow is then undefined, so UBSan checks it (with
        # -fwrapv it cannot), and the instrumented build takes 40% less CPU
        cflags = [f for f in cflags if f != "-O3"] + ["-O1", "-g1", "-fno-omit-frame-pointer", "-fno-wrapv",
                                                      "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        ldflags.append("-fsanitize=address,undefined")
    ffi = FFI()
    ffi.cdef(cdef_from_header())
    ffi.set_source(MODULE, '#include "csimd.h"', sources=[str(src_dir / n) for n in SOURCES],
                   include_dirs=[str(src_dir)],
                   # every header, and this script: a changed build rebuilds, and sdists carry it (setup.py needs it)
                   depends=[str(src_dir / n) for n in (*sorted(p.name for p in HERE.glob("*.h")), "build_csimd.py")],
                   extra_compile_args=cflags, extra_link_args=ldflags, libraries=["m"])
    return ffi


ffibuilder = make_ffi()


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description="build prism_csimd._csimd into a folder of its own")
    p.add_argument("--sanitize", action="store_true", help="-fsanitize=address,undefined")
    p.add_argument("--no-openmp", action="store_true")
    p.add_argument("--out", default="build/csimd", help="output folder (default build/csimd)")
    args = p.parse_args(argv)
    ffi = make_ffi(sanitize=args.sanitize, openmp=not args.no_openmp, relative=False)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(build_into(ffi, out))
    return 0


def build_into(ffi: FFI, out: Path) -> str:
    """What ffi.compile(tmpdir=out) does (the generated glue and every object in out, the module under
    out/prism_csimd), the sources compiled in parallel; returns the module's path."""
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    class ParallelBuildExt(build_ext):
        def build_extension(self, ext):
            compile_in_parallel(self.compiler, build_jobs())
            super().build_extension(ext)

    ext = ffi.distutils_extension(tmpdir=str(out), verbose=False)
    dist = Distribution({"ext_modules": [ext], "cmdclass": {"build_ext": ParallelBuildExt}})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = cmd.build_temp = str(out)
    cmd.force = True
    dist.run_command("build_ext")
    [path] = cmd.get_outputs()
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
