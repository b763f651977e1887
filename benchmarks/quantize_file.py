"""The "quantize" section: ``prism quantize`` of Gemma 3 270M (F16 input) to Q4_K_M, Q8_0 and IQ4_XS beside
llama.cpp's ``llama_model_quantize`` (llama-cpp-python 0.3.36), both at 2 threads, wall time and peak RSS of a
fresh process each; the row quantizers through ``prism_core.quant.quantize_chunk`` (csimd's C) beside ggml's
own ``ggml_quantize_chunk`` (the wheel's libggml-base, built from ggml's sources) on the same rows, one thread
each; and the perplexity of Gemma 3 270M Q4_K_M and of that file requantized by Prism to Q4_0 and Q8_0, by
``prism perplexity`` and by llama.cpp's logits with the same method, on a text of at least 10,000 tokens
(``$PRISM_BENCH_TEXT``, else the King James Genesis and Exodus from Debian's ``bible-kjv``, public domain).

    python -m benchmarks --only quantize          # --only quantize-speed: without the perplexities
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("Q4_K_M", "Q8_0", "IQ4_XS")
THREADS = 2
# VmHWM: this process's own peak (ru_maxrss would carry the benchmark parent's over fork and exec)
_RSS = ("import sys; print('RSS', [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0], "
        "file=sys.stderr)")
_LLAMA = """
import ctypes, sys, llama_cpp as lc
cb = lc.llama_log_callback(lambda *a: None); lc.llama_log_set(cb, ctypes.c_void_p(0))
p = lc.llama_model_quantize_default_params(); p.nthread = {threads}; p.ftype = {ftype}
assert lc.llama_model_quantize({src!r}.encode(), {dst!r}.encode(), ctypes.byref(p)) == 0
"""


def _timed(code: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a fresh Python running ``code``."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code + "\n" + _RSS], capture_output=True, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    rss = int(r.stderr.rsplit("RSS", 1)[1].split()[0])
    return dt, rss / 1024


def _gemma_f16(work: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    import quant_fixtures as qf

    from prism_core.models.catalog import resolve
    return qf.write_gemma_f16(resolve("gemma3-270m"), work / "gemma3-270m-f16.gguf")


def file_times(bench, work: Path) -> None:
    from prism_core.models.quant_rules import PRESETS as ALL
    src = _gemma_f16(work)
    rows = []
    for name in PRESETS:
        out_p, out_l = str(work / f"p-{name}.gguf"), str(work / f"l-{name}.gguf")
        prism = min(_timed(f"from prism_core.cli import main; main(['quantize', {str(src)!r}, {out_p!r}, {name!r}, "
                           f"'-t', '{THREADS}', '--no-progress'])") for _ in range(min(2, bench.repeats)))
        llama = min(_timed(_LLAMA.format(threads=THREADS, ftype=ALL[name].ftype, src=str(src), dst=out_l))
                    for _ in range(min(2, bench.repeats)))
        same = Path(out_p).read_bytes() == Path(out_l).read_bytes()
        rows.append((name, prism, llama, same))
    print(f"\n## quantize: Gemma 3 270M F16 ({os.path.getsize(src) / 2**20:.0f} MiB) at {THREADS} threads "
          "(best of runs, fresh process each)")
    print(f"{'type':8s} {'prism s':>8s} {'llama s':>8s} {'speed':>7s} {'prism RSS MiB':>14s} {'llama RSS MiB':>14s}  "
          "files")
    for name, (ps, pr), (ls, lr), same in rows:
        print(f"{name:8s} {ps:8.2f} {ls:8.2f} {ls / ps:6.2f}x {pr:14.0f} {lr:14.0f}  "
              f"{'byte-equal' if same else 'DIFFER'}")
        for k, v in (("prism_s", ps), ("llama_s", ls), ("prism_rss_mib", pr), ("llama_rss_mib", lr),
                     ("byte_equal", float(same))):
            bench.record("quantize", f"{name}/{k}", v)


def row_speeds(bench) -> None:
    import llama_cpp

    from prism_core import quant
    from prism_core.types import GGMLType, traits

    from .__main__ import best_time
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64 if bench.quick else 256, 4096)) * 0.02).astype(np.float32)
    w = np.exp(rng.standard_normal(4096)).astype(np.float32)
    mb = x.nbytes / 1e6
    print("\n## quantize: row quantizers, one thread, MB/s of float32 input (csimd via prism_core.quant vs ggml)")
    print(f"{'type':8s} {'imatrix':>7s} {'prism':>9s} {'ggml':>9s} {'ratio':>6s}")
    for t in ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS",
              "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "MXFP4"):
        g = GGMLType[t]
        for im in (None, w):
            if im is None and t in ("IQ2_XXS", "IQ2_XS", "IQ1_S"):
                continue
            tr = traits(g)
            out = np.empty((len(x), 4096 // tr.blck_size * tr.type_size), np.uint8)
            lib.ggml_quantize_chunk(int(g), x.ctypes.data, out.ctypes.data, 0, 1, 4096,
                                    None if im is None else im.ctypes.data)  # ggml_quantize_init
            ggml = mb / best_time(lambda: lib.ggml_quantize_chunk(int(g), x.ctypes.data, out.ctypes.data, 0,
                                                                  len(x), 4096, None if im is None
                                                                  else im.ctypes.data), bench.repeats)
            prism = mb / best_time(lambda: quant.quantize_chunk(x, g, im, threads=1), bench.repeats)
            print(f"{t:8s} {'yes' if im is not None else 'no':>7s} {prism:9.1f} {ggml:9.1f} {prism / ggml:5.2f}x")
            key = f"rows/{t}{'+im' if im is not None else ''}"
            bench.record("quantize", f"{key}/prism", prism)
            bench.record("quantize", f"{key}/ggml", ggml)


def _text() -> str | None:
    path = os.environ.get("PRISM_BENCH_TEXT")
    if path:
        return Path(path).read_text()
    if shutil.which("bible") is None:
        return None
    lines = []
    for book in ("Genesis", "Exodus"):
        for ch in range(1, 51):
            r = subprocess.run(["bible", "-f", f"{book} {ch}:1-200"], capture_output=True, text=True)
            lines += [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if " " in ln]
    return "\n".join(lines)


def perplexities(bench, work: Path) -> None:
    import prism_core as pc
    from prism_core.models.catalog import resolve
    from prism_core.models.perplexity import _nll_rows, perplexity
    from prism_core.models.quantize import quantize_model
    text = _text()
    if text is None:
        print("\n## quantize: perplexity skipped (no $PRISM_BENCH_TEXT, no `bible`: apt-get install bible-kjv)")
        return
    n_ctx, n_chunks = 512, 20
    q4km = resolve("gemma3-270m")
    files = {"Q4_K_M (the file)": q4km}
    for t in ("Q4_0", "Q8_0"):
        files[f"{t} (Prism, from Q4_K_M)"] = str(work / f"req-{t}.gguf")
        quantize_model(q4km, files[f"{t} (Prism, from Q4_K_M)"], t, allow_requantize=True, threads=THREADS)
    print(f"\n## quantize: perplexity of Gemma 3 270M, {n_chunks} chunks of {n_ctx} "
          f"({n_chunks * n_ctx} tokens; KJV Genesis/Exodus unless $PRISM_BENCH_TEXT)")
    print(f"{'file':26s} {'prism':>18s} {'llama.cpp':>18s}")
    for label, path in files.items():
        model = pc.models.load(path, n_ctx=n_ctx)
        r = perplexity(model, text, n_ctx=n_ctx, n_chunks=n_chunks)
        ids = model.tokenizer.encode(text, add_special=True, parse_special=False)
        del model
        ll = _llama_ppl(path, ids, n_ctx, n_chunks, model_bos=ids[0], nll_rows=_nll_rows)
        print(f"{label:26s} {r.ppl:9.4f} ± {r.uncertainty:6.4f} {ll:18.4f}")
        for k, v in (("prism", r.ppl), ("prism_uncertainty", r.uncertainty), ("llama", ll)):
            bench.record("quantize", f"ppl/{label.split()[0]}/{k}", v)


def _llama_ppl(path, ids, n_ctx, n_chunks, model_bos, nll_rows) -> float:
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_threads=THREADS, verbose=False)
    total, count = 0.0, 0
    for i in range(n_chunks):
        c = list(ids[i * n_ctx:(i + 1) * n_ctx])
        c[0] = model_bos
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(c)
        z = np.asarray(llm.scores[n_ctx // 2:n_ctx - 1])
        total += float(nll_rows(z, np.asarray(c[n_ctx // 2 + 1:])).sum())
        count += n_ctx - n_ctx // 2 - 1
    return float(np.exp(total / count))


def run(bench, quality: bool = True) -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("\n## quantize: skipped (llama-cpp-python is not installed; pip install it from the cache)")
        return
    with tempfile.TemporaryDirectory(prefix="prism-bench-quantize-") as tmp:
        work = Path(tmp)
        file_times(bench, work)
        row_speeds(bench)
        if quality:
            perplexities(bench, work)


def run_speed(bench) -> None:
    """``--only quantize-speed``: the file and row timings without the perplexities (minutes shorter)."""
    run(bench, quality=False)
