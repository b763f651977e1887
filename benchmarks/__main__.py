"""``python -m benchmarks [--quick] [--only SECTION ...] [--serve-seconds S] [--json OUT] [--compare PREV]``

Prints, side by side in one run and as ratios, each Prism backend against NumPy written
directly and (when installed) PyTorch CPU, and the machine's limits. Times are the best
of several runs after a warm-up; every Prism figure uses a planned graph.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import prism_core as pc

from . import finetune as finetune_section
from . import gguf_open, quantize_file
from . import model as model_section
from . import quant as quant_section
from . import serve as serve_section
from .machine import copy_bandwidth_gbs, fp32_peak_gflops, path_peak_gflops, read_bandwidth_gbs
from .quantized import quantized

try:
    import torch
except ImportError:  # PyTorch is an optional peer
    torch = None


SETTLE_S = 0.5  # a pause before each contender of a section whose peers leave threads spinning


def best_time(fn, repeats: int, min_time: float = 0.05) -> float:
    fn()  # warm-up (compiles, allocates)
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = min(best, dt / n)
    return best


def best_wall_and_cpu(fn, repeats: int, min_time: float = 0.05) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds) per call, as best_time. CPU time sums every
    thread of this process, spinning ones included: on a machine shared with other processes it
    shows each contender's work per core-second, which their time slices do not distort."""
    fn()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best, best_cpu = min(best, dt / n), min(best_cpu, (time.process_time() - c0) / n)
    return best, best_cpu


class Bench:
    def __init__(self, quick: bool, only_backends: list[str] | None = None, threads: int | None = None) -> None:
        self.quick = quick
        self.threads = threads  # the model section's thread count (None: its default)
        self.serve_seconds: float | None = None  # the serve section's load duration (None: its default; 0: skip)
        self.repeats = 2 if quick else 5
        self.backends = [b.backend for b in pc.backends() if b.available
                         and (only_backends is None or b.name in only_backends)]
        self.results: dict[str, dict[str, float]] = {}

    def record(self, section: str, name: str, value: float) -> None:
        self.results.setdefault(section, {})[name] = value

    def table(self, title: str, rows: list[tuple[str, dict[str, float]]], unit: str, base: str,
              higher_better: bool = True, extra: str = "") -> None:
        print(f"\n## {title} ({unit}; ratio vs {base}{', higher is better' if higher_better else ', lower is better'})")
        if extra:
            print(extra)
        for label, vals in rows:
            ref = vals.get(base)
            cells = []
            for k, v in vals.items():
                r = "" if not ref or k == base else f" ({v / ref:.2f}x)"
                cells.append(f"{k}={v:,.3g}{r}")
            print(f"  {label:<26} " + "  ".join(cells))
            for k, v in vals.items():
                self.record(title, f"{label}/{k}", v)

    # ------------------------------------------------------------ sections
    def dispatch(self) -> None:
        n = 1000
        rows = {}
        a_np = np.ones(16, np.float32)
        c = a_np.copy()

        def numpy_chain():
            for _ in range(n):
                np.add(c, a_np, out=c)
        rows["numpy-direct"] = best_time(numpy_chain, self.repeats) / n * 1e6
        if torch is not None:
            ta, tc = torch.ones(16), torch.ones(16)

            def torch_chain():
                x = tc
                for _ in range(n):
                    x = x + ta
            rows["torch"] = best_time(torch_chain, self.repeats) / n * 1e6
        for be in self.backends:
            ctx = pc.Context()
            x = ctx.from_numpy(np.ones(16, np.float32))
            one = ctx.from_numpy(np.ones(16, np.float32))
            t = x
            for _ in range(n):
                t = pc.add(t, one)
            plan = pc.plan(pc.Graph(capacity=n + 8).expand(t.set_output()), be)
            rows["prism:" + be.name] = best_time(plan.compute, self.repeats) / n * 1e6
        base = "torch" if torch is not None else "numpy-direct"
        self.table("dispatch overhead per node, chain of 1000 tiny adds", [("16-element add", rows)], "us/node",
                   base, higher_better=False)

    def add_16m(self) -> None:
        n = (1 << 22) if self.quick else (1 << 24)
        bw = copy_bandwidth_gbs()
        a, b = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
        out = np.empty_like(a)
        moved = 3 * 4 * n
        rows = {"numpy-direct": moved / best_time(lambda: np.add(a, b, out=out), self.repeats) / 1e9}
        if torch is not None:
            ta, tb, to = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n)
            rows["torch"] = moved / best_time(lambda: torch.add(ta, tb, out=to), self.repeats) / 1e9
        for be in self.backends:
            ctx = pc.Context(mem_size=1 << 31)
            y = pc.add(ctx.from_numpy(a), ctx.from_numpy(b)).set_output()
            plan = pc.plan(y, be)
            rows["prism:" + be.name] = moved / best_time(plan.compute, self.repeats) / 1e9
        read_bw = read_bandwidth_gbs()
        self.record("machine", "copy bandwidth GB/s (1 thread)", bw)
        self.record("machine", "read bandwidth GB/s (all cores)", read_bw)
        self.table(f"elementwise add, {n >> 20}M floats", [("add", rows)], "GB/s", "numpy-direct",
                   extra=f"  machine copy bandwidth {bw:.1f} GB/s (np.copyto, one thread), read bandwidth "
                   f"{read_bw:.1f} GB/s (every core summing its own slice, measured); fractions of the copy "
                   "bandwidth: " + ", ".join(f"{k} {v / bw:.0%}" for k, v in rows.items()))

    def mul_mat(self) -> None:
        peak, how = fp32_peak_gflops()
        shapes = [(1024, 1024, 1024), (1, 2048, 2048), (32, 2048, 2048), (512, 2048, 8192)]
        if self.quick:
            shapes = [(256, 256, 256), (1, 1024, 1024), (32, 1024, 1024)]
        rows, cpu_rows = [], []
        for n, k, m in shapes:  # n rows of activations, k inner, m outputs (ggml: a [k, m], b [k, n])
            w, x = np.random.rand(m, k).astype(np.float32), np.random.rand(n, k).astype(np.float32)
            flops = 2 * n * k * m
            reps = 3 if flops > 1e10 else self.repeats  # the same for every contender
            fns = {"numpy-direct": lambda: x @ w.T}
            if torch is not None:
                tw, tx = torch.from_numpy(w), torch.from_numpy(x)
                fns["torch"] = lambda: tx @ tw.T
            for be in self.backends:
                ctx = pc.Context(mem_size=1 << 31)
                y = pc.mul_mat(ctx.from_numpy(w), ctx.from_numpy(x)).set_output()
                fns["prism:" + be.name] = pc.plan(y, be).compute
            vals, cpu_vals = {}, {}
            for name, fn in fns.items():
                # OpenBLAS's workers spin on after numpy-direct's last call (measured: 20-100 ms of CPU); a
                # contender timed inside that spin shares the cores with them
                time.sleep(SETTLE_S)
                wall, cpu = best_wall_and_cpu(fn, reps)
                vals[name], cpu_vals[name] = flops / wall / 1e9, flops / cpu / 1e9
            rows.append((f"{n}x{k}x{m}", vals))
            cpu_rows.append((f"{n}x{k}x{m}", cpu_vals))
        self.record("machine", "FP32 peak GFLOPS", peak)
        limits = {}  # a backend on a narrower path than the CPU's widest (PRISM_CSIMD_ISA): that path's peak
        for be in self.backends:
            lim = path_peak_gflops(str(be.version))
            if lim is not None and lim[0] not in how:
                limits["prism:" + be.name] = lim
                self.record("machine", f"FP32 peak GFLOPS ({lim[0]})", lim[1])
        paths = "".join(f"; {k} runs {name} kernels, whose peak is {g:.0f} GFLOPS" for k, (name, g) in limits.items())
        self.table("F32 mul_mat", rows, "GFLOPS", "numpy-direct",
                   extra=f"  FP32 peak {peak:.0f} GFLOPS ({how}){paths}; fractions of each column's peak at "
                   f"{rows[0][0]}: " + ", ".join(f"{k} {v / limits.get(k, ('', peak))[1]:.0%}"
                                                 for k, v in rows[0][1].items()))
        self.table("F32 mul_mat per CPU-second of the process", cpu_rows, "GFLOPS per core-second", "numpy-direct",
                   extra="  flops over the process's CPU time (every thread, spinning ones included): on a machine "
                   "shared with other processes the wall-clock table above measures their time slices too")

    def row_ops(self) -> None:
        rows_n = 256 if self.quick else 1024
        x = np.random.rand(rows_n, 4096).astype(np.float32)
        out = []
        for name, build, direct in [
            ("soft_max", pc.soft_max, lambda: _np_softmax(x)),
            ("rms_norm", lambda t: pc.rms_norm(t, 1e-6), lambda: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)),
        ]:
            vals = {"numpy-direct": 1e3 * best_time(direct, self.repeats)}
            if torch is not None:
                tx = torch.from_numpy(x)
                fn = (lambda: torch.softmax(tx, -1)) if name == "soft_max" else \
                    (lambda: tx * torch.rsqrt((tx * tx).mean(-1, keepdim=True) + 1e-6))
                vals["torch"] = 1e3 * best_time(fn, self.repeats)
            for be in self.backends:
                ctx = pc.Context(mem_size=1 << 31)
                plan = pc.plan(build(ctx.from_numpy(x)).set_output(), be)
                vals["prism:" + be.name] = 1e3 * best_time(plan.compute, self.repeats)
            out.append((f"{name} {rows_n}x4096", vals))
        self.table("row ops over 4096-wide rows", out, "ms", "numpy-direct", higher_better=False)

    def mlp(self) -> None:
        configs = [(64, 128, 10, 32), (64, 128, 10, 500), (784, 500, 10, 32), (784, 500, 10, 500)]
        rows = []
        for din, dh, dout, bs in configs:
            rng = np.random.default_rng(0)
            x = rng.normal(size=(bs, din)).astype(np.float32)
            y = np.eye(dout, dtype=np.float32)[rng.integers(0, dout, bs)]
            vals = {}
            if torch is not None:
                model = torch.nn.Sequential(torch.nn.Linear(din, dh), torch.nn.ReLU(), torch.nn.Linear(dh, dout))
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
                tx, ty = torch.from_numpy(x), torch.from_numpy(y)

                def torch_step():
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(tx), ty).backward()
                    opt.step()
                vals["torch"] = 1e3 * best_time(torch_step, self.repeats)
            for be in self.backends:
                plan, params = _prism_mlp_step(x, y, dh, be)
                vals["prism:" + be.name] = 1e3 * best_time(plan.compute, self.repeats)
            rows.append((f"{din}-{dh}-{dout} batch {bs}", vals))
            if plan is not None:
                self.record("plan memory", f"{din}-{dh}-{dout} batch {bs}", plan.peak_bytes / plan.naive_bytes)
                self.record("plan memory lower bound", f"{din}-{dh}-{dout} batch {bs}",
                            plan.live_bound_bytes / plan.naive_bytes)
                print(f"  [{din}-{dh}-{dout} batch {bs}] {plan.summary()}")
        self.table("MLP training step (forward, backward, AdamW)", rows, "ms/step",
                   "torch" if torch is not None else "prism:" + self.backends[0].name, higher_better=False)


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _prism_mlp_step(x, y, dh, be):
    ctx = pc.Context(mem_size=1 << 31)
    rng = np.random.default_rng(1)
    din, dout = x.shape[1], y.shape[1]
    tx, ty = ctx.from_numpy(x).set_input(), ctx.from_numpy(y).set_input()
    params = [ctx.from_numpy(rng.normal(0, 0.05, s).astype(np.float32)).set_param()
              for s in ((dh, din), (dh,), (dout, dh), (dout,))]
    w1, b1, w2, b2 = params
    logits = pc.add(pc.mul_mat(w2, pc.relu(pc.add(pc.mul_mat(w1, tx), b1))), b2)
    loss = pc.cross_entropy_loss(logits, ty).set_loss()
    g = pc.Graph(capacity=4096).expand(loss)
    pc.build_backward(g)
    hyper = ctx.from_numpy(np.array([1e-3, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0], np.float32))
    for p in params:
        g.expand(pc.opt_step_adamw(p, g.grad(p), ctx.new_tensor(pc.F32, p.ne), ctx.new_tensor(pc.F32, p.ne), hyper))
    pc.reset(g)
    return pc.plan(g, be, keep_grads=False), params


SECTIONS = {"dispatch": Bench.dispatch, "add": Bench.add_16m, "mul_mat": Bench.mul_mat, "rows": Bench.row_ops,
            "mlp": Bench.mlp, "quant": quant_section.run, "gguf": gguf_open.run,
            "quantized": lambda bench: quantized(bench, best_time),
            "model": model_section.run, "finetune": finetune_section.run, "quantize": quantize_file.run,
            "serve": serve_section.run, "quantize-speed": quantize_file.run_speed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--only", action="append", choices=list(SECTIONS), help="run only these sections")
    ap.add_argument("--backends", metavar="NAMES", type=lambda v: [x for x in v.split(",") if x],
                    help="comma-separated Prism backends to measure (default: every available one)")
    ap.add_argument("--threads", type=int, metavar="N", help="threads of every engine in the model section (default 2)")
    ap.add_argument("--serve-seconds", type=float, metavar="S",
                    help="seconds of the serve section's load on `prism serve` per backend (default 60; 0: skip it)")
    ap.add_argument("--json", metavar="OUT", help="save the results as JSON")
    ap.add_argument("--compare", metavar="PREV", help="print ratios against a previous --json file")
    args = ap.parse_args(argv)
    if args.backends is not None:
        known = {b.name: b for b in pc.backends()}
        bad = [n for n in args.backends if n not in known or not known[n].available]
        if bad or not args.backends:
            ap.error(f"--backends: {', '.join(bad) or 'no name'} not among the available backends "
                     f"({', '.join(n for n, b in known.items() if b.available)})")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    if args.serve_seconds is not None and args.serve_seconds < 0:
        ap.error(f"--serve-seconds must be at least 0, got {args.serve_seconds}")
    bench = Bench(args.quick, args.backends, args.threads)
    bench.serve_seconds = args.serve_seconds
    print(f"Prism {pc.__version__} benchmarks; backends: {', '.join(b.name for b in bench.backends)}; "
          f"peers: NumPy {np.__version__}" + (f", PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
                                              if torch is not None else " (PyTorch not installed)"))
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        print("note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set and slow NumPy's BLAS; for a fair peer run "
              "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks`")
    print("columns: numpy-direct = NumPy written directly (preallocated outputs), torch = PyTorch eager, "
          "prism:NAME = a planned Prism graph on backend NAME")
    for name in args.only or SECTIONS:
        SECTIONS[name](bench)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prism": pc.__version__, "results": bench.results}, f, indent=1)
        print(f"\nsaved {args.json}")
    if args.compare:
        prev = json.load(open(args.compare))["results"]
        print(f"\n## compared with {args.compare} (new / old)")
        for section, vals in bench.results.items():
            for k, v in vals.items():
                old = prev.get(section, {}).get(k)
                if old:
                    print(f"  {section}: {k}: {v:,.3g} vs {old:,.3g} ({v / old:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
