"""Train an MLP (64-128-10, ReLU, cross-entropy) on scikit-learn's bundled 8x8 digits with
prism_core.train.fit, the Python counterpart of ggml-opt's ``ggml_opt_fit``.

    python examples/digits_mlp.py                       # AdamW, 30 epochs, batch 32, val split 0.2
    python examples/digits_mlp.py --epochs 10 --alpha 3e-3 --backend numpy
    python examples/digits_mlp.py --save mlp.gguf          # then: prism gguf mlp.gguf
    mpiexec -n 2 python examples/digits_mlp.py --mpi       # data-parallel over 2 processes

With --mpi (``pip install 'prism-tensor[mpi]'``) every physical batch of --batch datapoints is
shared by the ranks (each evaluates batch / nranks of them) and the gradients are summed
across ranks before each step, so the run equals the one-process run up to summation order.

The progress bar (ggml's format) is drawn on stderr when it is a terminal; --progress
forces it, --silent turns it off. Exits with status 1 if the validation accuracy is
below --target (default 0.95).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import prism_core as pc
from prism_core import train


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        sys.exit("examples/digits_mlp.py needs scikit-learn for its bundled digits data set:\n"
                 "    pip install scikit-learn")
    digits = sk_load_digits()
    x = (digits.data / 16.0).astype(np.float32)             # 1797 x 64, pixel values 0..16 -> 0..1
    y = np.eye(10, dtype=np.float32)[digits.target]         # one-hot labels, 1797 x 10
    return x, y


def build_mlp(ctx: pc.Context, batch: int, nin: int, nhidden: int, nout: int, rng: np.random.Generator):
    """inputs [nin, batch] -> relu(W1 x + b1) -> W2 h + b2 = logits [nout, batch] (ggml extents)."""
    x = ctx.new_tensor(pc.F32, (nin, batch), "images")
    w1 = ctx.new_tensor(pc.F32, (nin, nhidden), "fc1.weight").set_param()
    b1 = ctx.new_tensor(pc.F32, (nhidden, 1), "fc1.bias").set_param()
    w2 = ctx.new_tensor(pc.F32, (nhidden, nout), "fc2.weight").set_param()
    b2 = ctx.new_tensor(pc.F32, (nout, 1), "fc2.bias").set_param()
    for w, fan_in in ((w1, nin), (w2, nhidden)):                # Kaiming-uniform init, zero biases
        bound = np.sqrt(6.0 / fan_in)
        w.set(rng.uniform(-bound, bound, w.shape))
    hidden = pc.relu(pc.add(pc.mul_mat(w1, x), b1))
    logits = pc.add(pc.mul_mat(w2, hidden), b2)
    return x, logits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="physical batch (datapoints per graph evaluation)")
    ap.add_argument("--logical", type=int, default=None,
                    help="logical batch (datapoints per optimizer step; default: --batch)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--alpha", type=float, default=1e-3, help="learning rate")
    ap.add_argument("--wd", type=float, default=0.0, help="decoupled weight decay")
    ap.add_argument("--decay", type=float, default=1.0, help="per-epoch learning-rate factor (schedule)")
    ap.add_argument("--val-split", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0, help="weight initialisation seed (shuffling is ggml's mt19937)")
    ap.add_argument("--backend", default=None, help="Prism backend (default: $PRISM_BACKEND or the best available)")
    ap.add_argument("--target", type=float, default=0.95, help="validation accuracy needed for exit status 0")
    ap.add_argument("--progress", action="store_true", help="draw the progress bar even if stderr is no terminal")
    ap.add_argument("--silent", action="store_true", help="no progress bar")
    ap.add_argument("--save", metavar="PATH", help="write the trained weights to PATH as GGUF")
    ap.add_argument("--mpi", action="store_true", help="data-parallel over the ranks of mpiexec (needs mpi4py)")
    args = ap.parse_args(argv)

    rank, nranks, fit = 0, 1, train.fit
    if args.mpi:
        from prism_core.train import distributed
        comm = distributed.world()
        distributed.abort_on_exception(comm)  # an error on one rank ends every rank
        rank, nranks, fit = comm.Get_rank(), comm.Get_size(), distributed.fit
        if args.batch % nranks:
            sys.exit(f"--mpi: --batch {args.batch} must be a multiple of the {nranks} ranks")
    def say(line: str) -> None:                             # results once, from rank 0
        if rank == 0:
            print(line)

    x_np, y_np = load_digits()
    logical = args.logical or args.batch
    physical = args.batch // nranks                          # each rank's share of a batch
    ndata = len(x_np) - len(x_np) % logical                  # fit needs whole logical batches
    x_np, y_np = x_np[:ndata], y_np[:ndata]
    dataset = train.Dataset.from_numpy(x_np, y_np)

    ctx = pc.Context()
    images, logits = build_mlp(ctx, physical, x_np.shape[1], args.hidden, 10, np.random.default_rng(args.seed))

    def schedule(epoch: int) -> train.OptimizerParams:      # called with the epoch number (from 1)
        alpha = args.alpha * args.decay ** (epoch - 1)
        return train.OptimizerParams(adamw=train.AdamWParams(alpha=alpha, wd=args.wd),
                                     sgd=train.SGDParams(alpha=alpha, wd=args.wd))

    be = pc.backend(args.backend)
    say(f"digits: {ndata} of 1797 images (whole logical batches of {logical}), MLP 64-{args.hidden}-10, "
        f"{args.optimizer} alpha={args.alpha:g} wd={args.wd:g} decay={args.decay:g}, physical batch {physical}"
        + (f" on each of {nranks} ranks" if args.mpi else "")
        + f", {args.epochs} epochs, val_split={args.val_split}, backend '{be.name}'")
    t0 = time.perf_counter()
    res = fit(ctx, images, logits, dataset, train.LossType.CROSS_ENTROPY, args.optimizer, schedule,
              nepoch=args.epochs, nbatch_logical=logical, val_split=args.val_split, silent=args.silent,
              backend=be, progress=True if args.progress else None)
    dt = time.perf_counter() - t0

    (tl, tlu), (ta, tau) = res.result_train.loss(), res.result_train.accuracy()
    (vl, vlu), (va, vau) = res.result_val.loss(), res.result_val.accuracy()
    say(f"train: {res.result_train.ndata} images, loss {tl:.5f} ± {tlu:.5f}, accuracy {100 * ta:.2f} ± "
        f"{100 * tau:.2f} % (last epoch, measured while training)")
    say(f"val:   {res.result_val.ndata} images, loss {vl:.5f} ± {vlu:.5f}, accuracy {100 * va:.2f} ± "
        f"{100 * vau:.2f} %")
    say(f"time: {dt:.2f} s for {args.epochs} epochs ({res.opt_ctx.iter - 1} optimizer steps)")
    if args.save and rank == 0:
        from prism_core import gguf
        weights = {t.name: t for t in ctx.tensors if t.flags & pc.Flag.PARAM}
        gguf.save(args.save, weights, {"general.architecture": "mlp", "mlp.input_length": x_np.shape[1],
                                       "mlp.hidden_length": args.hidden, "mlp.output_length": 10,
                                       "mlp.validation_accuracy": float(va)})
        say(f"saved {len(weights)} tensors to {args.save}")
    ok = va >= args.target
    say(f"validation accuracy {100 * va:.2f} % {'>=' if ok else '<'} target {100 * args.target:.0f} %: "
        f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
