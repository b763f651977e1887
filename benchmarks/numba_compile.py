"""Cold compile CPU time of numba's integer-path kernel, per compilation, beside another checkout's.

``python -m benchmarks.numba_compile [--python NAME=PYTHON ...] [--rounds 2]``: for each interpreter (this one,
and each ``--python``, e.g. ``main=/work/main/.venv/bin/python`` for a venv installed from another checkout), a
fresh process with an empty ``NUMBA_CACHE_DIR`` compiles ``q_mul_mat_int`` on a small Q4_K weight: its serial
compilation alone, its thread-pool one alone, and both in one process (the thread-pool one second: what it adds
once the helpers they share are compiled). CPU seconds of the compiling thread's process, the least of
``--rounds``; compare CPU, not wall time, on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

# run in the measured interpreter: prints "<form> <cpu seconds>" per compilation
_CHILD = """
import sys, time
import numpy as np
from prism_core.types import GGMLType, traits
from prism_numba import _jit
import prism_numba._jit_qdot  # noqa: F401  (imported outside the timing)
k = _jit.register_all()["q_mul_mat_int"]
forms = {"serial": [k.serial()], "parallel": [k], "both": [k.serial(), k]}[sys.argv[1]]
nk, nm = 512, 8
a = np.zeros((1, 1, nm, nk // 256 * traits(GGMLType.Q4_K).type_size), np.uint8)
b = np.ones((1, 1, 2, nk), np.float32)
o = np.empty((1, 1, 2, nm), np.float32)
for f in forms:
    t = time.process_time()
    f(int(GGMLType.Q4_K), a, b, o)
    print("parallel" if f.parallel else "serial", time.process_time() - t)
"""

CASES = (("serial", "serial"), ("parallel", "parallel"), ("both", "serial"), ("both", "parallel"))


def _compile_seconds(python: str, form: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="numba_cache_") as cache:
        out = subprocess.run([python, "-c", _CHILD, form], capture_output=True, text=True, check=True,
                             env={**os.environ, "NUMBA_CACHE_DIR": cache}).stdout
    return {name: float(sec) for name, sec in (line.split() for line in out.splitlines() if line.strip())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PYTHON",
                    help="another interpreter to measure, as column NAME (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    columns = [("this", sys.executable)] + [tuple(p.split("=", 1)) for p in args.python]
    best: dict[tuple, float] = {}
    for _ in range(args.rounds):  # interleaved, so that a change of load reaches every column
        for name, python in columns:
            for form in ("serial", "parallel", "both"):
                for compiled, sec in _compile_seconds(python, form).items():
                    key = (name, form, compiled)
                    best[key] = min(best.get(key, sec), sec)
    print(f"q_mul_mat_int cold compile, CPU s (least of {args.rounds} rounds)")
    print(f"{'process: compilation':28}" + "".join(f"{name:>12}" for name, _ in columns))
    for form, compiled in CASES:
        row = [best[(name, form, compiled)] for name, _ in columns]
        cells = "".join(f"{v:12.1f}" for v in row)
        print(f"{form + ': ' + compiled:28}{cells}" + (f"   (this / {columns[1][0]}: {row[0] / row[1]:.2f}x)"
                                                      if len(row) > 1 else ""))


if __name__ == "__main__":
    main()
