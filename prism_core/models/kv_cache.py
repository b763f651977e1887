"""The KV cache: one K and one V tensor per layer, [n_embd_k, n_ctx] and [n_embd_v, n_ctx] in the cache
type (F16 by default, F32 or Q8_0), written with SET_ROWS at the new tokens' positions.

On full-attention layers cell i holds position i. Sliding-window layers (Gemma 3's local layers) keep
only the last ``window + n_batch`` positions (padded to :data:`KV_PAD`) in a ring, cell = position mod
its size, as llama.cpp's iSWA cache does: a batch of at most n_batch tokens never overwrites a position
that one of its own queries still sees, and a 2048-token context costs Gemma 3 270M 22 MiB of F16 cache
instead of 38. Graphs attend over the first ``n_kv`` cells, n_kv padded up to a multiple of
:data:`KV_PAD` so that one planned graph serves many decode steps (llama.cpp pads the same way); the
masks hide cells past the tokens, and on the ring, cells outside each query's window.
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


_VISIBLE, _HIDDEN = np.float16(0.0), np.float16(-np.inf)


def _fill(visible: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.where(visible, _VISIBLE, _HIDDEN)
    if out.shape != visible.shape or out.dtype != np.float16:
        raise InvalidArgument(f"mask output must be float16 {visible.shape}, got {out.dtype} {out.shape}")
    out.fill(_HIDDEN)
    np.copyto(out, _VISIBLE, where=visible)
    return out


def _padded(n: int) -> int:
    return -(-n // KV_PAD) * KV_PAD


class KVCache:
    def __init__(self, ctx: Context, hp: HParams, n_ctx: int, type: GGMLType | str = F16, n_batch: int = 512) -> None:
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
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch <= 0:
            raise InvalidArgument(f"n_batch must be a positive int, got {n_batch!r}")
        self.type, self.n_ctx, self.n_layer, self.n_batch = t, n_ctx, hp.n_layer, n_batch
        self.window = hp.sliding_window
        self.n_ring = min(n_ctx, _padded(self.window + n_batch)) if self.window else n_ctx  # cells of a window layer
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        with ctx.transaction():
            for il in range(hp.n_layer):
                cells = self.n_ring if hp.swa_layers[il] else n_ctx
                self.k.append(ctx.new_tensor(t, (hp.n_embd_k, cells), f"cache_k_l{il}"))
                self.v.append(ctx.new_tensor(t, (hp.n_embd_v, cells), f"cache_v_l{il}"))
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
        return min(self.n_ctx, _padded(need))

    def n_kv_ring(self, n_kv: int) -> int:
        """Cells a sliding-window layer attends over when the full layers attend over ``n_kv``."""
        return min(self.n_ring, n_kv)

    def cells(self, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """The cells the next ``n_tokens`` tokens are written to: on full layers, on window layers."""
        if n_tokens > self.n_batch:  # the ring would overwrite positions this batch's queries still see
            raise BoundExceeded(f"{n_tokens} tokens in one graph; this cache was sized for batches of at most "
                                f"{self.n_batch}")
        pos = self.n_past + np.arange(n_tokens, dtype=np.int64)
        return pos, pos % self.n_ring

    def masks(self, n_tokens: int, n_kv: int, out: np.ndarray | None = None,
              out_swa: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """The causal mask, F16 [n_tokens, n_kv] in NumPy order (query position q sees cell j when j <= q), and
        on a model with a sliding window the ring's, [n_tokens, n_kv_ring(n_kv)]: q sees the position p a
        cell holds (once this batch is written) when p <= q and q - p < window. Written into ``out`` and
        ``out_swa`` (float16 arrays of those shapes, e.g. the graph's mask inputs) when given."""
        q = (self.n_past + np.arange(n_tokens, dtype=np.int32))[:, None]  # int32: no int64 temporaries
        j = np.arange(n_kv, dtype=np.int32)[None, :]
        causal = _fill(j <= q, out)
        if not self.window:
            return causal, None
        last = self.n_past + n_tokens - 1
        c = np.arange(self.n_kv_ring(n_kv), dtype=np.int32)[None, :]
        held = last - (last - c) % self.n_ring  # the newest position with that cell, -ve: none yet
        return causal, _fill((held >= 0) & (held <= q) & (q - held < self.window), out_swa)

    def clear(self) -> None:
        """Forget every token (the cells' contents are masked until overwritten)."""
        self.n_past = 0

    def __repr__(self) -> str:
        ring = f", window layers {self.n_ring} cells" if self.n_ring < self.n_ctx else ""
        return (f"KVCache({self.n_layer} layers, {traits(self.type).name}, {self.n_past}/{self.n_ctx} cells{ring}, "
                f"{self.nbytes / 2**20:.1f} MiB)")
