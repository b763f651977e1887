"""Two builds of csimd's extension side by side in one process: quantized products per format and path, beside ggml.

``python -m benchmarks.csimd_ab BEFORE.so AFTER.so [--formats Q4_1,Q2_K] [--isas avx512,avx2] [--rounds 5] [--n 1]``:
n x 2048 x 2048, one thread. Both ``_csimd`` modules are loaded (``importlib``, as ``PRISM_CSIMD_LIBRARY`` does)
and ``csimd_q_mul_mat`` is called directly on each path, so a change's before/after and ggml are timed in
interleaved rounds of one process (a shared machine's load then weighs on every column alike). Columns
``before:ISA``, ``after:ISA``; GOPS (2 * n * k * m per product), best of ``--rounds``, ratios against ggml.
Build a module apart with ``python csrc/build_csimd.py --out DIR`` (csrc/README.md), e.g. from main's checkout.
"""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np

from prism_core.types import GGMLType, traits

from .ggml_peer import GgmlMulMat, ggml, rate
from .isa_matvec import FORMATS
from .quantized import weight_blocks

ISAS = ("scalar", "avx2", "avx512", "avxvnni", "neon", "dotprod", "i8mm")  # CSIMD_ISA_* order (csrc/csimd.h)
QBASE = 64  # csrc/csimd.h: CSIMD_QBASE, a block type's descriptor code


def load(path: str, name: str):
    """(ffi, lib) of the csimd extension module at path, loaded under its own package name."""
    spec = importlib.util.spec_from_file_location(f"{name}._csimd", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path!r} is not a loadable extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


def product(ffi, lib, t: GGMLType, w: np.ndarray, x: np.ndarray, d: np.ndarray, isa: int):
    """A call computing d = mul_mat(w, x) with the module's quantized kernels on path isa."""
    (n, k), m, tr = x.shape, w.shape[0], traits(t)

    def desc(a: np.ndarray, ne: tuple[int, ...], nb: tuple[int, ...], typ: int):
        return ffi.new("csimd_tensor *", (ffi.cast("char *", ffi.from_buffer(a)), ne, nb, typ))
    wd = desc(w, (k, m, 1, 1), (tr.type_size, w.shape[1], w.nbytes, w.nbytes), QBASE + int(t))
    xd = desc(x, (k, n, 1, 1), (4, 4 * k, x.nbytes, x.nbytes), 0)
    dd = desc(d, (m, n, 1, 1), (4, 4 * m, d.nbytes, d.nbytes), 0)
    at = int(tr.vec_dot_type)

    def call() -> None:
        if lib.csimd_set_isa(isa) != 0 or lib.csimd_q_mul_mat(wd, xd, dd, at, 1) != 0:
            raise RuntimeError(f"csimd_q_mul_mat failed for {t.name} on {ISAS[isa]}")
    return call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--isas", default="avx512,avx2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1, help="activation rows (default 1: matrix-vector)")
    args = ap.parse_args(argv)
    if ggml is None:
        ap.error("ggml-python is not installed: it is the column the ratios are taken against")
    builds = {"before": load(args.before, "csimd_before"), "after": load(args.after, "csimd_after")}
    isas = args.isas.split(",")
    for i in isas:
        if i not in ISAS or any(lib.csimd_isa_runs(ISAS.index(i)) == 0 for _, lib in builds.values()):
            ap.error(f"this CPU does not run csimd path {i!r}")
    k = m = 2048
    ops, rng = 2.0 * args.n * k * m, np.random.default_rng(0)
    cols = ["ggml"] + [f"{b}:{i}" for i in isas for b in builds]
    print(f"{args.n}x{k}x{m}, 1 thread, GOPS (best of {args.rounds} rounds); ratios against ggml")
    print(f"{'format':<8}" + "".join(f"{c:>18}" for c in cols))
    for name in args.formats.split(","):
        t = GGMLType[name]
        w = weight_blocks(t, m, k, rng)
        x = rng.standard_normal((args.n, k), dtype=np.float32)
        d = np.empty((args.n, m), np.float32)
        runs = {"ggml": GgmlMulMat(t, w, x, 1)}
        for b, (ffi, lib) in builds.items():
            for i in isas:
                runs[f"{b}:{i}"] = product(ffi, lib, t, w, x, d, ISAS.index(i))
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for c, fn in runs.items():
                best[c] = max(best.get(c, 0.0), rate(fn, ops))
        g = best["ggml"]
        cells = [f"{best[c]:7.1f}" + ("" if c == "ggml" else f" ({best[c] / g:4.2f}x)") for c in cols]
        print(f"{name:<8}" + "".join(f"{cell:>18}" for cell in cells), flush=True)
        runs["ggml"].close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
