"""The KV cache: one K and one V tensor per layer, [n_embd_k, n_ctx] and [n_embd_v, n_ctx] in the cache
type (F16 by default, F32 or Q8_0), written with SET_ROWS at the new tokens' positions.

Cell i holds position i (no ring buffer: a context of n_ctx tokens needs n_ctx cells). Graphs attend
over the first ``n_kv`` cells, n_kv padded up to a multiple of :data:`KV_PAD` so that one planned
graph serves many decode steps (llama.cpp pads the same way); the mask hides cells past the tokens.
"""

from __future__ import annotations

import numpy as np

from ..context import Context
from ..errors import BoundExceeded, InvalidArgument
from ..tensor import Tensor
from ..types import F16, F32, GGMLType, as_type, row_size, traits
from .hparams import HParams

KV_PAD = 256
CACHE_TYPES = (F16, F32, GGMLType.Q8_0)


class KVCache:
    def __init__(self, ctx: Context, hp: HParams, n_ctx: int, type: GGMLType | str = F16) -> None:
        t = as_type(type)
        if t not in CACHE_TYPES:
            raise InvalidArgument(f"KV cache type must be one of {', '.join(traits(x).name for x in CACHE_TYPES)}, "
                                  f"got {traits(t).name}")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
            raise InvalidArgument(f"n_ctx must be a positive int, got {n_ctx!r}")
        for width in (hp.n_embd_k, hp.head_dim, hp.n_embd_v, hp.head_dim_v):
            if width % traits(t).blck_size:
                raise InvalidArgument(f"KV cache type {traits(t).name} needs head sizes that are multiples of "
                                      f"{traits(t).blck_size}; this model's are {hp.head_dim}/{hp.head_dim_v}")
        self.type, self.n_ctx, self.n_layer = t, n_ctx, hp.n_layer
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        with ctx.transaction():
            for il in range(hp.n_layer):
                self.k.append(ctx.new_tensor(t, (hp.n_embd_k, n_ctx), f"cache_k_l{il}"))
                self.v.append(ctx.new_tensor(t, (hp.n_embd_v, n_ctx), f"cache_v_l{il}"))
        self.n_past = 0  # cells 0 .. n_past - 1 hold the tokens seen so far

    @property
    def nbytes(self) -> int:
        return sum(row_size(t.type, t.ne[0]) * t.ne[1] for t in self.k + self.v)

    def n_kv(self, n_tokens: int) -> int:
        """Cells a graph for ``n_tokens`` new tokens after ``n_past`` attends over."""
        need = self.n_past + n_tokens
        if need > self.n_ctx:
            raise BoundExceeded(f"the context holds {self.n_ctx} tokens; {self.n_past} are used and "
                                f"{n_tokens} more were asked for")
        return min(self.n_ctx, -(-need // KV_PAD) * KV_PAD)

    def masks(self, n_tokens: int, n_kv: int, window: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The causal mask (and the sliding-window one when ``window`` > 0), F16 [n_tokens, n_kv] in NumPy order:
        query position p sees cell j when j <= p (and p - j < window)."""
        q = self.n_past + np.arange(n_tokens)[:, None]
        j = np.arange(n_kv)[None, :]
        visible = j <= q
        causal = np.where(visible, 0.0, -np.inf).astype(np.float16)
        if not window:
            return causal, None
        return causal, np.where(visible & (q - j < window), 0.0, -np.inf).astype(np.float16)

    def clear(self) -> None:
        """Forget every token (the cells' contents are masked until overwritten)."""
        self.n_past = 0

    def __repr__(self) -> str:
        return (f"KVCache({self.n_layer} layers, {traits(self.type).name}, {self.n_past}/{self.n_ctx} cells, "
                f"{self.nbytes / 2**20:.1f} MiB)")
