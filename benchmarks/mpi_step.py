"""``python -m benchmarks.mpi_step [--backend NAME] [--steps N] [--ranks R]``

A data-parallel training step over MPI against one process, side by side in one run: the
MLP 784-500-10 (ReLU, cross-entropy, AdamW) on a logical batch of 500 datapoints, as one
process with ``R`` threads (physical batch 500) and as ``R`` ranks under ``mpiexec`` with one
thread each (physical batch 500 / R per rank, one fused allreduce per step), with one
process on one thread for scale, plus the
allreduce's share of a distributed step and the same allreduce timed alone. Needs mpi4py
and mpiexec (``pip install 'prism-tensor[mpi]'``). Times are medians over ``N`` steps after
a warm-up; every rank starts a step together (a barrier, outside the timed region).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import prism_core as pc
from prism_core import train

DIN, DHIDDEN, DOUT, BATCH = 784, 500, 10, 500
NBATCHES = 4  # logical batches in the dataset, cycled


def _model(ctx: pc.Context, physical: int) -> tuple[pc.Tensor, pc.Tensor]:
    rng = np.random.default_rng(1)
    x = ctx.new_tensor(pc.F32, (DIN, physical), "x")
    shapes = (("w1", (DIN, DHIDDEN)), ("b1", (DHIDDEN, 1)), ("w2", (DHIDDEN, DOUT)), ("b2", (DOUT, 1)))
    w1, b1, w2, b2 = (ctx.new_tensor(pc.F32, ne, name).set_param() for name, ne in shapes)
    for w in (w1, w2):
        w.set(rng.normal(0.0, 0.05, w.shape))
    return x, pc.add(pc.mul_mat(w2, pc.relu(pc.add(pc.mul_mat(w1, x), b1))), b2)


def worker(nsteps: int, backend: str | None) -> None:
    """One measurement; under mpiexec with more than one rank, the distributed step."""
    comm = None
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
        from prism_core.train import distributed
        comm = distributed.world()
    nranks = comm.Get_size() if comm is not None else 1
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(NBATCHES * BATCH, DIN)).astype(np.float32)
    ds = train.Dataset.from_numpy(x_np, np.eye(DOUT, dtype=np.float32)[rng.integers(0, DOUT, len(x_np))])
    ctx = pc.Context(1 << 30)
    x, logits = _model(ctx, BATCH // nranks)
    fused_bytes = 0
    if nranks == 1:
        oc = train.OptContext(ctx, x, logits, "cross_entropy", "adamw", 1, backend=backend)

        def step(i: int) -> None:
            oc.alloc(True)
            ds.get_batch(oc.inputs, oc.labels, i % NBATCHES)
            oc.eval()
    else:
        from prism_core.train import distributed
        oc = distributed.DistributedOptContext(ctx, x, logits, "cross_entropy", "adamw", nranks, comm=comm,
                                               backend=backend)
        fused_bytes = oc.fused.nbytes

        def step(i: int) -> None:
            oc.train_step(ds, (i % NBATCHES) * nranks)
    for i in range(3):
        step(i)
    steps, reduces = [], []
    for i in range(nsteps):
        if comm is not None:
            comm.Barrier()
        before = getattr(oc, "allreduce_seconds", 0.0)
        t0 = time.perf_counter()
        step(i)
        steps.append(time.perf_counter() - t0)
        reduces.append(getattr(oc, "allreduce_seconds", 0.0) - before)
    alone = []
    if comm is not None:
        from mpi4py import MPI
        for _ in range(nsteps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, oc.fused)
            alone.append(time.perf_counter() - t0)
    if comm is None or comm.Get_rank() == 0:
        print(json.dumps({"nranks": nranks, "threads": os.environ.get("PRISM_NUM_THREADS"),
                          "backend": oc.backend.name, "step_ms": 1e3 * statistics.median(steps),
                          "allreduce_in_step_ms": 1e3 * statistics.median(reduces),
                          "compute_ms": 1e3 * statistics.median(s - r for s, r in zip(steps, reduces)),
                          "allreduce_alone_ms": 1e3 * statistics.median(alone) if alone else 0.0,
                          "fused_bytes": fused_bytes}), flush=True)


def _mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.mpi_step", description=__doc__.split("\n\n")[1])
    ap.add_argument("--backend", default=None, help="Prism backend (default: the best available)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the distributed run = threads of the single one")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps, args.backend)
        return 0
    mpiexec = _mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        print("benchmarks.mpi_step: skipped, needs mpi4py and mpiexec (pip install 'prism-tensor[mpi]')")
        return 0
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "benchmarks.mpi_step", "--worker", "--steps", str(args.steps)]
    cmd += ["--backend", args.backend] if args.backend else []
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs = {}
    for label, threads, launcher in (("1 rank x 1 thread", 1, []), (f"1 rank x {args.ranks} threads", args.ranks, []),
                                     (f"{args.ranks} ranks x 1 thread", 1,
                                      [mpiexec, "--oversubscribe", "-n", str(args.ranks)])):
        p = subprocess.run(launcher + cmd, env=dict(env, PRISM_NUM_THREADS=str(threads)), cwd=root,
                           capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            print(f"{label}: failed (exit {p.returncode})\n{p.stderr[-2000:]}")
            return 1
        runs[label] = json.loads(lines[-1])
    (l0, one), (l1, single), (l2, dist) = runs.items()
    print(f"## MLP {DIN}-{DHIDDEN}-{DOUT} training step, logical batch {BATCH}, AdamW, backend "
          f"'{single['backend']}' (ms/step, median of {args.steps}; lower is better)")
    print(f"  {l0:<24} {one['step_ms']:8.2f} ms   {one['step_ms'] / single['step_ms']:.2f}x")
    print(f"  {l1:<24} {single['step_ms']:8.2f} ms   1.00x")
    print(f"  {l2:<24} {dist['step_ms']:8.2f} ms   {dist['step_ms'] / single['step_ms']:.2f}x of one process")
    share = dist["allreduce_in_step_ms"] / dist["step_ms"] if dist["step_ms"] else 0.0
    print(f"  allreduce in a step      {dist['allreduce_in_step_ms']:8.2f} ms   {share:.0%} of the distributed step "
          "(includes waiting for the slower rank)")
    print(f"  rest of the step, rank 0 {dist['compute_ms']:8.2f} ms   (gradients of its 1/{args.ranks} and the step)")
    print(f"  allreduce alone          {dist['allreduce_alone_ms']:8.2f} ms   "
          f"{dist['allreduce_alone_ms'] / dist['step_ms']:.0%} of the step ({dist['fused_bytes'] / 1e6:.2f} MB "
          "fused buffer, after a barrier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
