"""Training as in ggml-opt: sharded datasets, optimizer contexts with static graphs,
gradient accumulation, AdamW/SGD, result statistics, epochs, ``fit`` and its progress bar.

Quick start::

    import numpy as np
    import prism_core as pc
    from prism_core import train

    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (4, 32), "x")                  # physical batch of 32 points of 4 values
    w = ctx.new_tensor(pc.F32, (4, 3), "w").set_param()
    w.set(np.random.default_rng(0).normal(0, 0.1, (3, 4)))
    logits = pc.mul_mat(w, x)                                  # [3, 32]
    ds = train.Dataset.from_numpy(features, one_hot_labels)    # (ndata, 4), (ndata, 3)
    res = train.fit(ctx, x, logits, ds, "cross_entropy", "adamw", nepoch=10, val_split=0.2)
    print(res.result_val.accuracy())

Data-parallel over MPI: ``from prism_core.train import distributed`` and call
``distributed.fit`` with the same arguments on every rank (``mpiexec -n 2 python train.py``;
needs the ``mpi`` extra). This package never imports it, nor mpi4py, by itself.
"""

from __future__ import annotations

from .dataset import Dataset
from .fit import EpochStats, FitResult, epoch, fit
from .metrics import Result
from .mt19937 import MT19937, shuffle, uniform_int
from .optimizer import (
    AdamWParams,
    BuildType,
    LossType,
    OptContext,
    OptimizerParams,
    OptimizerType,
    SGDParams,
    constant_optimizer_params,
    default_optimizer_params,
    optimizer_name,
    validate_optimizer_params,
)
from .progress import progress_bar_callback, progress_line

__all__ = [
    "MT19937", "AdamWParams", "BuildType", "Dataset", "EpochStats", "FitResult", "LossType", "OptContext",
    "OptimizerParams", "OptimizerType", "Result", "SGDParams", "constant_optimizer_params",
    "default_optimizer_params", "epoch", "fit", "optimizer_name", "progress_bar_callback", "progress_line",
    "shuffle", "uniform_int", "validate_optimizer_params",
]
