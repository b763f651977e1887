"""The "quantized" section: products with block-type weights and dequantization throughput.

Peers in the same run: ggml's own CPU backend through the PyPI package ``ggml-python`` (an
optional benchmark peer, never a test dependency; same shapes, formats and thread count), and
the F32 product on the dequantized weights (NumPy's BLAS). Prism figures are planned graphs on
each backend that computes the node itself (a backend that would fall back to the reference is
left out: the reference dequantizes in float64 and is not a speed peer). Weight bytes read per
second are set beside the machine's copy bandwidth.
"""

from __future__ import annotations

import ctypes

import numpy as np

import prism_core as pc
from prism_core.quant import can_quantize, quantize
from prism_core.types import F32, GGMLType, traits

from .ggml_peer import GgmlMulMat, ggml
from .machine import copy_bandwidth_gbs

G = GGMLType
FORMATS = (G.Q4_0, G.Q8_0, G.Q5_0, G.Q4_K, G.Q6_K)
# where a block keeps its fp16 scales (random blocks get finite ones there) for formats Prism cannot quantize yet
_F16_FIELDS = {G.Q4_K: (0, 2), G.Q6_K: (208,)}


def weight_blocks(t: GGMLType, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(m, row bytes) uint8 blocks of m rows of k normal values: Prism's (ggml's reference) quantizer,
    ggml's own where Prism has none, else random blocks with finite scales."""
    w = rng.standard_normal((m, k), dtype=np.float32)
    if can_quantize(t):
        return quantize(w, t)
    tr = traits(t)
    if k % tr.blck_size:
        raise ValueError(f"{tr.name} rows need a multiple of {tr.blck_size} elements, got {k}")
    if ggml is not None:
        out = np.empty((m, k // tr.blck_size * tr.type_size), np.uint8)
        ggml.ggml_quantize_chunk(int(t), w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, 0, m, k,
                                 None)
        return out
    out = rng.integers(0, 256, (m, k // tr.blck_size, tr.type_size), dtype=np.uint8)
    for off in _F16_FIELDS[t]:
        out[..., off:off + 2] = rng.uniform(0.001, 0.01, out.shape[:2]).astype(np.float16).view(np.uint8) \
            .reshape(*out.shape[:2], 2)
    return out.reshape(m, -1)


def ggml_to_float(t: GGMLType, blocks: np.ndarray, out: np.ndarray):
    fn = ggml.ggml_get_type_traits(int(t)).contents.to_float
    src, dst, n = blocks.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size
    return lambda: fn(src, dst, n)


def _computing_backends(bench, node: pc.Tensor) -> list:
    """The backends that compute the node themselves (no fallback), the reference left out."""
    return [be for be in bench.backends if not be.is_reference and be.supports(node)]


def quantized(bench, best_time) -> None:
    """The section (``best_time``: the runner's timer)."""
    rng = np.random.default_rng(0)
    bw = copy_bandwidth_gbs()
    threads = max((getattr(be, "threads", 1) for be in bench.backends), default=1)
    shapes = [(1, 2048, 2048), (1, 640, 262144), (128, 2048, 2048), (512, 640, 2048)]
    if bench.quick:
        shapes = [(1, 2048, 2048), (128, 2048, 2048)]
    note = "" if ggml is not None else " (ggml-python not installed: no ggml column)"
    rows, traffic, agree = [], [], []
    for n, k, m in shapes:  # n activation rows, k inner, m outputs (ggml: w [k, m], x [k, n])
        x = rng.standard_normal((n, k), dtype=np.float32)
        for t in FORMATS:
            if k % traits(t).blck_size:  # a K-quant row of 640 is not whole super-blocks (llama.cpp picks another type)
                continue
            blocks = weight_blocks(t, m, k, rng)
            ops = 2 * n * k * m
            vals: dict[str, float] = {}
            peer = None
            if ggml is not None:
                peer = GgmlMulMat(t, blocks, x, threads)
                vals["ggml"] = ops / best_time(peer, 1 if ops > 1e10 else bench.repeats) / 1e9
            ctx = pc.Context(mem_size=blocks.nbytes + x.nbytes + 4 * n * m + (1 << 24))
            w = ctx.new_tensor(t, (k, m)).set_raw(blocks)
            y = pc.mul_mat(w, ctx.from_numpy(x)).set_output()
            for be in _computing_backends(bench, y):
                plan = pc.plan(y, be, strict=True)
                dt = best_time(plan.compute, 1 if ops > 1e10 else bench.repeats)
                vals["prism:" + be.name] = ops / dt / 1e9
                if n == 1:
                    traffic.append((f"{n}x{k}x{m} {traits(t).name} {be.name}", blocks.nbytes / dt / 1e9))
                if peer is not None and m * k <= (1 << 24):  # both against the exact product (float64)
                    exact = x.astype(np.float64) @ w.numpy().astype(np.float64).T
                    scale = max(np.abs(exact).max(), 1e-30)
                    err = {name: np.abs(r - exact).max() / scale
                           for name, r in (("prism:" + be.name, y.numpy().reshape(n, m)), ("ggml", peer.result()))}
                    agree.append(f"{traits(t).name} {n}x{k}x{m}: max error / max |exact|: "
                                 + ", ".join(f"{name} {e:.1e}" for name, e in err.items()))
            if peer is not None:
                peer.close()
            if m * k <= (1 << 24):  # the F32 peer on the dequantized weights (the head's would be 0.7 GB)
                wf = w.numpy()
                vals["f32-numpy"] = ops / best_time(lambda: x @ wf.T, 1 if ops > 1e10 else bench.repeats) / 1e9
                del wf
            rows.append((f"{n}x{k}x{m} {traits(t).name}", vals))
            del ctx, w, y, blocks
    base = "ggml" if ggml is not None else "f32-numpy"
    bench.table("quantized mul_mat" + note, rows, "GOPS", base,
                extra=f"  {threads} threads; ops = 2*n*k*m; ggml = ggml-python's CPU backend, f32-numpy = "
                "NumPy's BLAS on the dequantized weights")
    if traffic:
        print(f"  matrix-vector weight bytes read per second (machine copy bandwidth {bw:.1f} GB/s):")
        for label, v in traffic:
            print(f"    {label:<40} {v:6.1f} GB/s ({v / bw:.0%})")
            bench.record("quantized weight traffic", label, v)
    if agree:
        print("  against the exact product on the dequantized weights (both quantize the activations):")
    for line in agree:
        print("    " + line)
    dequantize_throughput(bench, rng, best_time)


def dequantize_throughput(bench, rng: np.random.Generator, best_time) -> None:
    """Dequantize to F32 (CPY block type -> F32 as a planned graph) per format, MB/s of F32 written."""
    k, m = 4096, 256 if bench.quick else 1024
    rows = []
    for t in FORMATS:
        blocks = weight_blocks(t, m, k, rng)
        vals: dict[str, float] = {}
        mb = 4 * k * m / 1e6
        if ggml is not None:
            out = np.empty((m, k), np.float32)
            vals["ggml"] = mb / best_time(ggml_to_float(t, blocks, out), bench.repeats)
        ctx = pc.Context(mem_size=blocks.nbytes + 4 * k * m + (1 << 22))
        y = pc.cpy(ctx.new_tensor(t, (k, m)).set_raw(blocks), ctx.new_tensor(F32, (k, m))).set_output()
        for be in _computing_backends(bench, y):
            plan = pc.plan(y, be, strict=True)
            vals["prism:" + be.name] = mb / best_time(plan.compute, bench.repeats)
        rows.append((f"{traits(t).name} {m}x{k}", vals))
    bench.table("dequantize to F32", rows, "MB/s of F32", "ggml" if ggml is not None else next(iter(rows[0][1])),
                extra="  ggml: its to_float on one thread; prism: CPY to F32, threads as the backend runs them")
