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
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
MODULE = "prism_csimd._csimd"

CDEF = """
typedef struct {
    char *data;
    int64_t ne[4];
    int64_t nb[4];
    int type;
} csimd_tensor;

int csimd_cpu_isa(void);
int csimd_set_isa(int isa);
int csimd_get_isa(void);
int csimd_has_openmp(void);
int csimd_max_threads(void);

int csimd_binary(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_unary(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_soft_max(const csimd_tensor *a, const csimd_tensor *mask, const csimd_tensor *sinks, const csimd_tensor *d,
                   const float *slopes, float scale, int nth);
int csimd_norm(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_cpy(const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth);
int csimd_cross_entropy(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, float g, int back,
                        int nth);
int csimd_opt_step(int adamw, const float *p, const csimd_tensor *a, const csimd_tensor *g,
                   const csimd_tensor *m, const csimd_tensor *v, const csimd_tensor *d, int nth);
int csimd_repeat(const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_reduce(int op, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_repeat_back(const csimd_tensor *a, const csimd_tensor *d);
int csimd_rows_back(int op, float p, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_diag_mask(int inf, int64_t n_past, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_get_rows_back(const csimd_tensor *g, const csimd_tensor *idx, const csimd_tensor *d);
int csimd_out_prod(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_glu(int act, int swapped, double alpha, double limit, const csimd_tensor *a, const csimd_tensor *b,
              const csimd_tensor *d, int nth);
int csimd_index_map(int mode, const int64_t *p, int circular, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_arange(double start, double step, const csimd_tensor *d);
int csimd_argmax(const csimd_tensor *a, const csimd_tensor *d);
int csimd_xielu(double an, double ap, double beta, double eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_timestep_embedding(double max_period, const csimd_tensor *t, const csimd_tensor *d, int nth);
int csimd_group_norm(int64_t n_groups, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_argsort(int descending, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_set_rows(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d, int nth);
int csimd_count_equal(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_pool(int dims2, int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
               const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_im2col(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                 int64_t KW, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_pool_2d_back(int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
                       const csimd_tensor *g, const csimd_tensor *x, const csimd_tensor *d, int nth);
int csimd_mul_mat_id(const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids, const csimd_tensor *d,
                     int nth);
"""


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0", "false", "no")


def make_ffi(sanitize: bool | None = None, openmp: bool | None = None, relative: bool = True) -> FFI:
    sanitize = _flag("CSIMD_SANITIZE") if sanitize is None else sanitize
    openmp = (not _flag("CSIMD_NO_OPENMP")) if openmp is None else openmp
    src_dir = Path("csrc") if relative and Path("csrc/csimd.c").is_file() else HERE
    cflags = ["-O3", "-std=gnu11", "-fno-strict-aliasing", "-Wno-unknown-pragmas"]
    ldflags: list[str] = []
    if openmp:
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    if sanitize:
        cflags = [f for f in cflags if f != "-O3"] + ["-O1", "-g", "-fno-omit-frame-pointer",
                                                      "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        ldflags.append("-fsanitize=address,undefined")
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source(MODULE, '#include "csimd.h"', sources=[str(src_dir / "csimd.c")], include_dirs=[str(src_dir)],
                   # this script too: a changed build rebuilds, and sdists carry it (setup.py needs it)
                   depends=[str(src_dir / n) for n in ("csimd.h", "csimd_common.h", "csimd_impl.h", "build_csimd.py")],
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
