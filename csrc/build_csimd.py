"""cffi (API mode) build script of ``prism_csimd._csimd``.

Used by the project's ``setup.py`` (``cffi_modules``) at ``pip install``; no ``-march``
flag is passed: the AVX2 and AVX-512 kernels carry ``target`` attributes and are chosen at
run time. Environment:

* ``CSIMD_SANITIZE=1``: build with ``-fsanitize=address,undefined`` (see csrc/README.md).
* ``CSIMD_NO_OPENMP=1``: build without OpenMP (serial kernels).

Run directly to build a module into a folder of its own (e.g. the sanitized one)::

    python csrc/build_csimd.py --sanitize --out build/csimd-asan
    # -> build/csimd-asan/prism_csimd/_csimd.*.so; select it with PRISM_CSIMD_LIBRARY=<that file>
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "prism_csimd._csimd"

def cdef_from_header() -> str:
    """The declarations of csimd.h (the struct and the functions, comments and preprocessor
    lines dropped): the header is the one place the C interface is written."""
    text = (HERE / "csimd.h").read_text()
    body = text[text.index("typedef struct"): text.rindex("#endif")]
    return re.sub(r"/\*.*?\*/", "", body, flags=re.S)


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
        # -g1: line tables, all a sanitizer's stack trace reads (full -g costs a third of this build's CPU)
        cflags = [f for f in cflags if f != "-O3"] + ["-O1", "-g1", "-fno-omit-frame-pointer",
                                                      "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        ldflags.append("-fsanitize=address,undefined")
    ffi = FFI()
    ffi.cdef(cdef_from_header())
    ffi.set_source(MODULE, '#include "csimd.h"', sources=[str(src_dir / "csimd.c")], include_dirs=[str(src_dir)],
                   # this script too: a changed build rebuilds, and sdists carry it (setup.py needs it)
                   depends=[str(src_dir / n) for n in ("csimd.h", "csimd_common.h", "csimd_impl.h", "csimd_attn.h",
                                                       "csimd_rope.h", "csimd_pool.h", "csimd_quant.h",
                                                       "csimd_quant_impl.h", "csimd_quant_api.h", "csimd_iq_tables.h",
                                                       "csimd_quant_batch.h", "csimd_quant_avx2.h",
                                                       "csimd_quant_avx512.h", "csimd_quant_batch_avx2.h",
                                                        "csimd_quantize_k3iq4.h", "csimd_quantize_weighted.h",
                                                        "csimd_quantize_grid.h", "csimd_quantize_rows.h",
                                                        "csimd_quantize_x86.h",
                                                        "csimd_threads.h", "csimd_scratch.h",
                                                        "csimd_neon.h", "csimd_neon_quant.h", "csimd_neon_paths.h",
                                                       "build_csimd.py")],
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
    path = ffi.compile(tmpdir=str(out), verbose=False)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
