"""Run on every rank under ``mpiexec`` by tests/test_mpi.py (not a test module itself).

    mpiexec -n N python tests/mpi_worker.py equal OUT.json BACKEND[,BACKEND...]
    mpiexec -n N python tests/mpi_worker.py refuse OUT.json
    mpiexec -n 2 python tests/mpi_worker.py raise|kill|uncaught

``equal``: for every backend, optimizer and per-rank period, a distributed fit and, on rank 0,
a one-process fit with gradient accumulation over the same logical batch; rank 0 writes both
to OUT.json. ``refuse``: arguments every rank must refuse alike; each rank writes what it
caught. ``raise`` / ``kill``: rank 1 raises / is killed by SIGKILL at its second step. ``uncaught``:
rank 1 raises outside ``fit`` while rank 0 waits in a barrier, with ``abort_on_exception``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

import prism_core as pc
from prism_core import train
from prism_core.train import distributed

NIN, NHIDDEN, NOUT, BATCH, NDATA = 6, 8, 4, 4, 144


def build_model(ctx: pc.Context, seed: int, nhidden: int = NHIDDEN) -> tuple[pc.Tensor, pc.Tensor]:
    rng = np.random.default_rng(seed)
    x = ctx.new_tensor(pc.F32, (NIN, BATCH), "x")
    w1 = ctx.new_tensor(pc.F32, (NIN, nhidden), "w1").set_param()
    b1 = ctx.new_tensor(pc.F32, (nhidden, 1), "b1").set_param()
    w2 = ctx.new_tensor(pc.F32, (nhidden, NOUT), "w2").set_param()
    for t in (w1, b1, w2):
        t.set(rng.normal(0.0, 0.5, t.shape))
    return x, pc.mul_mat(w2, pc.relu(pc.add(pc.mul_mat(w1, x), b1)))


def dataset(seed: int = 7) -> train.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, (NDATA, NIN)).astype(np.float32)
    y = np.eye(NOUT, dtype=np.float32)[np.argmax(x @ rng.normal(0.0, 1.0, (NIN, NOUT)), axis=1)]
    return train.Dataset.from_numpy(x, y)


def pars(optimizer: str) -> train.OptimizerParams:
    return train.OptimizerParams(adamw=train.AdamWParams(alpha=0.01, wd=0.01), sgd=train.SGDParams(alpha=0.2, wd=0.01))


def stats(fr: train.FitResult) -> dict:
    return {"history": [[list(h.train_loss), list(h.train_accuracy), list(h.val_loss), list(h.val_accuracy)]
                        for h in fr.history],
            "pred_train": fr.result_train.pred().tolist(), "pred_val": fr.result_val.pred().tolist(),
            "params": [p.numpy().astype(np.float64).tolist() for p in fr.opt_ctx.params],
            "iter": fr.opt_ctx.iter}


def equal(out: str, backends: list[str]) -> None:
    comm = distributed.world()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    cases = []
    for be in backends:
        for opt in ("adamw", "sgd"):
            for local_period in (1, 2):
                logical = nranks * local_period * BATCH
                ctx = pc.Context(1 << 24)
                x, logits = build_model(ctx, seed=1 + rank)  # rank 0's values must win
                fr = distributed.fit(ctx, x, logits, dataset(), "cross_entropy", opt, pars(opt), nepoch=2,
                                     nbatch_logical=logical, val_split=0.25, silent=True, backend=be)
                case = {"backend": be, "optimizer": opt, "local_period": local_period, "logical": logical}
                if rank == 0:
                    oc = fr.opt_ctx
                    case["accumulators_in_fused_buffer"] = all(
                        np.shares_memory(oc.gb_grad.grad_acc(p).storage(), oc.fused) for p in oc.params)
                    case["nallreduce"] = fr.nallreduce
                    case["distributed"] = stats(fr)
                    ctx1 = pc.Context(1 << 24)
                    x1, logits1 = build_model(ctx1, seed=1)
                    ref = train.fit(ctx1, x1, logits1, dataset(), "cross_entropy", opt, pars(opt), nepoch=2,
                                    nbatch_logical=logical, val_split=0.25, silent=True, backend=be)
                    case["single"] = stats(ref)
                cases.append(case)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"nranks": nranks, "cases": cases}, f)


def refuse(out: str) -> None:
    comm = distributed.world()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    caught = {}
    trials = {
        "uneven": {"nbatch_logical": (nranks - 1) * BATCH * 2},
        "shapes": {"nhidden": NHIDDEN + 1 if rank == nranks - 1 else NHIDDEN},
        "data": {"data_seed": 8 if rank == 1 else 7},
        "one rank": {"nepoch": 0 if rank == 1 else 1},
    }
    for name, trial in trials.items():
        ctx = pc.Context(1 << 24)
        x, logits = build_model(ctx, seed=1, nhidden=trial.get("nhidden", NHIDDEN))
        ntensors = len(ctx.tensors)
        try:
            distributed.fit(ctx, x, logits, dataset(trial.get("data_seed", 7)), "cross_entropy", "adamw",
                            nepoch=trial.get("nepoch", 1), nbatch_logical=trial.get("nbatch_logical", nranks * BATCH),
                            silent=True, backend="numpy")
            caught[name] = None
        except pc.PrismError as e:
            caught[name] = {"type": type(e).__name__, "message": str(e), "untouched": len(ctx.tensors) == ntensors}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(caught, f)


def fault(kind: str) -> None:
    comm = distributed.world()
    rank = comm.Get_rank()
    if kind == "uncaught":
        distributed.abort_on_exception(comm)
        if rank == 1:
            raise RuntimeError("rank 1 fails outside fit")
        comm.Barrier()
        print(f"rank {rank} finished, which it must not", flush=True)
        return

    def callback(train_: bool, opt_ctx, ds, result, ibatch, ibatch_max, t_start) -> None:
        if rank == 1 and train_ and ibatch == 2 * opt_ctx.opt_period:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {rank} fails on purpose after batch {ibatch}")

    ctx = pc.Context(1 << 24)
    x, logits = build_model(ctx, seed=1)
    distributed.fit(ctx, x, logits, dataset(), "cross_entropy", "adamw", nepoch=50, silent=True, backend="numpy",
                    callback=callback)
    print(f"rank {rank} finished, which it must not", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "equal":
        equal(sys.argv[2], sys.argv[3].split(","))
    elif mode == "refuse":
        refuse(sys.argv[2])
    else:
        fault(mode)
