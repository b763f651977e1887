"""The importance matrix of a model on a text, as llama.cpp's llama-imatrix computes it (``prism imatrix``).

For every weight matrix of the blocks (``blk.*``; ``output.weight`` too with ``process_output``), the sum over
the text's tokens of each input column's squared activation, and the number of tokens: what llama-imatrix's
eval callback accumulates from the second operand of each MUL_MAT (per (i2, i3) matrix of a batched weight)
and MUL_MAT_ID (per expert, by the routing ids) whose batch has at least 16 tokens. The activations are read
from the model's own graph on whatever backend runs it: a tap (:meth:`Model.tap`) flags those operands as
outputs before each graph is planned and reads them after each compute.

The text is tokenized with the model's vocabulary (its BOS prepended when the vocabulary asks for one), cut
into chunks of ``n_ctx`` tokens (the first token of each replaced by BOS), each evaluated from an empty cache
with every position's logits, as llama-imatrix does. Sums are accumulated in float64 (llama.cpp: float32).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from ..gguf.imatrix import Entry, Imatrix
from ..graph import Graph
from ..ops.codes import Op
from ..tensor import Tensor
from ..types import F32

MIN_TOKENS = 16  # llama-imatrix skips products of fewer rows ("why are small batches ignored?", it asks)


@dataclass
class _Pick:
    weight: str
    w: Tensor
    x: Tensor
    ids: Tensor | None = None  # MUL_MAT_ID's routing


@dataclass
class ActivationTap:
    """Collects, per weight name, float64 sums of squared input activations [n_mat, n_cols] and token counts
    [n_mat] from the graphs it is tapped into (see the module doc)."""

    process_output: bool = False
    min_tokens: int = MIN_TOKENS
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)

    def _wanted(self, name: str) -> bool:
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def select(self, graph: Graph) -> list[_Pick]:
        picks = []
        for node in graph.nodes:
            if node.op not in (Op.MUL_MAT, Op.MUL_MAT_ID):
                continue
            w, x = node.src[0], node.src[1]
            if not self._wanted(w.name) or x.type != F32:
                continue
            ids = node.src[2] if node.op == Op.MUL_MAT_ID else None
            x.set_output()
            if ids is not None:
                ids.set_output()
            picks.append(_Pick(w.name, w, x, ids))
        return picks

    def _entry(self, name: str, n_mat: int, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.sums:
            self.sums[name] = np.zeros((n_mat, n_cols), np.float64)
            self.counts[name] = np.zeros(n_mat, np.int64)
        s = self.sums[name]
        if s.shape != (n_mat, n_cols):
            raise InvalidArgument(f"imatrix: {name} is used with {n_mat}x{n_cols} activations here and "
                                  f"{s.shape[0]}x{s.shape[1]} before")
        return s, self.counts[name]

    def collect(self, picks: list[_Pick] | None) -> None:
        for p in picks or ():
            x = np.asarray(p.x.numpy(), np.float64)  # NumPy order: [ne3, ne2, ne1, ne0]
            x = x.reshape((1,) * (4 - x.ndim) + x.shape)
            if p.ids is None:
                if p.x.ne[1] < self.min_tokens:
                    continue
                ne2, ne3 = p.w.ne[2], p.w.ne[3]
                sums, counts = self._entry(p.weight, ne2 * ne3, p.x.ne[0])
                sq = (x * x).sum(axis=2)  # [ne3, ne2, ne0]: each (i2, i3) matrix's rows
                for i3 in range(sq.shape[0]):
                    for i2 in range(sq.shape[1]):
                        sums[(i3 % ne3) * ne2 + (i2 % ne2)] += sq[i3, i2]
                counts += int(np.prod(p.x.ne[1:])) // (ne2 * ne3)
            else:
                n_as = p.w.ne[2]
                sums, counts = self._entry(p.weight, n_as, p.x.ne[0])
                ids = np.asarray(p.ids.numpy(), np.int64).reshape(p.ids.ne[1], p.ids.ne[0])  # [n_tokens, n_used]
                xs = x[0]  # [n_tokens, b.ne1, ne0]
                for tok in range(ids.shape[0]):
                    for k in range(ids.shape[1]):
                        ex = int(ids[tok, k])
                        if not 0 <= ex < n_as:
                            raise InvalidArgument(f"imatrix: {p.weight}: expert id {ex} outside [0, {n_as})")
                        row = xs[tok, k % xs.shape[1]]
                        sums[ex] += row * row
                        counts[ex] += 1
            if not np.isfinite(sums).all():
                raise InvalidArgument(f"imatrix: non-finite activations reached {p.weight} (llama-imatrix stops too)")

    def imatrix(self, datasets: Sequence[str], chunk_count: int, chunk_size: int) -> Imatrix:
        entries = {n: Entry(self.sums[n].astype(np.float32), self.counts[n].copy()) for n in sorted(self.sums)}
        return Imatrix(entries, list(datasets), chunk_count, chunk_size)


def chunks_of(ids: Sequence[int], n_ctx: int, n_chunks: int | None, bos: int | None) -> list[list[int]]:
    """llama-imatrix's (and llama-perplexity's) chunks: ``n_ctx`` tokens each, as many as the text holds (or
    ``n_chunks``), each one's first token replaced by BOS when the vocabulary adds one."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 2:
        raise InvalidArgument(f"the context of a chunk must be an int >= 2, got {n_ctx!r}")
    if n_chunks is not None and (isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 1):
        raise InvalidArgument(f"chunks must be None or an int >= 1, got {n_chunks!r}")
    n = len(ids) // n_ctx if n_chunks is None else min(n_chunks, len(ids) // n_ctx)
    out = []
    for i in range(n):
        c = [int(t) for t in ids[i * n_ctx:(i + 1) * n_ctx]]
        if bos is not None:
            c[0] = bos
        out.append(c)
    return out


def text_tokens(model, text: str | Sequence[int]) -> tuple[list[int], int | None]:
    """The text's ids as llama.cpp's tools tokenize a file (special tokens as text, BOS when the vocabulary
    adds it), and the BOS id each chunk starts with (None when the vocabulary adds none)."""
    tok = model.tokenizer
    vocab = getattr(tok, "vocab", None)
    add_bos = bool(getattr(vocab, "add_bos", False))
    bos = getattr(vocab, "bos", None) if add_bos else None
    if isinstance(text, str):
        ids = tok.encode(text, add_special=True, parse_special=False)
    else:
        ids = [int(i) for i in text]
    return ids, bos


def compute_imatrix(model, text: str | Sequence[int], *, n_ctx: int = 512, n_chunks: int | None = None,
                    dataset: str = "", process_output: bool = False,
                    on_chunk: Callable[[int, int], None] | None = None) -> Imatrix:
    """The importance matrix of ``model`` (a :class:`~prism_core.models.Model` whose context holds ``n_ctx``
    tokens) over ``text`` (a string, or token ids as the tokenizer would give them), in chunks of ``n_ctx``
    tokens; ``dataset`` is recorded as the text's name. ``on_chunk(i, n)`` is called after each chunk."""
    ids, bos = text_tokens(model, text)
    if len(ids) < 2 * n_ctx:
        raise InvalidArgument(f"imatrix: the text has {len(ids)} tokens; llama-imatrix needs at least 2 * ctx-size "
                              f"= {2 * n_ctx}")
    if n_ctx > model.cache.n_ctx:
        raise InvalidArgument(f"imatrix: ctx-size {n_ctx} exceeds the model's context of {model.cache.n_ctx}")
    chunks = chunks_of(ids, n_ctx, n_chunks, bos)
    tap = ActivationTap(process_output=process_output)
    model.tap(tap)
    try:
        for i, c in enumerate(chunks):
            model.logits(c)
            if on_chunk is not None:
                on_chunk(i + 1, len(chunks))
    finally:
        model.tap(None)
    if not tap.sums:
        raise InvalidArgument(f"imatrix: no weight matrix saw {MIN_TOKENS} or more tokens at once (ctx-size "
                              f"{n_ctx}, batch {model.n_batch})")
    return tap.imatrix([dataset] if dataset else [], len(chunks), n_ctx)


def dataset_name(path: str | os.PathLike[str]) -> str:
    """The text's name as llama-imatrix records it: the path as given."""
    return os.fspath(path)
