"""Data-parallel training over MPI (``mpi4py``): :func:`fit` and :func:`epoch` on many
processes and machines, equal to one process with gradient accumulation.

Every rank holds the whole model and the whole dataset. Rank 0's initial parameters are
broadcast to all; every rank shuffles with the same mt19937, so all agree on the order of
the shards. A logical batch of ``P = nbatch_logical / physical`` physical batches is split
into ``nranks`` contiguous runs of ``P / nranks`` batches; each rank accumulates the gradients
of its run (its loss scaled by ``1/P``, as one process accumulating over ``P`` scales it),
then **one** in-place ``Allreduce`` over a single float32 buffer sums the gradient
accumulators (they are views into that buffer) together with each batch's loss, number of
correct predictions and predictions, and every rank takes the identical AdamW/SGD step.
Losses, accuracies, their uncertainties and the predictions are thus those of one process
with ``nbatch_logical`` datapoints per step, batch for batch; the parameters differ from it
only by the allreduce's summation order.

Launch with ``mpiexec -n 2 python train.py`` (one machine), ``mpiexec -n 8 --hostfile hosts
python train.py`` (a cluster) or a scheduler's launcher (``srun -n 8 python train.py``); set
``PRISM_NUM_THREADS`` to the cores per rank. ``pip install 'prism-tensor[mpi]'`` brings
mpi4py and Open MPI. This module imports mpi4py only when a communicator is needed.

Faults: arguments that differ across ranks (parameter shapes, batch sizes, datasets) and a
logical batch that cannot be split evenly are refused on every rank, before any work, with
the sizes named. A rank that raises during training prints its error and aborts every rank
(``MPI_Abort``), so no rank waits forever in a collective; :func:`abort_on_exception` does the
same for errors outside ``fit``.
"""

from __future__ import annotations

import sys
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from ..autodiff import reset as graph_reset
from ..context import Context
from ..errors import InvalidArgument, PrismError, ShapeMismatch, Unsupported
from ..graph import Graph
from ..plan import Plan, plan
from ..plugin.base import Backend
from ..tensor import Flag, Tensor
from .dataset import Dataset
from .fit import EpochCallback, FitResult, FitSetup, check_epoch_args, prepare_fit, run_fit
from .fit import fit as fit_plain
from .metrics import Result
from .optimizer import BuildType, LossType, OptContext, OptimizerParams, OptimizerType, optimizer_name
from .progress import time_us

INSTALL_HINT = "pip install 'prism-tensor[mpi]' (mpi4py and Open MPI) or pip install mpi4py mpich"


def world() -> Any:
    """``MPI.COMM_WORLD`` (imports mpi4py, which initialises MPI)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise Unsupported(f"distributed training needs mpi4py: {INSTALL_HINT} ({e})") from None
    return MPI.COMM_WORLD


def _in_place(comm: Any) -> Any:
    """mpi4py's in-place marker for an mpi4py communicator; a stand-in (a test's) gets None."""
    if type(comm).__module__.split(".")[0] != "mpi4py":
        return None
    from mpi4py import MPI
    return MPI.IN_PLACE


def abort_on_exception(comm: Any = None) -> None:
    """Make an uncaught exception on any rank print its traceback and abort every rank,
    instead of leaving the others waiting in a collective (what ``python -m mpi4py`` does)."""
    comm = world() if comm is None else comm
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        _abort(comm, None)
    sys.excepthook = hook


def _abort(comm: Any, err: BaseException | None) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    if err is not None:
        sys.stderr.write(f"prism: rank {rank} of {size} failed:\n" + "".join(traceback.format_exception(err)))
    sys.stderr.write(f"prism: rank {rank} of {size} aborts every rank (MPI_Abort)\n")
    sys.stderr.flush()
    comm.Abort(1)


# --------------------------------------------------------------------- batch split
@dataclass(frozen=True)
class Split:
    """How each logical batch of ``opt_period`` physical batches is shared by the ranks."""
    nranks: int
    rank: int
    opt_period: int  # physical batches per optimizer step, over all ranks

    @property
    def local_period(self) -> int:
        return self.opt_period // self.nranks

    def local_batches(self, first: int) -> range:
        """This rank's physical batches of the logical batch starting at batch ``first``."""
        p = self.local_period
        return range(first + self.rank * p, first + (self.rank + 1) * p)


def split_batches(nranks: int, rank: int, nbatch_physical: int, nbatch_logical: int) -> Split:
    """The split of a logical batch across ranks; refuses one that is not even, naming the sizes."""
    if nbatch_logical % nbatch_physical:
        raise InvalidArgument(f"distributed fit: nbatch_logical={nbatch_logical} is not a multiple of the physical "
                              f"batch size {nbatch_physical} (inputs.ne[1])")
    period = nbatch_logical // nbatch_physical
    if period % nranks:
        raise InvalidArgument(
            f"distributed fit: a logical batch of {nbatch_logical} datapoints is {period} physical batches of "
            f"{nbatch_physical}, which {nranks} ranks cannot share evenly; make nbatch_logical a multiple of "
            f"{nranks} x {nbatch_physical} = {nranks * nbatch_physical}")
    return Split(nranks, rank, period)


# --------------------------------------------------------------- optimizer context
class DistributedOptContext(OptContext):
    """An :class:`OptContext` whose optimizer step follows a sum of the gradient accumulators
    over the ranks of ``comm``. Its ``opt_period`` counts the physical batches of one step over
    all ranks (the loss is scaled by its inverse); each rank evaluates ``opt_period / nranks``."""

    def __init__(self, ctx: Context, inputs: Tensor, outputs: Tensor, loss_type: LossType | int | str,
                 optimizer: OptimizerType | int | str, opt_period: int, *, comm: Any,
                 get_opt_pars: Callable[[Any], OptimizerParams] | OptimizerParams | None = None,
                 get_opt_pars_ud: Any = None, backend: Backend | str | None = None) -> None:
        if not isinstance(inputs, Tensor) or not isinstance(ctx, Context):
            raise InvalidArgument("DistributedOptContext: ctx must be a Context and inputs a Tensor")
        if isinstance(opt_period, bool) or not isinstance(opt_period, (int, np.integer)) or opt_period < 1:
            raise InvalidArgument(f"DistributedOptContext: opt_period must be an int >= 1, got {opt_period!r}")
        self.comm = comm
        self._in_place = _in_place(comm)
        self.split = split_batches(comm.Get_size(), comm.Get_rank(), inputs.ne[1], opt_period * inputs.ne[1])
        with ctx.transaction():
            # gradients only; the step is a graph of its own that reads the summed accumulators
            super().__init__(ctx, inputs, outputs, loss_type, optimizer, opt_period, get_opt_pars=get_opt_pars,
                             get_opt_pars_ud=get_opt_pars_ud, build_type=BuildType.GRAD, backend=backend)
            assert self.gb_grad is not None
            self.gb_step = Graph(8 * len(self.params) + 16)  # a step node and its 5 sources per parameter
            for node in reversed(self.gf.nodes):
                acc = self.gb_grad.grad_acc(node)
                if acc is not None and node.flags & Flag.PARAM:
                    self.gb_step.expand(self._opt_step(node, acc))
            graph_reset(self.gb_step)
        self.build_type_alloc = BuildType.OPT
        self._fuse_buffers()
        self.allreduce_seconds = 0.0
        self.nallreduce = 0

    def _fuse_buffers(self) -> None:
        """One float32 buffer: every parameter's gradient accumulator (rebound as a view into
        it, so the allreduce works in place), then per physical batch of a step its loss,
        its number of correct predictions and its predictions."""
        assert self.gb_grad is not None
        accs = [self.gb_grad.grad_acc(p) for p in self.params]
        ngrad = sum(a.nelements for a in accs if a is not None)
        period, batch = self.opt_period, self.inputs.ne[1]
        self.fused = np.zeros(ngrad + period * (2 + batch), dtype=np.float32)
        raw = self.fused.view(np.uint8)
        off = 0
        for acc in accs:
            assert acc is not None and acc.view_src is None and acc.is_contiguous()
            n = acc.nelements
            view = raw[4 * off:4 * (off + n)]
            view[...] = acc.storage()[:acc.nbytes]
            # a leaf's memory is its own until a plan binds it; no plan exists yet, so the
            # plans made later bind this view (the context has no writable mapped tensors)
            acc._storage = view
            acc.ctx._raw.pop(id(acc), None)
            off += n
        self.grad_buffer = self.fused[:ngrad]
        self.metrics = self.fused[ngrad:]
        self.batch_loss = self.metrics[:period]
        self.batch_ncorrect = self.metrics[period:2 * period]
        self.batch_pred = self.metrics[2 * period:].reshape(period, batch)

    def alloc(self, backward: bool) -> None:
        if backward:
            raise InvalidArgument("DistributedOptContext: train with train_step() or distributed.epoch(); "
                                  "alloc(True) and eval() would step without summing the ranks' gradients")
        super().alloc(backward)

    def _compute(self, graph: Graph) -> None:
        planned: Plan | None = self._plans.get(id(graph))
        if planned is None:
            planned = self._plans[id(graph)] = plan(graph, self.backend)
        planned.compute()

    def _record(self, slot: int) -> None:
        self.batch_loss[slot] = self.loss.numpy().reshape(-1)[0]
        if self.ncorrect is not None:
            self.batch_ncorrect[slot] = int(self.ncorrect.numpy().reshape(-1)[0])
        if self.pred is not None:
            self.batch_pred[slot] = self.pred.numpy().reshape(-1)

    def _allreduce(self, buf: np.ndarray) -> None:
        t0 = time.perf_counter()
        self.comm.Allreduce(self._in_place, buf)
        self.allreduce_seconds += time.perf_counter() - t0
        self.nallreduce += 1

    def _run_batches(self, dataset: Dataset, first: int, graph: Graph) -> None:
        self.metrics[...] = 0.0  # other ranks' slots stay 0, so the sum gathers every batch
        p = self.split.local_period
        for j, ibatch in enumerate(self.split.local_batches(first)):
            dataset.get_batch(self.inputs, self.labels, ibatch)
            self._compute(graph)
            self._record(self.split.rank * p + j)

    def train_step(self, dataset: Dataset, first: int) -> None:
        """One optimizer step on the logical batch starting at physical batch ``first``."""
        assert self.gb_grad is not None
        graph_reset(self.gb_grad)  # accumulators to 0, the loss gradient to 1
        self._run_batches(dataset, first, self.gb_grad)
        self._fill_opt_step_params()
        self._allreduce(self.fused)
        self._compute(self.gb_step)
        self.iter += 1

    def eval_chunk(self, dataset: Dataset, first: int) -> None:
        """Forward passes over the ``opt_period`` physical batches starting at ``first``."""
        self._run_batches(dataset, first, self.gf)
        self._allreduce(self.metrics)

    def add_to(self, result: Result | None) -> None:
        """Record the last step's (or chunk's) batches, of all ranks in batch order."""
        if result is None:
            return
        batch = self.inputs.ne[1]
        for i in range(self.opt_period):
            result.add_batch(float(self.batch_loss[i]), batch,
                             ncorrect=None if self.ncorrect is None else int(self.batch_ncorrect[i]),
                             pred=None if self.pred is None else self.batch_pred[i].astype(np.int32),
                             opt_period=self.opt_period, loss_per_datapoint=self.loss_per_datapoint)

    def broadcast_params(self, root: int = 0) -> None:
        """Give every rank ``root``'s parameter values."""
        for p in self.params:
            raw = np.ascontiguousarray(p.numpy()).view(np.uint8)
            self.comm.Bcast(raw, root=root)
            p.set(raw.view(p.numpy().dtype).reshape(p.shape))

    def params_digest(self) -> int:
        crc = 0
        for p in self.params:
            crc = zlib.crc32(np.ascontiguousarray(p.numpy()).view(np.uint8), crc)
        return crc

    def __repr__(self) -> str:
        return (f"DistributedOptContext(rank {self.split.rank} of {self.split.nranks}, {self.loss_type.name}, "
                f"{self.optimizer.name}, opt_period={self.opt_period}, iter={self.iter}, "
                f"backend={self.backend.name!r}, {len(self.params)} params)")


# ------------------------------------------------------------------------ epochs
def epoch(opt_ctx: DistributedOptContext, dataset: Dataset, result_train: Result | None = None,
          result_eval: Result | None = None, idata_split: int = -1, callback_train: EpochCallback | None = None,
          callback_eval: EpochCallback | None = None) -> None:
    """:func:`prism_core.train.epoch` over the ranks: the callbacks run on every rank after
    each logical batch with the results of all ranks; ``ibatch`` counts physical batches."""
    if not isinstance(opt_ctx, DistributedOptContext):
        raise InvalidArgument(f"distributed epoch: opt_ctx must be a DistributedOptContext, got "
                              f"{type(opt_ctx).__name__}")
    nbatches, ibatch_split = check_epoch_args("distributed epoch", opt_ctx, dataset, idata_split)
    period = opt_ctx.opt_period
    if ibatch_split % period or nbatches % period:
        raise InvalidArgument(f"distributed epoch: the training part ({ibatch_split} physical batches) and the "
                              f"whole dataset ({nbatches}) must be whole logical batches of {period}")
    for train, first_batch, end, result, callback in ((True, 0, ibatch_split, result_train, callback_train),
                                                      (False, ibatch_split, nbatches, result_eval, callback_eval)):
        t_start = time_us()
        for first in range(first_batch, end, period):
            if train:
                opt_ctx.train_step(dataset, first)
            else:
                opt_ctx.eval_chunk(dataset, first)
            opt_ctx.add_to(result)
            if callback is not None:
                callback(train, opt_ctx, dataset, result, first + period - first_batch, end - first_batch, t_start)


# --------------------------------------------------------------------------- fit
@dataclass
class DistributedFitResult(FitResult):
    """:class:`FitResult` plus where the time went on this rank."""
    rank: int = 0
    nranks: int = 1
    nallreduce: int = 0
    allreduce_seconds: float = 0.0


def _describe(ctx: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset, setup: FitSetup, optimizer: Any,
              fingerprint: bool) -> dict:
    """What must be equal on every rank."""
    if not isinstance(outputs, Tensor):
        raise InvalidArgument(f"fit: outputs must be a Tensor, got {type(outputs).__name__}")
    params = [n for n in Graph(max(2048, 8 * len(ctx.tensors) + 64)).expand(outputs).nodes if n.flags & Flag.PARAM]
    desc = {
        "parameters": [(p.name, p.traits.name, tuple(p.ne)) for p in params],
        "inputs": (inputs.traits.name, tuple(inputs.ne)),
        "outputs": (outputs.traits.name, tuple(outputs.ne)),
        "dataset (ndata, ne_datapoint, ne_label, ndata_shard)": (dataset.ndata, dataset.ne_datapoint,
                                                                 dataset.ne_label, dataset.ndata_shard),
        "batches (nbatch_logical, idata_split, nepoch)": (setup.nbatch_logical, setup.idata_split, setup.nepoch),
        "loss and optimizer": (setup.loss_type.name, optimizer_name(optimizer)),
    }
    if fingerprint:  # the same data everywhere, or the shuffled shards differ
        crc = zlib.crc32(dataset.data.storage())
        if dataset.labels is not None:
            crc = zlib.crc32(dataset.labels.storage(), crc)
        desc["dataset CRC-32"] = f"{crc:08x}"
    return desc


SHAPE_KEYS = ("parameters", "inputs", "outputs")


def _first_difference(mine: dict, ref: dict) -> tuple[str, str] | None:
    """(what differs, how) between a rank's description and rank 0's, or None."""
    for key, want in ref.items():
        got = mine.get(key)
        if got == want:
            continue
        if key == "parameters" and isinstance(got, list):
            if len(got) != len(want):
                return key, f"{len(got)} parameters, rank 0 has {len(want)}"
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    return key, (f"parameter #{i} '{g[0]}' is {g[1]} ne={list(g[2])}, on rank 0 '{w[0]}' is {w[1]} "
                                 f"ne={list(w[2])}")
        return key, f"{key} {got}, rank 0 has {want}"
    return None


def fit(ctx: Context, inputs: Tensor, outputs: Tensor, dataset: Dataset,
        loss_type: LossType | int | str = LossType.CROSS_ENTROPY,
        optimizer: OptimizerType | int | str = OptimizerType.ADAMW,
        get_opt_pars: Callable[[Any], OptimizerParams] | OptimizerParams | None = None,
        nepoch: int = 1, nbatch_logical: int | None = None, val_split: float = 0.0, silent: bool = False, *,
        backend: Backend | str | None = None, callback: EpochCallback | None = None,
        progress: bool | None = None, stream: IO[str] | None = None, check_data: bool = True,
        comm: Any = None) -> FitResult:
    """:func:`prism_core.train.fit` over the ranks of ``comm`` (default ``MPI.COMM_WORLD``),
    called on every rank with the same arguments. ``nbatch_logical`` defaults to one physical
    batch per rank; it must be a multiple of ``nranks x inputs.ne[1]``. Only rank 0 draws
    the progress bar; ``callback`` runs on every rank once per logical batch. Every rank
    returns the same statistics (a :class:`DistributedFitResult`) and the same parameters.
    One rank (no mpiexec) is a plain :func:`prism_core.train.fit`."""
    comm = world() if comm is None else comm
    rank, nranks = comm.Get_rank(), comm.Get_size()
    if nranks == 1:
        return fit_plain(ctx, inputs, outputs, dataset, loss_type, optimizer, get_opt_pars, nepoch, nbatch_logical,
                         val_split, silent, backend=backend, callback=callback, progress=progress, stream=stream,
                         check_data=check_data)
    # refuse bad or mismatched arguments on every rank alike, before any work
    error: str | None = None
    mine: Exception | None = None
    desc: dict = {}
    try:
        if nbatch_logical is None and isinstance(inputs, Tensor):
            nbatch_logical = nranks * inputs.ne[1]
        setup = prepare_fit(ctx, inputs, outputs, dataset, loss_type, get_opt_pars, nepoch, nbatch_logical,
                            val_split, silent or rank != 0, callback, progress, stream, check_data)
        split_batches(nranks, rank, inputs.ne[1], setup.nbatch_logical)
        desc = _describe(ctx, inputs, outputs, dataset, setup, optimizer, check_data)
    except Exception as e:  # noqa: BLE001 - reported to every rank, then raised here
        error = f"{type(e).__name__}: {e}"
        mine = e
    gathered = comm.allgather((error, desc))
    failed = [(r, err) for r, (err, _) in enumerate(gathered) if err is not None]
    if failed:
        if mine is not None:
            raise mine
        r, err = failed[0]
        raise InvalidArgument(f"distributed fit: rank {r} of {nranks} refused its arguments: {err}")
    for r, (_, d) in enumerate(gathered[1:], start=1):
        diff = _first_difference(d, gathered[0][1])
        if diff is not None:
            cls = ShapeMismatch if diff[0] in SHAPE_KEYS else InvalidArgument
            raise cls(f"distributed fit: the ranks disagree: rank {r} has {diff[1]}")
    if check_data:  # the same data on every rank (checked above), so all refuse alike
        dataset.check(probabilities=setup.loss_type == LossType.CROSS_ENTROPY)

    def make_opt_ctx(s: FitSetup) -> OptContext:
        oc = DistributedOptContext(ctx, inputs, outputs, s.loss_type, optimizer, s.opt_period, comm=comm,
                                   get_opt_pars=s.pars_cb, get_opt_pars_ud=s.epoch_box, backend=backend)
        oc.broadcast_params()
        return oc

    try:
        fr = run_fit(ctx, inputs, outputs, dataset, setup, make_opt_ctx, epoch)
    except BaseException as e:  # the other ranks may be inside a collective: stop them all
        _abort(comm, e)
        raise
    oc = fr.opt_ctx
    assert isinstance(oc, DistributedOptContext)
    digests = comm.allgather(oc.params_digest())
    if len(set(digests)) > 1:
        raise PrismError(f"distributed fit: the parameters diverged across ranks (CRC-32 per rank: "
                         f"{', '.join(f'{d:08x}' for d in digests)}); the MPI library's allreduce did not give "
                         "every rank the same sum")
    return DistributedFitResult(oc, fr.result_train, fr.result_val, fr.history, fr.seconds, rank, nranks,
                                oc.nallreduce, oc.allreduce_seconds)

