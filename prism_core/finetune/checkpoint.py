"""Checkpoints of a fine-tuning run: everything the next epoch depends on, so a resumed run continues bit
for bit as if it had not stopped.

A checkpoint is a GGUF file (``general.type`` = "prism-finetune-checkpoint", which no model loader takes
for a model) holding the trained parameters under their own names, the AdamW moments of each (``m.NAME``,
``v.NAME``), the optimizer context's mt19937 state (``rng.state``: its 624 words and the index) and the
dataset's shard permutation (``data.permutation``), with metadata: the epochs done, the optimizer's
iteration and accumulation counters, the per-epoch statistics so far, and the run's settings and data
identity (a resume with other settings, another text or another model is refused, naming what differs).
It is written atomically (a temporary file renamed over the old one), so an interrupted write, or a
Ctrl-C at any moment, leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..context import Context
from ..errors import InvalidArgument
from ..gguf import load, save
from ..gguf.format import V
from ..tensor import Tensor
from ..train.dataset import Dataset
from ..train.fit import EpochStats
from ..train.optimizer import OptContext
from ..types import F32, I32

KIND = "prism-finetune-checkpoint"
VERSION = 1


class CheckpointMismatch(InvalidArgument):
    """A checkpoint that does not belong to this run (other settings, text or model)."""


@dataclass
class Checkpoint:
    path: str
    epochs_done: int
    iteration: int
    opt_i: int
    settings: dict[str, Any]
    identity: dict[str, Any]
    history: list[EpochStats]
    params: dict[str, np.ndarray]
    moments: dict[str, tuple[np.ndarray, np.ndarray]]
    rng_state: np.ndarray
    permutation: np.ndarray


def _stats(d: Mapping[str, Any]) -> EpochStats:
    return EpochStats(int(d["epoch"]), *(tuple(d[k]) for k in ("train_loss", "train_accuracy", "val_loss",
                                                              "val_accuracy")))


def write(path: str | os.PathLike[str], params: Mapping[str, Tensor], opt_ctx: OptContext, dataset: Dataset,
          history: list[EpochStats], settings: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Write the state after ``len(history)`` epochs (atomically)."""
    scratch = Context(mem_size=1 << 24)
    tensors: dict[str, Tensor] = {}
    for name, p in params.items():
        tensors[name] = p
        m, v = opt_ctx.grad_m.get(p), opt_ctx.grad_v.get(p)
        if m is not None and v is not None:
            tensors["m." + name], tensors["v." + name] = m, v
    words = np.array([*opt_ctx.rng._mt, opt_ctx.rng._i], dtype=np.uint64).astype(np.uint32).view(np.int32)
    tensors["rng.state"] = scratch.from_numpy(words, type=I32, name="rng.state")
    tensors["data.permutation"] = scratch.from_numpy(dataset.permutation.astype(np.int32), type=I32,
                                                     name="data.permutation")
    meta = {"general.type": KIND, "prism.checkpoint.version": VERSION,
            "prism.checkpoint.epochs_done": len(history), "prism.checkpoint.iteration": int(opt_ctx.iter),
            "prism.checkpoint.opt_i": int(opt_ctx.opt_i),
            "prism.checkpoint.settings": json.dumps(dict(settings), sort_keys=True),
            "prism.checkpoint.identity": json.dumps(dict(identity), sort_keys=True),
            "prism.checkpoint.history": json.dumps([asdict(h) for h in history])}
    save(path, tensors, meta)


def read(path: str | os.PathLike[str]) -> Checkpoint:
    """Load a checkpoint into memory (copies: the file may be overwritten by the resumed run)."""
    f = load(path)
    try:
        if f.meta.get("general.type") != KIND or f.meta_types.get("general.type") != V.STRING:
            raise InvalidArgument(f"{f.path}: not a Prism fine-tuning checkpoint (general.type is "
                                  f"{f.meta.get('general.type')!r}, expected {KIND!r})")
        if f.meta.get("prism.checkpoint.version") != VERSION:
            raise InvalidArgument(f"{f.path}: checkpoint version {f.meta.get('prism.checkpoint.version')!r}, this "
                                  f"Prism reads version {VERSION}")
        arrays = {name: t.numpy() for name, t in f.tensors.items()}
        params = {n: a for n, a in arrays.items()
                  if not n.startswith(("m.", "v.")) and n not in ("rng.state", "data.permutation")}
        moments = {n: (arrays["m." + n], arrays["v." + n]) for n in params if "m." + n in arrays}
        m = f.meta
        return Checkpoint(f.path, int(m["prism.checkpoint.epochs_done"]), int(m["prism.checkpoint.iteration"]),
                          int(m["prism.checkpoint.opt_i"]), json.loads(m["prism.checkpoint.settings"]),
                          json.loads(m["prism.checkpoint.identity"]),
                          [_stats(d) for d in json.loads(m["prism.checkpoint.history"])], params, moments,
                          arrays["rng.state"].view(np.uint32), arrays["data.permutation"].astype(np.int64))
    except (KeyError, ValueError, TypeError) as e:
        raise InvalidArgument(f"{f.path}: a damaged fine-tuning checkpoint ({type(e).__name__}: {e})") from None
    finally:
        f.close()


def check(ck: Checkpoint, settings: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another run, naming the first setting or identity that differs."""
    for what, have, want in (("setting", ck.settings, settings), ("data", ck.identity, identity)):
        for key in sorted(set(have) | set(want)):
            if have.get(key) != want.get(key):
                raise CheckpointMismatch(f"{ck.path}: the checkpoint's {what} {key} is {have.get(key)!r}, this run's "
                                         f"is {want.get(key)!r}; resume with the run's own settings, text and model "
                                         "(or start afresh without --resume)")


def restore(ck: Checkpoint, params: Mapping[str, Tensor], opt_ctx: OptContext, dataset: Dataset) -> None:
    """Put the checkpoint's state into a freshly built run (same settings: :func:`check` first)."""
    if set(ck.params) != set(params):
        missing = sorted(set(params) ^ set(ck.params))[0]
        raise CheckpointMismatch(f"{ck.path}: the checkpoint's parameters differ from this run's ({missing!r})")
    for name, p in params.items():
        vals = ck.params[name]
        if vals.shape != p.shape or p.type != F32:
            raise CheckpointMismatch(f"{ck.path}: {name} has shape {vals.shape}, this run's {p.shape}")
        p.set(vals)
        m, v = opt_ctx.grad_m.get(p), opt_ctx.grad_v.get(p)
        if m is not None and v is not None:
            if name not in ck.moments:
                raise CheckpointMismatch(f"{ck.path}: no AdamW moments for {name}")
            m.set(ck.moments[name][0])
            v.set(ck.moments[name][1])
    if len(ck.permutation) != len(dataset.permutation):
        raise CheckpointMismatch(f"{ck.path}: the checkpoint has {len(ck.permutation)} windows, this run "
                                 f"{len(dataset.permutation)}")
    dataset.permutation[:] = ck.permutation
    words = [int(x) for x in ck.rng_state]
    opt_ctx.rng._mt, opt_ctx.rng._i = words[:-1], words[-1]
    opt_ctx.iter, opt_ctx.opt_i = ck.iteration, ck.opt_i
