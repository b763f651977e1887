"""Quantize/dequantize throughput per block format: Prism's ``prism_core.quant`` beside
gguf.quants on the same rows, in MB/s of float32 (input of a quantizer, output of a
dequantizer). gguf.quants has no quantizer for the K-quants, Q8_1 and IQ4_*, so for those
the line also shows the median of gguf's own quantizers as the yardstick."""

from __future__ import annotations

import statistics

import gguf
import numpy as np

from prism_core import quant
from prism_core.types import GGMLType, traits


def _gguf_has(fn, t: GGMLType, probe: np.ndarray) -> bool:
    try:
        with np.errstate(all="ignore"):
            fn(probe, gguf.GGMLQuantizationType[t.name])
        return True
    except (NotImplementedError, KeyError):
        return False


def run(bench) -> None:
    from .__main__ import best_time  # the shared timer

    n_rows = 16 if bench.quick else 64
    x = np.random.default_rng(0).standard_normal((n_rows, 4096)).astype(np.float32)
    mb = x.nbytes / 1e6
    quant_rows, dequant_rows = [], []
    gguf_own = []
    written = []
    for t in GGMLType:
        if not traits(t).is_quantized or not quant.can_dequantize(t):
            continue
        gq = gguf.GGMLQuantizationType[t.name]
        if quant.can_quantize(t):
            blocks = quant.quantize(x, t)
            vals = {"prism": mb / best_time(lambda: quant.quantize(x, t), bench.repeats)}
            if _gguf_has(gguf.quants.quantize, t, x[:1]):
                with np.errstate(all="ignore"):
                    vals["gguf"] = mb / best_time(lambda: gguf.quants.quantize(x, gq), bench.repeats)
                gguf_own.append(vals["gguf"])
            else:
                written.append((traits(t).name, vals))
            quant_rows.append((traits(t).name, vals))
        else:
            blocks = np.random.default_rng(1).integers(0, 256, (n_rows, 4096 // traits(t).blck_size
                                                                 * traits(t).type_size), dtype=np.uint8)
        vals = {"prism": mb / best_time(lambda: quant.dequantize(blocks, t), bench.repeats)}
        if _gguf_has(gguf.quants.dequantize, t, blocks[:1]):
            with np.errstate(all="ignore"):
                vals["gguf"] = mb / best_time(lambda: gguf.quants.dequantize(blocks, gq), bench.repeats)
        dequant_rows.append((traits(t).name, vals))
    yardstick = statistics.median(gguf_own)
    for _, vals in written:
        vals["gguf-median-own"] = yardstick
    bench.table(f"quantize {n_rows}x4096 float32 rows", [(n, v) for n, v in quant_rows if "gguf" in v], "MB/s",
                "gguf")
    bench.table("quantize, formats gguf.quants cannot quantize (vs the median of gguf's own quantizers)",
                written, "MB/s", "gguf-median-own")
    bench.table(f"dequantize {n_rows}x4096 rows", dequant_rows, "MB/s of float32", "gguf")
