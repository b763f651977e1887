"""Epochs and whole training runs (ggml_opt_epoch / ggml_opt_fit)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from ..context import Context
from ..errors import InvalidArgument, ShapeMismatch
from ..plugin.base import Backend
from ..tensor import Tensor
from .dataset import Dataset
from .metrics import Result
from .optimizer import LossType, OptContext, OptimizerParams, OptimizerType, _enum
from .progress import hms, is_tty, progress_bar_callback, time_us

# (train, opt_ctx, dataset, result, ibatch done, ibatch_max, t_start_us)
EpochCallback = Callable[[bool, OptContext, Dataset, Result, int, int, int], Any]


def _int(name: str, v: Any, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgument(f"{name} must be an int, got {v!r}")
    if v < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {v}")
    return int(v)


def check_epoch_args(what: str, opt_ctx: OptContext, dataset: Dataset, idata_split: int) -> tuple[int, int]:
    """Validate an epoch's arguments; (number of physical batches, first validation batch)."""
    if not isinstance(opt_ctx, OptContext):
        raise InvalidArgument(f"{what}: opt_ctx must be an OptContext, got {type(opt_ctx).__name__}")
    if not isinstance(dataset, Dataset):
        raise InvalidArgument(f"{what}: dataset must be a Dataset, got {type(dataset).__name__}")
    inputs, labels = opt_ctx.inputs, opt_ctx.labels
    if dataset.ne_datapoint != inputs.ne[0]:
        raise ShapeMismatch(f"{what}: dataset datapoints have {dataset.ne_datapoint} values, the inputs "
                            f"{inputs.label} take {inputs.ne[0]} per datapoint (ne[0])")
    if (labels is None) != (dataset.labels is None):
        raise InvalidArgument(f"{what}: the loss {opt_ctx.loss_type.name} " + (
            "needs labels but the dataset has none" if labels is not None else
            "takes no labels but the dataset has labels (ne_label > 0)"))
    ndata, ndata_batch = dataset.ndata, inputs.ne[1]
    if ndata % ndata_batch:
        raise InvalidArgument(f"{what}: ndata={ndata} is not a multiple of the physical batch size {ndata_batch} "
                              "(inputs.ne[1])")
    idata_split = _int(f"{what}: idata_split", idata_split, -(1 << 62))
    if idata_split < 0:
        idata_split = ndata
    if idata_split > ndata or idata_split % ndata_batch:
        raise InvalidArgument(f"{what}: idata_split={idata_split} must be a multiple of the batch size "
                              f"{ndata_batch} and at most ndata={ndata}")
    return ndata // ndata_batch, idata_split // ndata_batch


def epoch(opt_ctx: OptContext, dataset: Dataset, result_train: Result | None = None,
          result_eval: Result | None = None, idata_split: int = -1, callback_train: EpochCallback | None = None,
          callback_eval: EpochCallback | None = None) -> None:
    """``ggml_opt_epoch``: physical batches ``[0, idata_split / batch)`` are trained on
    (alloc(backward) -> get_batch -> eval into ``result_train``), the rest are evaluated
    forward only into ``result_eval``. ``idata_split < 0`` trains on all data."""
    nbatches, ibatch_split = check_epoch_args("epoch", opt_ctx, dataset, idata_split)
    inputs, labels = opt_ctx.inputs, opt_ctx.labels
    t_start = time_us()
    for ibatch in range(ibatch_split):
        opt_ctx.alloc(True)
        dataset.get_batch(inputs, labels, ibatch)
        opt_ctx.eval(result_train)
        if callback_train is not None:
            callback_train(True, opt_ctx, dataset, result_train, ibatch + 1, ibatch_split, t_start)
    t_start = time_us()
    for ibatch in range(ibatch_split, nbatches):
        opt_ctx.alloc(False)
        dataset.get_batch(inputs, labels, ibatch)
        opt_ctx.eval(result_eval)
        if callback_eval is not None:
            callback_eval(False, opt_ctx, dataset, result_eval, ibatch + 1 - ibatch_split, nbatches - ibatch_split,
                          t_start)


@dataclass
class EpochStats:
    epoch: int
    train_loss: tuple[float, float]
    train_accuracy: tuple[float, float]
    val_loss: tuple[float, float]
    val_accuracy: tuple[float, float]


@dataclass
class FitResult:
    """What :func:`fit` leaves: the optimizer context, the last epoch's results and one
    :class:`EpochStats` per epoch."""
    opt_ctx: OptContext
    result_train: Result
    result_val: Result
    history: list[EpochStats] = field(default_factory=list)
    seconds: float = 0.0


def fit(ctx: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset,
        loss_type: LossType | int | str = LossType.CROSS_ENTROPY,
        optimizer: OptimizerType | int | str = OptimizerType.ADAMW,
        get_opt_pars: Callable[[Any], OptimizerParams] | OptimizerParams | None = None,
        nepoch: int = 1, nbatch_logical: int | None = None, val_split: float = 0.0, silent: bool = False, *,
        backend: Backend | str | None = None, callback: EpochCallback | None = None,
        progress: bool | None = None, stream: IO[str] | None = None, check_data: bool = True) -> FitResult:
    """``ggml_opt_fit``: train ``outputs`` (computed from ``inputs`` in ``ctx``) on ``dataset``.

    * The physical batch is ``inputs.ne[1]``; ``nbatch_logical`` (default: the physical
      batch) datapoints make one optimizer step, so gradients are accumulated over
      ``opt_period = nbatch_logical / physical`` batches.
    * The last ``val_split`` (in [0, 1)) of the logical batches is validation data:
      ``idata_split = floor((1 - val_split) * ndata / nbatch_logical) * nbatch_logical``.
    * The optimizer context's mt19937 shuffles all data once (if a logical batch is not
      all data), then the training part at the start of every epoch.
    * ``get_opt_pars(epoch)`` (epoch counted from 1) gives each step's parameters, so it
      doubles as a per-epoch schedule; an OptimizerParams is a constant schedule.
    * ``callback`` runs after every physical batch with ggml's epoch-callback arguments
      ``(train, opt_ctx, dataset, result, ibatch, ibatch_max, t_start_us)``.
    * The progress bar and epoch lines go to ``stream`` (default stderr); ``progress=None``
      shows them only when that stream is a terminal, ``silent=True`` never.
    * ``check_data`` (default on; ggml has no such check) refuses, before training, data or
      labels holding NaN or infinity and, for the cross-entropy loss, labels that are not
      probability distributions, naming the first bad datapoint (:meth:`Dataset.check`: one
      pass over the dataset; switch it off for data known to be clean).
    * A fit that raises leaves the model context as it found it: the tensors it created
      (labels, loss, gradients, optimizer state) are dropped again.
    """
    setup = prepare_fit(ctx, inputs, outputs, dataset, loss_type, get_opt_pars, nepoch, nbatch_logical, val_split,
                        silent, callback, progress, stream, check_data)
    if setup.check_data:
        dataset.check(probabilities=setup.loss_type == LossType.CROSS_ENTROPY)

    def make_opt_ctx(s: FitSetup) -> OptContext:
        return OptContext(ctx, inputs, outputs, s.loss_type, optimizer, s.opt_period, get_opt_pars=s.pars_cb,
                          get_opt_pars_ud=s.epoch_box, backend=backend)

    return run_fit(ctx, inputs, outputs, dataset, setup, make_opt_ctx, epoch)


@dataclass
class FitSetup:
    """A fit's checked arguments (:func:`prepare_fit`), shared by every training driver."""
    loss_type: LossType
    nepoch: int
    nbatch_logical: int
    opt_period: int
    idata_split: int
    pars_cb: Any
    epoch_box: dict
    show: bool
    out: IO[str]
    callback: EpochCallback | None
    check_data: bool


def prepare_fit(ctx: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset, loss_type: LossType | int | str,
                get_opt_pars: Any, nepoch: int, nbatch_logical: int | None, val_split: float, silent: bool,
                callback: EpochCallback | None, progress: bool | None, stream: IO[str] | None,
                check_data: bool) -> FitSetup:
    """Check :func:`fit`'s arguments (all but the dataset's values) and derive the batch split."""
    if not isinstance(ctx, Context):
        raise InvalidArgument(f"fit: ctx must be a Context, got {type(ctx).__name__}")
    if not isinstance(dataset, Dataset):
        raise InvalidArgument(f"fit: dataset must be a Dataset, got {type(dataset).__name__}")
    if not isinstance(inputs, Tensor):
        raise InvalidArgument(f"fit: inputs must be a Tensor, got {type(inputs).__name__}")
    nepoch = _int("fit: nepoch", nepoch, 1)
    ndata = dataset.ndata
    nbatch_physical = inputs.ne[1]
    if nbatch_logical is None:
        nbatch_logical = nbatch_physical
    nbatch_logical = _int("fit: nbatch_logical", nbatch_logical, 1)
    if ndata % nbatch_logical:
        raise InvalidArgument(f"fit: ndata={ndata} is not a multiple of nbatch_logical={nbatch_logical}")
    if nbatch_logical % nbatch_physical:
        raise InvalidArgument(f"fit: nbatch_logical={nbatch_logical} is not a multiple of the physical batch size "
                              f"{nbatch_physical} (inputs.ne[1])")
    if isinstance(val_split, bool) or not isinstance(val_split, (int, float, np.integer, np.floating)) \
            or not math.isfinite(val_split) or not 0.0 <= val_split < 1.0:
        raise InvalidArgument(f"fit: val_split must be a number in [0, 1), got {val_split!r}")
    if callback is not None and not callable(callback):
        raise InvalidArgument(f"fit: callback must be callable, got {type(callback).__name__}")
    if not isinstance(check_data, bool):
        raise InvalidArgument(f"fit: check_data must be a bool, got {check_data!r}")
    opt_period = nbatch_logical // nbatch_physical
    nbatches_logical = ndata // nbatch_logical
    # float32 arithmetic, truncated, as ggml
    ibatch_split = int((np.float32(1.0) - np.float32(val_split)) * np.float32(nbatches_logical)) * opt_period
    idata_split = ibatch_split * nbatch_physical
    if ibatch_split == 0:
        raise InvalidArgument(f"fit: val_split={val_split} leaves no training batch ({nbatches_logical} logical "
                              f"batches of {nbatch_logical})")

    out = stream if stream is not None else sys.stderr
    show = not silent and (progress if progress is not None else is_tty(out))
    epoch_box = {"epoch": 1}
    if get_opt_pars is None or isinstance(get_opt_pars, OptimizerParams):
        pars_cb: Any = get_opt_pars
    elif callable(get_opt_pars):
        def pars_cb(ud: Any) -> OptimizerParams:
            return get_opt_pars(ud["epoch"])
    else:
        raise InvalidArgument("fit: get_opt_pars must be a callable(epoch) returning OptimizerParams, an "
                              f"OptimizerParams or None, got {type(get_opt_pars).__name__}")

    loss_type = _enum(LossType, loss_type, "loss type")
    return FitSetup(loss_type, nepoch, nbatch_logical, opt_period, idata_split, pars_cb, epoch_box, show, out,
                    callback, check_data)


def run_fit(ctx: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset, setup: FitSetup,
            make_opt_ctx: Callable[[FitSetup], OptContext], run_epoch: Callable[..., None], *,
            restore: Callable[[OptContext, FitResult], int] | None = None,
            on_epoch: Callable[[OptContext, FitResult], None] | None = None) -> FitResult:
    """The epochs of a fit: ``make_opt_ctx(setup)`` builds the optimizer context, ``run_epoch``
    (:func:`epoch`'s signature) runs each epoch. A run that raises leaves the model context
    as it found it.

    ``restore(opt_ctx, fit_result)`` (resuming a run) is called once the optimizer context exists: it
    puts back a checkpoint's state (parameters, moments, iteration, generator, the dataset's
    permutation, ``fit_result.history``) and returns the number of epochs already done; the first
    shuffle of all data is then not repeated. ``on_epoch(opt_ctx, fit_result)`` runs after every epoch
    (its stats are ``fit_result.history[-1]``), e.g. to write a checkpoint."""
    flags = [(t, t.flags) for t in (inputs, outputs, outputs.view_src) if isinstance(t, Tensor)]
    mark = ctx.mark()
    try:
        return _fit(dataset, setup, make_opt_ctx, run_epoch, restore, on_epoch)
    except BaseException:  # nothing of a failed fit stays in the model's context
        ctx.rollback(mark)
        for t, f in flags:
            t.flags = f
        raise


def _fit(dataset: Dataset, setup: FitSetup, make_opt_ctx: Callable[[FitSetup], OptContext],
         run_epoch: Callable[..., None], restore: Callable[[OptContext, FitResult], int] | None = None,
         on_epoch: Callable[[OptContext, FitResult], None] | None = None) -> FitResult:
    ndata, nepoch, nbatch_logical, idata_split = dataset.ndata, setup.nepoch, setup.nbatch_logical, setup.idata_split
    show, out, callback, epoch_box = setup.show, setup.out, setup.callback, setup.epoch_box
    t_start = time_us()
    opt_ctx = make_opt_ctx(setup)
    result_train, result_val = Result(), Result()
    fr = FitResult(opt_ctx, result_train, result_val)
    done = restore(opt_ctx, fr) if restore is not None else 0
    if not done and nbatch_logical < ndata:
        dataset.shuffle(opt_ctx, -1)  # train and validation data
    bar = progress_bar_callback(out) if show else None

    def cb(*args: Any) -> None:
        if bar is not None:
            bar(*args)
        if callback is not None:
            callback(*args)

    use_cb = cb if (bar is not None or callback is not None) else None
    for ep in range(done + 1, nepoch + 1):
        epoch_box["epoch"] = ep
        if nbatch_logical < idata_split:
            dataset.shuffle(opt_ctx, idata_split)
        result_train.reset()
        result_val.reset()
        if show:
            out.write(f"fit: epoch {ep:04d}/{nepoch:04d}:\n")
        run_epoch(opt_ctx, dataset, result_train, result_val, idata_split, use_cb, use_cb)
        if show:
            out.write("\n")
            out.flush()
        fr.history.append(EpochStats(ep, result_train.loss(), result_train.accuracy(), result_val.loss(),
                                     result_val.accuracy()))
        if on_epoch is not None:
            on_epoch(opt_ctx, fr)
    t_total = time_us() - t_start
    fr.seconds = t_total / 1e6
    if show:
        out.write(f"fit: training took {hms(t_total)}\n")
        out.flush()
    return fr
