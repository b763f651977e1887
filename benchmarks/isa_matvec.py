"""Quantized matrix-vector products per format and per instruction-set path, beside ggml.

``python -m benchmarks.isa_matvec [--formats Q4_0,Q6_K] [--rounds 5]``: 1 x 2048 x 2048 (one
activation row), one thread, every csimd path this CPU runs (``PRISM_CSIMD_ISA``: scalar, avx2,
avxvnni, avx512 on x86-64; scalar, neon, dotprod, i8mm on arm64), numba's integer path as this process
compiled it (its ISA is fixed at import: run again with ``PRISM_NUMBA_ISA=avx2``, or an AVX2 target, for
another; left out where numba is not installed), and ggml's CPU backend
(ggml-python, as built for this machine; ``--ggml-peer avx2=PYTHON``, repeatable, adds the ggml-python of another
interpreter as column ``ggml:avx2``, e.g. a venv built for AVX2 only as docs/isa.md shows, and ``--base`` names
the column the ratios are taken against; ``--paths avx2`` times only the csimd paths named, ``--no-numba``
leaves numba's column out, ``--clock cpu`` times the calling thread's CPU time, steadier on a shared
machine). GOPS (2 * k * m per product), best of ``--rounds``
interleaved rounds, each the mean of enough calls to fill 0.1 s. Timings depend on the machine's
load: take them under ``flock /work/coord/bench.lock`` on a shared one.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import prism_core as pc
from prism_core.types import GGMLType, traits

from .ggml_peer import GgmlMulMat, RemoteGgml, ggml, rate
from .quantized import weight_blocks

FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
           "MXFP4")
ISAS = ("scalar", "avx2", "avxvnni", "avx512", "neon", "dotprod", "i8mm")


def _csimd_paths() -> list[str]:
    be = pc.backend("csimd")
    from prism_csimd import ISA_NAMES, kernels
    runs = [n for n in ISAS if kernels._state["lib"].csimd_isa_runs(ISA_NAMES.index(n))]
    be.availability()
    return runs


def _set_isa(isa: str) -> None:
    os.environ["PRISM_CSIMD_ISA"] = isa
    ok, why = pc.backend("csimd").availability()
    assert ok, why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--ggml-peer", action="append", default=[], metavar="NAME=PYTHON",
                    help="another interpreter whose ggml-python is timed too, as column ggml:NAME")
    ap.add_argument("--base", default="ggml", help="the column the ratios are against (default: ggml)")
    ap.add_argument("--paths", default=None,
                    help="csimd paths to time, comma-separated (default: every one this CPU runs)")
    ap.add_argument("--no-numba", action="store_true", help="leave numba's column out (no compile)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time each call's thread CPU time (steadier on a shared machine; one thread only)")
    args = ap.parse_args(argv)
    peers = {}
    for spec in args.ggml_peer:
        name, sep, python = spec.partition("=")
        if not sep or not name or not python:
            ap.error(f"--ggml-peer wants NAME=PYTHON, got {spec!r}")
        peers[f"ggml:{name}"] = RemoteGgml(python)
    os.environ["PRISM_NUM_THREADS"] = "1"
    rng = np.random.default_rng(0)
    k, m = args.k, args.m
    ops = 2.0 * k * m
    isas = _csimd_paths()
    if args.paths is not None:
        unknown = sorted(set(args.paths.split(",")) - set(isas))
        if unknown:
            ap.error(f"--paths: {', '.join(unknown)} not run by this CPU (it runs {', '.join(isas)})")
        isas = [i for i in isas if i in args.paths.split(",")]
    numba_col: list[str] = []
    try:
        if not args.no_numba:
            from prism_numba import _qvec
            numba_col = [f"numba:{_qvec.MODE}"]
    except ImportError as e:  # numba not installed (its column is left out, said so)
        print(f"numba: not measured ({e})")
    cols = (["ggml"] if ggml is not None else []) + list(peers) + [f"csimd:{i}" for i in isas] + numba_col
    if args.base not in cols:
        ap.error(f"--base {args.base!r} is not a column ({', '.join(cols)})")
    print(f"1x{k}x{m}, 1 thread, GOPS (best of {args.rounds} rounds, {args.clock} clock); ratios against {args.base}")
    print(f"{'format':<8}" + "".join(f"{c:>22}" for c in cols))
    for name in args.formats.split(","):
        t = GGMLType[name]
        if k % traits(t).blck_size:
            continue
        blocks = weight_blocks(t, m, k, rng)
        x = rng.standard_normal((1, k), dtype=np.float32)
        ctx = pc.Context(mem_size=blocks.nbytes + x.nbytes + 4 * m + (1 << 24))
        w = ctx.new_tensor(t, (k, m)).set_raw(blocks)
        y = pc.mul_mat(w, ctx.from_numpy(x)).set_output()
        runners: dict[str, object] = {}
        if ggml is not None:
            runners["ggml"] = GgmlMulMat(t, blocks, x, 1)
        for c, peer in peers.items():
            peer.load(t, blocks, x, 1)
            runners[c] = peer
        for isa in isas:
            _set_isa(isa)
            runners[f"csimd:{isa}"] = (isa, pc.plan(y, "csimd", strict=True).compute)
        try:
            for c in numba_col:
                runners[c] = pc.plan(y, "numba", strict=True).compute
        except pc.PrismError as e:  # a format numba refuses
            print(f"  numba: {e}")
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for c, r in runners.items():
                if isinstance(r, RemoteGgml):
                    best[c] = max(best.get(c, 0.0), r.rate(ops, args.clock))
                    continue
                if isinstance(r, tuple):
                    _set_isa(r[0])
                    r = r[1]
                best[c] = max(best.get(c, 0.0), rate(r, ops, args.clock))
        base = best.get(args.base)
        cells = []
        for c in cols:
            v = best.get(c)
            ratio = f" ({v / base:4.2f}x)" if v is not None and base and c != args.base else ""
            cells.append("-" if v is None else f"{v:7.1f}{ratio}")
        print(f"{name:<8}" + "".join(f"{s:>22}" for s in cells))
        if ggml is not None:
            runners["ggml"].close()
    os.environ.pop("PRISM_CSIMD_ISA", None)
    for peer in peers.values():
        peer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
