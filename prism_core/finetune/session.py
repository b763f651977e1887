"""A fine-tuning run: a model, a text, settings -> trained LoRA adapters (or, for an F32/F16 file, the
whole model), with ggml-opt's fit doing the epochs: AdamW (or SGD), gradient accumulation, a validation
split, the loss, perplexity and accuracy of each epoch with their uncertainties, a checkpoint after each
epoch that :func:`finetune` resumes bit for bit, and a stop with a clear message (the last good checkpoint
kept) when the loss stops being finite.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import numpy as np

from ..errors import InvalidArgument, PrismError, TypeMismatch
from ..models.model import Model
from ..tensor import Tensor
from ..train.fit import EpochStats, FitResult, FitSetup, epoch, prepare_fit, run_fit
from ..train.optimizer import AdamWParams, OptContext, OptimizerParams, OptimizerType, SGDParams, _enum
from ..types import F16, F32
from . import checkpoint as ckpt
from .graph import build_forward
from .lora import DEFAULT_TARGETS, TrainableLora, new_lora, parse_targets
from .windows import TokenWindows

DEFAULT_SEED = 5489  # std::mt19937's default seed: ggml-opt's shuffle order when --seed is not given


class TrainingDiverged(PrismError, ArithmeticError):
    """The loss became NaN or infinite (too high a learning rate, usually)."""


@dataclass
class FinetuneConfig:
    """The settings of a run. ``alpha`` None: the rank (scale 1); ``lr`` None: 1e-4 for LoRA, 1e-5 (llama.cpp's
    finetune default) for full fine-tuning; ``stride`` None: n_ctx / 2 (llama.cpp's); ``ubatch`` None:
    ``batch`` (windows per graph; ``batch / ubatch`` physical batches are accumulated per optimizer step)."""

    rank: int = 8
    alpha: float | None = None
    targets: Sequence[str] = DEFAULT_TARGETS
    full: bool = False
    n_ctx: int = 256
    stride: int | None = None
    batch: int = 1
    ubatch: int | None = None
    epochs: int = 2
    lr: float | None = None
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    val_split: float = 0.05
    seed: int = DEFAULT_SEED

    def checked(self) -> FinetuneConfig:
        c = FinetuneConfig(**asdict(self))
        for name in ("rank", "n_ctx", "batch", "epochs"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidArgument(f"finetune: {name} must be a positive int, got {v!r}")
        if not isinstance(c.full, bool):
            raise InvalidArgument(f"finetune: full must be a bool, got {c.full!r}")
        c.ubatch = c.batch if c.ubatch is None else c.ubatch
        if isinstance(c.ubatch, bool) or not isinstance(c.ubatch, (int, np.integer)) or c.ubatch < 1 \
                or c.batch % c.ubatch:
            raise InvalidArgument(f"finetune: ubatch must be a positive divisor of batch={c.batch}, got {c.ubatch!r}")
        c.alpha = float(c.rank) if c.alpha is None else c.alpha
        if isinstance(c.alpha, bool) or not isinstance(c.alpha, (int, float)) or not math.isfinite(c.alpha) \
                or c.alpha <= 0:
            raise InvalidArgument(f"finetune: lora alpha must be a positive finite number, got {c.alpha!r}")
        c.lr = (1e-5 if c.full else 1e-4) if c.lr is None else c.lr
        for name in ("lr", "weight_decay", "val_split"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidArgument(f"finetune: {name} must be a finite number, got {v!r}")
        if c.lr <= 0:
            raise InvalidArgument(f"finetune: the learning rate must be > 0, got {c.lr}")
        if not 0.0 <= c.weight_decay <= 1.0:
            raise InvalidArgument(f"finetune: weight_decay must be in [0, 1], got {c.weight_decay}")
        if not 0.0 <= c.val_split < 1.0:
            raise InvalidArgument(f"finetune: val_split must be in [0, 1), got {c.val_split}")
        if isinstance(c.seed, bool) or not isinstance(c.seed, (int, np.integer)) or c.seed < 0:
            raise InvalidArgument(f"finetune: seed must be an int >= 0, got {c.seed!r}")
        c.optimizer = OptimizerType(_enum(OptimizerType, c.optimizer, "optimizer")).name.lower()
        c.targets = parse_targets(c.targets)
        c.rank, c.n_ctx, c.batch, c.ubatch, c.epochs, c.seed = map(int, (c.rank, c.n_ctx, c.batch, c.ubatch,
                                                                         c.epochs, c.seed))
        c.alpha, c.lr, c.weight_decay, c.val_split = map(float, (c.alpha, c.lr, c.weight_decay, c.val_split))
        return c

    def optimizer_params(self) -> OptimizerParams:
        return OptimizerParams(adamw=AdamWParams(alpha=self.lr, wd=self.weight_decay),
                               sgd=SGDParams(alpha=self.lr, wd=self.weight_decay))

    def settings(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed: everything but the number of epochs and the
        learning rate (a resume with the same ones continues bit for bit)."""
        d = asdict(self)
        d.pop("epochs")
        d.pop("lr")
        d["targets"] = list(self.targets)
        if self.full:
            for k in ("rank", "alpha", "targets"):
                d.pop(k)
        return d


@dataclass
class FinetuneResult:
    """What a run leaves: the trained adapters (``lora``) or parameters (``full``, by the model's tensor
    names), the per-epoch statistics, the dataset's size and the time training took."""

    config: FinetuneConfig
    history: list[EpochStats]
    lora: TrainableLora | None
    full: dict[str, Tensor] = field(default_factory=dict)
    n_windows: int = 0
    n_train_windows: int = 0
    seconds: float = 0.0
    resumed_from: int = 0  # epochs a checkpoint had already done
    dataset: TokenWindows | None = None  # its permutation's tail from n_train_windows on is the validation split

    @property
    def val_perplexity(self) -> float:
        return math.exp(self.history[-1].val_loss[0]) if self.history else math.nan


def trainable_copies(model: Model) -> dict[str, Tensor]:
    """F32 parameters for full fine-tuning: a copy of every tensor llama.cpp's finetune trains (each layer's,
    the output norm and a separate output head; not the token embeddings). A quantized one is refused."""
    ctx, tensors = model.ctx, model.weights.tensors
    names = [n for n in tensors if n.startswith("blk.") or n in ("output_norm.weight", "output.weight")]
    for n in names:
        t = tensors[n]
        if t.traits.is_quantized or t.type not in (F32, F16):
            raise TypeMismatch(f"full fine-tuning needs F32 or F16 weights; {n} is {t.traits.name}: quantized "
                               "weights cannot be trained in place (dequantize the model first, e.g. to F16, or "
                               "train a LoRA adapter, which keeps them quantized)")
    out: dict[str, Tensor] = {}
    with ctx.transaction():
        for n in names:
            src = tensors[n]
            p = ctx.new_tensor(F32, src.ne, n).set_param()
            p.set(src.numpy())
            out[n] = p
    return out


def tokenize(model: Model, text: str | Sequence[int]) -> np.ndarray:
    """The text as llama.cpp's finetune tokenizes it: once, with BOS, special tokens not parsed."""
    if isinstance(text, str):
        if not text:
            raise InvalidArgument("finetune: the training text is empty")
        return np.asarray(model.tokenizer.encode(text, add_special=True, parse_special=False), np.int32)
    return np.asarray(model._check_ids(text), np.int32)


def _identity(model: Model, ids: np.ndarray) -> dict[str, Any]:
    src = getattr(model, "source", None)
    return {"arch": model.hparams.arch, "n_vocab": model.hparams.n_vocab, "n_layer": model.hparams.n_layer,
            "n_embd": model.hparams.n_embd, "model_file": os.path.basename(getattr(src, "path", "")) or None,
            "tokens": int(len(ids)), "tokens_sha256": hashlib.sha256(ids.astype("<i4").tobytes()).hexdigest()}


def finetune(model: Model, text: str | Sequence[int], config: FinetuneConfig | None = None, *,
             checkpoint: str | os.PathLike[str] | None = None, resume: bool = False, progress: bool | None = None,
             stream: IO[str] | None = None, silent: bool = False,
             callback: Callable[..., Any] | None = None) -> FinetuneResult:
    """Fine-tune ``model`` (on its own backend) on ``text`` (a string, or token ids). LoRA adapters on
    ``config.targets`` unless ``config.full``. After every epoch the state goes to ``checkpoint`` (when
    given); ``resume`` continues from that checkpoint (bit for bit: the same settings, text and model are
    required, and ``config.epochs`` counts the epochs already done). The progress bar, when shown, and
    one line per epoch go to ``stream`` (default stderr) unless ``silent``."""
    cfg = (config or FinetuneConfig()).checked()
    if resume and checkpoint is None:
        raise InvalidArgument("finetune: resume needs the checkpoint to resume from")
    ids = tokenize(model, text)
    data = TokenWindows(ids, cfg.n_ctx, model.hparams.n_vocab, cfg.stride, multiple=cfg.batch)
    cfg.stride = data.stride
    settings, identity = cfg.settings(), _identity(model, ids)
    saved = ckpt.read(checkpoint) if resume else None
    if saved is not None:
        ckpt.check(saved, settings, identity)
    out = stream if stream is not None else sys.stderr
    ctx = model.ctx
    mark = ctx.mark()
    try:
        return _run(model, cfg, data, settings, identity, saved, checkpoint, progress, out, silent, callback)
    except BaseException:
        ctx.rollback(mark)  # the adapters, the graph, the optimizer state: nothing of a failed run stays
        raise


def _run(model: Model, cfg: FinetuneConfig, data: TokenWindows, settings: dict, identity: dict,
         saved: ckpt.Checkpoint | None, checkpoint: str | os.PathLike[str] | None, progress: bool | None,
         out: IO[str], silent: bool, callback: Callable[..., Any] | None) -> FinetuneResult:
    if saved is not None and saved.epochs_done >= cfg.epochs:
        raise InvalidArgument(f"{saved.path}: the checkpoint has done {saved.epochs_done} epochs already; ask for "
                              f"more than {saved.epochs_done} epochs to go on training")
    lora = None if cfg.full else new_lora(model, cfg.targets, cfg.rank, cfg.alpha, cfg.seed)
    full = trainable_copies(model) if cfg.full else {}
    params = dict(full) if lora is None else {t.name: t for t in lora.params}
    fw = build_forward(model, cfg.n_ctx, cfg.ubatch, None if lora is None else lora.products(), full)
    setup = prepare_fit(model.ctx, fw.tokens, fw.logits, data, "cross_entropy", cfg.optimizer_params(), cfg.epochs,
                        cfg.batch, cfg.val_split, silent, None, progress, out, False)
    checkpointed = [saved.epochs_done if saved is not None else 0]  # epochs the checkpoint on disk holds

    def make_opt_ctx(s: FitSetup) -> OptContext:
        oc = OptContext(model.ctx, fw.tokens, fw.logits, s.loss_type, cfg.optimizer, s.opt_period,
                        get_opt_pars=s.pars_cb, get_opt_pars_ud=s.epoch_box, backend=model.backend,
                        keep_grads=False, sparse_labels=True)  # activations' gradients share memory once read
        if cfg.seed != DEFAULT_SEED:
            oc.rng.seed(cfg.seed)
        return oc

    def restore(oc: OptContext, fr: FitResult) -> int:
        if saved is None:
            return 0
        ckpt.restore(saved, params, oc, data)
        fr.history[:] = saved.history
        return saved.epochs_done

    def on_epoch(oc: OptContext, fr: FitResult) -> None:
        if checkpoint is not None:
            ckpt.write(checkpoint, params, oc, data, fr.history, settings, identity)
            checkpointed[0] = len(fr.history)
        if not silent:
            out.write(epoch_line(fr.history[-1], cfg.epochs) + "\n")
            out.flush()

    def watch(train: bool, oc: OptContext, dataset: Any, result: Any, ibatch: int, ibatch_max: int,
              t_start: int) -> None:
        loss = float(result.losses[-1])
        if not math.isfinite(loss):
            kept = (f"the last good checkpoint, {os.fspath(checkpoint)} (after epoch {checkpointed[0]}), is kept"
                    if checkpoint is not None and checkpointed[0] else "no checkpoint had been written yet")
            raise TrainingDiverged(f"the {'training' if train else 'validation'} loss became {loss} at batch "
                                   f"{ibatch} of epoch {setup.epoch_box['epoch']} (learning rate {cfg.lr:g}): "
                                   f"lower the learning rate; {kept}")
        if callback is not None:
            callback(train, oc, dataset, result, ibatch, ibatch_max, t_start)

    setup.callback = watch
    fr = run_fit(model.ctx, fw.tokens, fw.logits, data, setup, make_opt_ctx, epoch, restore=restore,
                 on_epoch=on_epoch)
    return FinetuneResult(cfg, fr.history, lora, full, data.ndata, setup.idata_split, fr.seconds,
                          saved.epochs_done if saved is not None else 0, data)


def epoch_line(s: EpochStats, n_epochs: int) -> str:
    """One epoch's summary: the training and validation loss, perplexity and accuracy, with uncertainties."""
    def part(name: str, loss: tuple[float, float], acc: tuple[float, float]) -> str:
        if not loss[0] and math.isnan(loss[1]):
            return f"{name}: no data"
        return (f"{name} loss {loss[0]:.5f}±{loss[1]:.5f}, perplexity {math.exp(loss[0]):.4g}, "
                f"accuracy {100 * acc[0]:.2f}±{100 * acc[1]:.2f}%")
    return (f"epoch {s.epoch}/{n_epochs}: {part('train', s.train_loss, s.train_accuracy)}; "
            f"{part('validation', s.val_loss, s.val_accuracy)}")
