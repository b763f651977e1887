"""Optimizer contexts with static graphs (ggml_opt_init / alloc / eval / reset).

An :class:`OptContext` is built once from a model (``inputs`` -> ``outputs`` in one
:class:`~prism_core.context.Context`) and a loss type. It builds, as ggml-opt does:

* the forward graph ``gf``: outputs, the loss (built and scaled as ggml: MEAN, SUM,
  CROSS_ENTROPY, MEAN_SQUARED_ERROR; scaled by 1/opt_period so that the gradients summed
  over ``opt_period`` physical batches are the gradient of the logical batch), and for
  CROSS_ENTROPY ``pred = argmax(outputs)`` and ``ncorrect = count_equal(pred, argmax(labels))``;
* ``gb_grad``: a copy of ``gf`` expanded with :func:`~prism_core.build_backward`, with one
  gradient accumulator per parameter when accumulating (``opt_period > 1``);
* ``gb_opt``: a copy of ``gb_grad`` plus one ``opt_step_adamw`` / ``opt_step_sgd`` per
  parameter (last to first), all sharing one ``opt_step_params`` tensor of 7 (AdamW) or 2
  (SGD) values that :meth:`OptContext.eval` fills from the ``get_opt_pars`` callback.

Every graph is planned once (:func:`prism_core.plan`) on the context's backend and computed through its plan.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..autodiff import build_backward
from ..autodiff import reset as graph_reset
from ..context import Context
from ..errors import InvalidArgument, TypeMismatch
from ..graph import Graph
from ..ops import build as B
from ..plan import Plan, Workspace, plan
from ..plugin.base import Backend
from ..plugin.registry import REGISTRY
from ..tensor import Flag, Tensor
from ..types import F32, I32, I64
from .metrics import Result
from .mt19937 import MT19937


class LossType(enum.IntEnum):
    MEAN = 0
    SUM = 1
    CROSS_ENTROPY = 2
    MEAN_SQUARED_ERROR = 3


class BuildType(enum.IntEnum):
    FORWARD = 10
    GRAD = 20
    OPT = 30


class OptimizerType(enum.IntEnum):
    ADAMW = 0
    SGD = 1


OPTIMIZER_NAMES = {OptimizerType.ADAMW: "adamw", OptimizerType.SGD: "sgd"}


def optimizer_name(t: OptimizerType | int | str) -> str:
    return OPTIMIZER_NAMES[_enum(OptimizerType, t, "optimizer")]


def _enum(cls: type[enum.IntEnum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        key = value.upper().replace("-", "_")
        if key in cls.__members__:
            return cls[key]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        try:
            return cls(int(value))
        except ValueError:
            pass
    raise InvalidArgument(f"unknown {what} {value!r}; known: {', '.join(cls.__members__)}")


# ---------------------------------------------------------------- optimizer parameters
@dataclass
class AdamWParams:
    alpha: float = 0.001  # learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    wd: float = 0.0  # decoupled weight decay, applied as w *= 1 - alpha * wd


@dataclass
class SGDParams:
    alpha: float = 0.001
    wd: float = 0.0


@dataclass
class OptimizerParams:
    """``ggml_opt_optimizer_params``: both optimizers' settings; the context uses the one of its type."""
    adamw: AdamWParams = field(default_factory=AdamWParams)
    sgd: SGDParams = field(default_factory=SGDParams)


def default_optimizer_params(userdata: Any = None) -> OptimizerParams:
    """``ggml_opt_get_default_optimizer_params`` (ignores its argument)."""
    return OptimizerParams()


def constant_optimizer_params(params: OptimizerParams) -> Callable[[Any], OptimizerParams]:
    """A ``get_opt_pars`` callback that always returns ``params`` (checked now)."""
    if not isinstance(params, OptimizerParams):
        raise InvalidArgument(f"constant_optimizer_params: expected OptimizerParams, got {type(params).__name__}")
    validate_optimizer_params(params, None)
    return lambda userdata=None: params


def _finite(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"optimizer parameter {name} must be a number, got {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise InvalidArgument(f"optimizer parameter {name} must be finite, got {f}")
    return f


def validate_optimizer_params(p: Any, optimizer: OptimizerType | None = None) -> OptimizerParams:
    """Check ``p`` (both optimizers' settings, or only ``optimizer``'s): alpha > 0, betas in
    [0, 1), eps >= 0, wd in [0, 1], all finite. ggml asserts the same bounds except that
    it lets a beta be 1, which makes the bias correction 1/(1 - beta^t) infinite."""
    if not isinstance(p, OptimizerParams):
        raise InvalidArgument(f"optimizer parameters must be an OptimizerParams, got {type(p).__name__} "
                              "(a get_opt_pars callback must return one)")
    if optimizer in (None, OptimizerType.ADAMW):
        a = p.adamw
        if not isinstance(a, AdamWParams):
            raise InvalidArgument(f"OptimizerParams.adamw must be an AdamWParams, got {type(a).__name__}")
        alpha, b1, b2, eps, wd = (_finite(f"adamw.{n}", getattr(a, n)) for n in ("alpha", "beta1", "beta2", "eps",
                                                                                 "wd"))
        if alpha <= 0:
            raise InvalidArgument(f"adamw.alpha (learning rate) must be > 0, got {alpha}")
        for n, b in (("beta1", b1), ("beta2", b2)):
            if not 0.0 <= b < 1.0:
                raise InvalidArgument(f"adamw.{n} must be in [0, 1), got {b}")
        if eps < 0:
            raise InvalidArgument(f"adamw.eps must be >= 0, got {eps}")
        if not 0.0 <= wd <= 1.0:
            raise InvalidArgument(f"adamw.wd (weight decay) must be in [0, 1], got {wd}")
    if optimizer in (None, OptimizerType.SGD):
        s = p.sgd
        if not isinstance(s, SGDParams):
            raise InvalidArgument(f"OptimizerParams.sgd must be an SGDParams, got {type(s).__name__}")
        alpha, wd = _finite("sgd.alpha", s.alpha), _finite("sgd.wd", s.wd)
        if alpha <= 0:
            raise InvalidArgument(f"sgd.alpha (learning rate) must be > 0, got {alpha}")
        if not 0.0 <= wd <= 1.0:
            raise InvalidArgument(f"sgd.wd (weight decay) must be in [0, 1], got {wd}")
    return p


def _resolve_backend(backend: Backend | str | None) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if backend is not None and not isinstance(backend, str):
        raise InvalidArgument(f"backend must be a Backend, a backend name or None, got {type(backend).__name__}")
    return REGISTRY.get(backend)


def _copy_graph(g: Graph) -> Graph:
    """An independent graph with the same nodes in the same order (ggml_graph_dup)."""
    out = Graph(g.capacity)
    for n in g.nodes:
        out.expand(n)
    for leaf in g.leafs:
        out.expand(leaf)
    out.grads.update(g.grads)
    out.grad_accs.update(g.grad_accs)
    return out


# ------------------------------------------------------------------ optimizer context
class OptContext:
    """``ggml_opt_context`` with static graphs.

    ``ctx`` is the context of the model; the labels, loss, accumulators, moments and
    step parameters are created in it too (Prism ops need all sources in one context).
    ``get_opt_pars`` is called as ``get_opt_pars(get_opt_pars_ud)`` before every optimizer
    step and must return :class:`OptimizerParams`; an :class:`OptimizerParams` may be
    given instead of a callback. ``sparse_labels`` (CROSS_ENTROPY only; a Prism extension of
    ggml-opt): the labels are one I32 class index per datapoint instead of F32 rows of the
    outputs' shape, as a language model's next tokens (no F32 [n_vocab, n_tokens] labels
    tensor, no argmax over it for the accuracy). ``keep_grads=False`` lets the planner reuse the memory of
    gradients that are not accumulators once read (a model's activations' gradients: the
    optimizer steps consume the parameters' own), so they are not readable after an eval.
    The graphs' scratch memory is one :class:`~prism_core.plan.Workspace`: they never
    compute at the same time. ``backend`` is a Backend, a name, or None for
    :func:`prism_core.plugin.base`'s choice ($PRISM_BACKEND, else the best available).
    """

    def __init__(self, ctx: Context, inputs: Tensor, outputs: Tensor,
                 loss_type: LossType | int | str = LossType.MEAN,
                 optimizer: OptimizerType | int | str = OptimizerType.ADAMW, opt_period: int = 1, *,
                 get_opt_pars: Callable[[Any], OptimizerParams] | OptimizerParams | None = None,
                 get_opt_pars_ud: Any = None, build_type: BuildType | int | str = BuildType.OPT,
                 backend: Backend | str | None = None, graph_size: int | None = None,
                 keep_grads: bool = True, sparse_labels: bool = False) -> None:
        if not isinstance(ctx, Context):
            raise InvalidArgument(f"OptContext: ctx must be a Context, got {type(ctx).__name__}")
        for what, t in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(t, Tensor):
                raise InvalidArgument(f"OptContext: {what} must be a Tensor, got {type(t).__name__}")
            if t.ctx is not ctx:
                raise InvalidArgument(f"OptContext: {what} {t.label} belongs to another context than ctx")
        self.loss_type = _enum(LossType, loss_type, "loss type")
        self.optimizer = _enum(OptimizerType, optimizer, "optimizer type")
        self.build_type_alloc = _enum(BuildType, build_type, "build type")
        if isinstance(opt_period, bool) or not isinstance(opt_period, (int, np.integer)) or opt_period < 1:
            raise InvalidArgument(f"OptContext: opt_period must be an int >= 1, got {opt_period!r}")
        self.opt_period = int(opt_period)
        if isinstance(get_opt_pars, OptimizerParams):
            constant = validate_optimizer_params(get_opt_pars, self.optimizer)
            get_opt_pars = lambda userdata=None: constant  # noqa: E731
        elif get_opt_pars is None:
            get_opt_pars = default_optimizer_params
        elif not callable(get_opt_pars):
            raise InvalidArgument("OptContext: get_opt_pars must be a callable returning OptimizerParams, "
                                  f"an OptimizerParams or None, got {type(get_opt_pars).__name__}")
        if outputs.type != F32:
            raise TypeMismatch(f"OptContext: outputs {outputs.label} must be f32, is {outputs.traits.name}")
        self.get_opt_pars = get_opt_pars
        self.get_opt_pars_ud = get_opt_pars_ud
        self.backend = _resolve_backend(backend)
        if not isinstance(keep_grads, bool):
            raise InvalidArgument(f"OptContext: keep_grads must be a bool, got {keep_grads!r}")
        self.keep_grads = keep_grads
        if not isinstance(sparse_labels, bool):
            raise InvalidArgument(f"OptContext: sparse_labels must be a bool, got {sparse_labels!r}")
        if sparse_labels and self.loss_type != LossType.CROSS_ENTROPY:
            raise InvalidArgument(f"OptContext: sparse_labels are class indices for the CROSS_ENTROPY loss, not "
                                  f"{self.loss_type.name}")
        self.sparse_labels = sparse_labels
        self._plans: dict[int, Plan] = {}  # id(graph) -> its plan, made on first eval
        self.workspace = Workspace()  # the graphs compute one at a time: their scratch in one buffer
        self.ctx = ctx
        self.inputs = inputs
        self.outputs = outputs
        self.rng = MT19937()  # default-constructed std::mt19937: seed 5489, shared by all shuffles
        self.iter = 1
        self.opt_i = 0
        self.build_type = self.build_type_alloc
        self.eval_ready = False
        self.allocated_graph: Graph | None = None
        self.labels: Tensor | None = None
        self.pred: Tensor | None = None
        self.ncorrect: Tensor | None = None
        self.gb_grad: Graph | None = None
        self.gb_opt: Graph | None = None
        self.opt_step_params: Tensor | None = None
        self.grad_m: dict[Tensor, Tensor] = {}
        self.grad_v: dict[Tensor, Tensor] = {}
        size = graph_size if graph_size is not None else max(2048, 8 * len(ctx.tensors) + 64)
        gf = Graph(size)
        if outputs.flags & Flag.LOSS or any(n.flags & Flag.LOSS for n in Graph(size).expand(outputs).nodes):
            raise InvalidArgument("OptContext: the model graph already has a loss node (set_loss); the optimizer "
                                  "context builds the loss itself")
        flags = [(t, t.flags) for t in (inputs, outputs, outputs.view_src) if t is not None]
        try:
            with ctx.transaction():  # a failed build drops every tensor it created
                inputs.set_input()
                outputs.set_output()
                gf.expand(outputs)
                self._build_loss(gf)
                self.gf = gf
                self._build()
        except BaseException:
            for t, f in flags:
                t.flags = f
            raise
        self.loss_per_datapoint = self.loss_type != LossType.SUM

    # ----------------------------------------------------------------- build
    def _build_loss(self, gf: Graph) -> None:
        out, lt, period = self.outputs, self.loss_type, self.opt_period
        if lt == LossType.MEAN:
            loss = B.sum(out).set_name("loss_sum")
            loss = B.scale(loss, float(np.float32(1.0) / np.float32(period * out.nelements))).set_name("loss_mean")
        elif lt == LossType.SUM:
            loss = B.sum(out).set_name("loss_sum")
        elif lt == LossType.CROSS_ENTROPY:
            self.labels = (self.ctx.new_tensor(I32, out.ne[1:], "labels") if self.sparse_labels
                           else self.ctx.new_tensor(out.type, out.ne, "labels")).set_input()
            loss = B.cross_entropy_loss(out, self.labels).set_name("loss_cross_entropy")
            if period > 1:
                loss = B.scale(loss, float(np.float32(1.0) / np.float32(period))).set_name("loss_cross_entropy_scaled")
        else:
            self.labels = self.ctx.new_tensor(out.type, out.ne, "labels").set_input()
            loss = B.sub(out, self.labels).set_name("loss_error")
            loss = B.sqr(loss).set_name("loss_squared_error")
            loss = B.sum(loss).set_name("loss_sum_squared_error")
            loss = B.scale(loss, float(np.float32(1.0) / np.float32(period * out.nelements)))
            loss.set_name("loss_mean_squared_error")
        loss.set_output().set_loss()
        gf.expand(loss)
        self.loss = loss
        if lt == LossType.CROSS_ENTROPY:
            if out.ne[2] != 1 or out.ne[3] != 1:
                raise InvalidArgument(f"OptContext: CROSS_ENTROPY needs 2-dim outputs [nclasses, nbatch], "
                                      f"got ne={list(out.ne)}")
            self.pred = B.argmax(out).set_name("pred").set_output()
            gf.expand(self.pred)
            truth = self.labels if self.sparse_labels else B.argmax(self.labels)
            self.ncorrect = B.count_equal(self.pred, truth).set_name("ncorrect").set_output()
            gf.expand(self.ncorrect)

    def _build(self) -> None:
        bt = self.build_type_alloc
        if bt == BuildType.FORWARD:
            return
        gf = self.gf
        params = [n for n in gf.nodes if n.flags & Flag.PARAM]
        if not params:
            raise InvalidArgument("OptContext: the model has no parameters (set_param) between inputs and outputs; "
                                  "nothing to train")
        # static graphs with an optimizer step every batch need no parameter accumulators
        accumulate = not (bt == BuildType.OPT and self.opt_period == 1)
        accs = {n: self.ctx.new_tensor(F32, n.ne, _acc_name(n)) for n in params} if accumulate else {}
        self.gb_grad = _copy_graph(gf)
        build_backward(self.gb_grad, accs)
        if bt == BuildType.GRAD:
            graph_reset(self.gb_grad)
            return
        gb_opt = _copy_graph(self.gb_grad)
        for node in reversed(gf.nodes):
            grad = gb_opt.grad(node)
            if grad is None or not node.flags & Flag.PARAM:
                continue
            gb_opt.expand(self._opt_step(node, grad))
        self.gb_opt = gb_opt
        graph_reset(gb_opt)

    def _opt_step(self, node: Tensor, grad: Tensor) -> Tensor:
        """The optimizer step of parameter ``node`` with gradient ``grad`` (its AdamW moments
        and the shared step-parameter tensor are created on first use)."""
        if self.opt_step_params is None:
            self.opt_step_params = self.ctx.new_tensor(
                F32, (7 if self.optimizer == OptimizerType.ADAMW else 2,), "opt_step_params").set_input()
        if self.optimizer == OptimizerType.ADAMW:
            m = self.ctx.new_tensor(F32, node.ne, _acc_name(node, "m"))
            v = self.ctx.new_tensor(F32, node.ne, _acc_name(node, "v"))
            self.grad_m[node], self.grad_v[node] = m, v
            return B.opt_step_adamw(node, grad, m, v, self.opt_step_params)
        return B.opt_step_sgd(node, grad, self.opt_step_params)

    # --------------------------------------------------------------- queries
    @property
    def static_graphs(self) -> bool:
        return True

    @property
    def params(self) -> list[Tensor]:
        return [n for n in self.gf.nodes if n.flags & Flag.PARAM]

    def grad_acc(self, node: Tensor) -> Tensor | None:
        """The gradient (accumulator) of ``node`` in the optimizer graph (``ggml_opt_grad_acc``)."""
        g = self.gb_opt or self.gb_grad
        return None if g is None else g.grad_acc(node)

    def grad(self, node: Tensor) -> Tensor | None:
        g = self.gb_opt or self.gb_grad
        return None if g is None else g.grad(node)

    # ------------------------------------------------------------ evaluation
    def reset(self, optimizer: bool = True) -> None:
        """``ggml_opt_reset``: with ``optimizer``, zero AdamW moments and gradient
        accumulators and restart the iteration count at 1; else only the accumulators."""
        if optimizer:
            if self.gb_opt is not None:
                graph_reset(self.gb_opt)
            self.iter = 1
        elif self.gb_grad is not None:
            graph_reset(self.gb_grad)

    def alloc(self, backward: bool) -> None:
        """``ggml_opt_alloc``: choose the graph of the next :meth:`eval` (forward only, or
        gradient accumulation, or gradients plus the optimizer step every opt_period calls)."""
        if self.eval_ready:
            raise InvalidArgument("OptContext.alloc: the previous alloc was not followed by eval")
        if self.build_type == BuildType.OPT and self.opt_period > 1 and self.opt_i == 0 and self.gb_grad is not None:
            graph_reset(self.gb_grad)
        if backward:
            bt = BuildType.OPT if (self.opt_i + 1) % self.opt_period == 0 else BuildType.GRAD
        else:
            bt = BuildType.FORWARD
        graph = {BuildType.FORWARD: self.gf, BuildType.GRAD: self.gb_grad, BuildType.OPT: self.gb_opt}[bt]
        if graph is None:
            raise InvalidArgument(f"OptContext.alloc: a {bt.name} evaluation needs build_type >= {bt.name}, "
                                  f"this context was built with {self.build_type_alloc.name}")
        self.build_type = bt
        self.allocated_graph = graph
        self.eval_ready = True

    def _fill_opt_step_params(self) -> None:
        pars = validate_optimizer_params(self.get_opt_pars(self.get_opt_pars_ud), self.optimizer)
        assert self.opt_step_params is not None
        if self.optimizer == OptimizerType.ADAMW:
            a = pars.adamw
            one, it = np.float32(1.0), np.float32(self.iter)
            with np.errstate(over="ignore", divide="ignore"):
                beta1h = one / (one - np.power(np.float32(a.beta1), it))
                beta2h = one / (one - np.power(np.float32(a.beta2), it))
            self.opt_step_params.set(np.array([a.alpha, a.beta1, a.beta2, a.eps, a.wd, beta1h, beta2h], np.float32))
        else:
            self.opt_step_params.set(np.array([pars.sgd.alpha, pars.sgd.wd], np.float32))

    def eval(self, result: Result | None = None) -> None:
        """``ggml_opt_eval``: run the allocated graph and record the batch in ``result``."""
        if not self.eval_ready:
            raise InvalidArgument("OptContext.eval: call alloc(backward) before every eval")
        if result is not None and not isinstance(result, Result):
            raise InvalidArgument(f"OptContext.eval: result must be a Result or None, got {type(result).__name__}")
        graph = self.allocated_graph
        assert graph is not None
        is_opt = graph is self.gb_opt
        if is_opt:
            self._fill_opt_step_params()  # raises before anything is computed
        planned = self._plans.get(id(graph))
        if planned is None:  # kernels, fallbacks and memory resolved once per graph
            planned = self._plans[id(graph)] = plan(graph, self.backend, keep_grads=self.keep_grads,
                                                    workspace=self.workspace)
        planned.compute()
        self.iter += int(is_opt)
        self.opt_i = (self.opt_i + 1) % self.opt_period
        self.eval_ready = False
        if result is None:
            return
        ncorrect = None
        if self.ncorrect is not None:
            assert self.ncorrect.type == I64
            ncorrect = int(self.ncorrect.numpy().reshape(-1)[0])
        pred = None
        if self.pred is not None:
            assert self.pred.type == I32
            pred = self.pred.numpy()
        result.add_batch(float(self.loss.numpy().reshape(-1)[0]), self.outputs.ne[1], ncorrect=ncorrect, pred=pred,
                         opt_period=self.opt_period, loss_per_datapoint=self.loss_per_datapoint)

    def __repr__(self) -> str:
        return (f"OptContext({self.loss_type.name}, {self.optimizer.name}, opt_period={self.opt_period}, "
                f"iter={self.iter}, backend={self.backend.name!r}, {len(self.params)} params)")


def _acc_name(t: Tensor, kind: str = "grad acc") -> str:
    name = f"{kind} for {t.name}" if t.name else kind
    return name.encode()[:63].decode(errors="ignore")

