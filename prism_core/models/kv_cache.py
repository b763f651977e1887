"""The KV cache: one K and one V tensor per layer, [n_embd_k, cells] and [n_embd_v, cells] in the cache
type (F16 by default, F32 or Q8_0), written with SET_ROWS at the cells a batch is placed in.

It holds many sequences at once, as llama.cpp's unified cache does: each cell records the position it
holds and the set of sequences holding it (a bit per sequence, so a prefix copied from one sequence to
another is stored once), and the attention masks are computed from that record: a query of sequence s
at position p sees cell j when j holds s at a position <= p (and on sliding-window layers, p - pos <
window). Full-attention layers have ``n_ctx`` cells. Sliding-window layers (Gemma 3's local layers) have
their own smaller set, ``window * n_seq + n_batch`` cells padded to :data:`KV_PAD` (llama.cpp's iSWA
sizing), and a sequence lets go of a window cell once its next batch's first query no longer sees it
(a cell is free when no holder sees it any more). A batch goes to the lowest free cells; graphs attend
over the first ``n_kv`` cells, n_kv padded up to a multiple of :data:`KV_PAD` so that one planned graph
serves many steps (llama.cpp pads the same way); the masks hide every other cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..context import Context
from ..errors import BoundExceeded, InvalidArgument
from ..tensor import Tensor
from ..types import F16, F32, GGMLType, as_type, row_size, traits
from .hparams import HParams

KV_PAD = 256
CACHE_TYPES = (F16, F32, GGMLType.Q8_0)
MAX_SEQ = 64  # sequences open at once: one bit each in a cell's record (llama.cpp allows 256)

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


class _Cells:
    """One set of cells: the position each holds (-1: free) and the sequences holding it (a bitmask)."""

    def __init__(self, size: int) -> None:
        self.pos = np.full(size, -1, np.int32)
        self.bits = np.zeros(size, np.uint64)

    def copy(self) -> _Cells:
        c = _Cells.__new__(_Cells)
        c.pos, c.bits = self.pos.copy(), self.bits.copy()
        return c

    def of(self, seq: int) -> np.ndarray:
        return (self.bits & np.uint64(1 << seq)) != 0

    def drop(self, seq: int, where: np.ndarray) -> None:
        """Take ``seq`` out of the cells ``where`` says; cells no sequence holds any more become free."""
        self.bits[where] &= ~np.uint64(1 << seq)
        self.pos[self.bits == 0] = -1

    def used_end(self) -> int:
        held = np.flatnonzero(self.bits)
        return int(held[-1]) + 1 if held.size else 0


@dataclass
class Slots:
    """Where one batch goes: each token's sequence and position, its cells on full and on window layers,
    and the cells the graph attends over (n_kv on full layers, n_kv_swa on window layers)."""

    seq: np.ndarray  # int32 [n_tokens]
    pos: np.ndarray  # int32 [n_tokens]
    cells: np.ndarray  # int64 [n_tokens]
    cells_swa: np.ndarray | None
    n_kv: int
    n_kv_swa: int


class KVCache:
    def __init__(self, ctx: Context, hp: HParams, n_ctx: int, type: GGMLType | str = F16, n_batch: int = 512,
                 n_seq: int = 1) -> None:
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
        if isinstance(n_seq, bool) or not isinstance(n_seq, int) or not 0 < n_seq <= MAX_SEQ:
            raise InvalidArgument(f"n_seq must be an int in [1, {MAX_SEQ}], got {n_seq!r}")
        self.type, self.n_ctx, self.n_layer, self.n_batch, self.n_seq = t, n_ctx, hp.n_layer, n_batch, n_seq
        self.window = hp.sliding_window
        # cells of a window layer (llama.cpp's iSWA size): every sequence's window plus one batch
        self.n_ring = min(n_ctx, _padded(self.window * n_seq + n_batch)) if self.window else n_ctx
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        with ctx.transaction():
            for il in range(hp.n_layer):
                cells = self.n_ring if hp.swa_layers[il] else n_ctx
                self.k.append(ctx.new_tensor(t, (hp.n_embd_k, cells), f"cache_k_l{il}"))
                self.v.append(ctx.new_tensor(t, (hp.n_embd_v, cells), f"cache_v_l{il}"))
        self.full = _Cells(n_ctx)
        self.swa = _Cells(self.n_ring) if self.window else None
        self.next_pos: dict[int, int] = {}  # open sequence -> the position its next token takes
        self.labels: dict[int, str] = {}  # open sequence -> how refusals name it

    @property
    def nbytes(self) -> int:
        return sum(row_size(t.type, t.ne[0]) * t.ne[1] for t in self.k + self.v)

    def n_kv_min(self) -> int:
        """Cells the smallest graph attends over."""
        return min(self.n_ctx, KV_PAD)

    # ------------------------------------------------------------ sequences
    def new_seq(self, label: str = "") -> int:
        """Open a sequence (empty); its id."""
        free = [s for s in range(MAX_SEQ) if s not in self.next_pos]
        if not free:
            raise BoundExceeded(f"{MAX_SEQ} sequences are open, the most one cache holds; held: {self.holders_text()}")
        s = free[0]
        self.next_pos[s], self.labels[s] = 0, label or f"sequence {s}"
        return s

    def _open(self, seq: int) -> None:
        if seq not in self.next_pos:
            raise InvalidArgument(f"sequence {seq} is not open in this cache (removed?)")

    def seq_rm(self, seq: int, p0: int = 0) -> None:
        """Forget ``seq``'s positions from ``p0`` on (llama_memory_seq_rm); its next token takes the lowest
        position forgotten."""
        self._open(seq)
        for cells in (self.full, self.swa):
            if cells is not None:
                cells.drop(seq, cells.of(seq) & (cells.pos >= p0))
        self.next_pos[seq] = min(self.next_pos[seq], p0)

    def free_seq(self, seq: int) -> None:
        """Forget ``seq`` and close it: its cells are free unless another sequence shares them."""
        self.seq_rm(seq)
        del self.next_pos[seq], self.labels[seq]

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        """``dst`` becomes the first ``n`` positions of ``src``, sharing its cells (llama_memory_seq_cp);
        refused, with nothing changed, when ``src`` does not hold them all any more."""
        self._open(src)
        self._open(dst)
        if src == dst:
            raise InvalidArgument(f"cannot copy sequence {src} into itself")
        have = self.next_pos[src]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= have:
            raise InvalidArgument(f"copy_prefix: n must be an int in [0, {have}] (the tokens {self.labels[src]} "
                                  f"holds), got {n!r}")
        if self.swa is not None and n:
            # dst's next query (position n) sees positions n - window + 1 .. n - 1 on the window layers
            lo = max(0, n - self.window + 1)
            held = set(self.swa.pos[self.swa.of(src) & (self.swa.pos < n)].tolist())
            if not set(range(lo, n)) <= held:
                raise InvalidArgument(f"copy_prefix: {self.labels[src]} no longer holds positions {lo}..{n - 1} on "
                                      f"the sliding-window layers (its window moved past them); copy a prefix "
                                      f"that ends within its last {self.window} positions")
        self.seq_rm(dst)
        for cells in (self.full, self.swa):
            if cells is not None:
                cells.bits[cells.of(src) & (cells.pos < n)] |= np.uint64(1 << dst)
        self.next_pos[dst] = n

    def holders(self) -> dict[int, tuple[int, int]]:
        """Each open sequence's cells: (on full layers, on window layers)."""
        return {s: (int(self.full.of(s).sum()), int(self.swa.of(s).sum()) if self.swa is not None else 0)
                for s in self.next_pos}

    def holders_text(self) -> str:
        out = []
        for s, (n, n_swa) in self.holders().items():
            out.append(f"{self.labels[s]} {n} cells" + (f" ({n_swa} on window layers)" if self.swa else ""))
        return ", ".join(out) or "nothing"

    # ------------------------------------------------------------ placing batches
    def _room(self, seq: np.ndarray, pos: np.ndarray, full: _Cells, swa: _Cells | None) -> Slots:
        """Place a batch in ``full``/``swa`` (changed in place only when it fits), or raise."""
        n = len(seq)
        if n > self.n_batch:  # the window layers were sized for batches of at most n_batch
            raise BoundExceeded(f"{n} tokens in one graph; this cache was sized for batches of at most "
                                f"{self.n_batch}")
        free = np.flatnonzero(full.bits == 0)
        if len(free) < n:
            raise BoundExceeded(self._full_text(seq, n, len(free), "full-attention layers", self.n_ctx))
        cells_swa = None
        if swa is not None:
            keep_bits = swa.bits.copy()
            for s in np.unique(seq).tolist():  # what the batch's first query of s no longer sees
                gone = ((swa.bits & np.uint64(1 << s)) != 0) & (swa.pos <= int(pos[seq == s].min()) - self.window)
                keep_bits[gone] &= ~np.uint64(1 << s)
            free_swa = np.flatnonzero(keep_bits == 0)
            if len(free_swa) < n:
                raise BoundExceeded(self._full_text(seq, n, len(free_swa), "sliding-window layers", self.n_ring))
            swa.bits = keep_bits
            swa.pos[keep_bits == 0] = -1
            cells_swa = free_swa[:n].astype(np.int64)
            swa.pos[cells_swa] = pos
            swa.bits[cells_swa] = np.left_shift(np.uint64(1), seq.astype(np.uint64))
        cells = free[:n].astype(np.int64)
        full.pos[cells] = pos
        full.bits[cells] = np.left_shift(np.uint64(1), seq.astype(np.uint64))
        end = full.used_end()
        if swa is not None:
            end = max(end, swa.used_end())  # n_kv_swa = min(n_ring, n_kv) then covers every window cell in use
        n_kv = min(self.n_ctx, _padded(end))
        return Slots(seq, pos, cells, cells_swa, n_kv, min(self.n_ring, n_kv))

    def _full_text(self, seq: np.ndarray, n: int, free: int, where: str, size: int) -> str:
        names = ", ".join(self.labels.get(s, f"sequence {s}") for s in np.unique(seq).tolist())
        return (f"the KV cache is full: {n} new tokens of {names} need {n} free cells on its {where}, "
                f"{free} of {size} are free; held: {self.holders_text()}")

    def check_positions(self, seq: int, n_tokens: int) -> int:
        """Refuse ``n_tokens`` more tokens of ``seq`` past the context; its next position."""
        self._open(seq)
        past = self.next_pos[seq]
        if past + n_tokens > self.n_ctx:
            raise BoundExceeded(f"the context holds {self.n_ctx} tokens; {past} are used and {n_tokens} more were "
                                f"asked for ({self.labels[seq]})")
        return past

    def probe(self, seq: int, n_tokens: int) -> None:
        """Refuse, before any work, ``n_tokens`` more tokens of ``seq`` fed in batches of n_batch that would
        not all fit (placed on a copy of the cells' record)."""
        past = self.check_positions(seq, n_tokens)
        full, swa = self.full.copy(), self.swa.copy() if self.swa is not None else None
        for lo in range(0, n_tokens, self.n_batch):
            n = min(self.n_batch, n_tokens - lo)
            self._room(np.full(n, seq, np.int32), np.arange(past + lo, past + lo + n, dtype=np.int32), full, swa)

    def place(self, seq: np.ndarray, pos: np.ndarray) -> Slots:
        """Cells for a batch: token i of sequence ``seq[i]`` at position ``pos[i]``; recorded as held
        (by then each sequence's window cells it no longer sees are let go). Raises BoundExceeded naming
        the sequences holding the cache when they do not fit, with nothing changed."""
        seq, pos = np.asarray(seq, np.int32), np.asarray(pos, np.int32)
        for s in np.unique(seq).tolist():
            self._open(s)
        slots = self._room(seq, pos, self.full, self.swa)
        for s in np.unique(seq).tolist():
            self.next_pos[s] = max(self.next_pos[s], int(pos[seq == s].max()) + 1)
        return slots

    def masks(self, slots: Slots, out: np.ndarray | None = None,
              out_swa: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's masks, F16 in NumPy order: [n_tokens, n_kv] on full layers (token i sees cell j when
        j holds its sequence at a position <= its own) and on a model with a sliding window [n_tokens,
        n_kv_swa] (also: its position minus the cell's < window). Written into ``out`` and ``out_swa``
        (float16 arrays of those shapes, e.g. the graph's mask inputs) when given."""
        s = slots.seq.astype(np.uint64)[:, None]
        q = slots.pos[:, None]

        def visible(cells: _Cells, n_kv: int) -> tuple[np.ndarray, np.ndarray]:
            pos = cells.pos[None, :n_kv]
            return ((cells.bits[None, :n_kv] >> s) & np.uint64(1)).astype(bool) & (pos <= q), pos
        causal = _fill(visible(self.full, slots.n_kv)[0], out)
        if self.swa is None:
            return causal, None
        vis, pos = visible(self.swa, slots.n_kv_swa)
        return causal, _fill(vis & (q - pos < self.window), out_swa)

    def clear(self) -> None:
        """Forget every token of every sequence (llama_memory_clear); the sequences stay open, empty."""
        for cells in (self.full, self.swa):
            if cells is not None:
                cells.pos.fill(-1)
                cells.bits.fill(0)
        self.next_pos = dict.fromkeys(self.next_pos, 0)

    def used(self) -> int:
        return int((self.full.bits != 0).sum())

    def __repr__(self) -> str:
        ring = f", window layers {self.n_ring} cells" if self.n_ring < self.n_ctx else ""
        return (f"KVCache({self.n_layer} layers, {traits(self.type).name}, {self.used()}/{self.n_ctx} cells, "
                f"{len(self.next_pos)} sequences{ring}, {self.nbytes / 2**20:.1f} MiB)")

