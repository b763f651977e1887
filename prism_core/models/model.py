"""A language model: token ids in, logits out, over a KV cache, on any backend.

One graph is built and planned per (new tokens, attended cells, logits rows) shape and reused:
decode steps share a graph until the cache crosses a multiple of ``KV_PAD`` cells. Prompts are
processed in batches of ``n_batch`` tokens. Weights stay as loaded (quantized, memory-mapped).
"""

from __future__ import annotations

import codecs
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import BoundExceeded, InvalidArgument, PrismWarning
from ..graph import Graph
from ..ops import build as B
from ..plan import Plan, Workspace, plan
from ..plugin.base import Backend
from ..plugin.registry import backend as select_backend
from ..tensor import Tensor
from ..types import F16, I32, I64, GGMLType
from .arch import arch_for
from .blocks import Step, Weights, rms_norm
from .kv_cache import KVCache
from .lora import products as lora_products
from .sampling import Sampler, checked_sampler

DEFAULT_N_CTX = 2048
MAX_PLANS = 4  # planned graphs kept (about 1 MB of Python objects each); the least recently used one is discarded
# (Model.max_plans: the batching engine keeps one per batch shape it meets, see engine.py)
# of one batch size, the planned graphs kept: a generation crosses a KV_PAD boundary every 256 tokens and
# never goes back, so older graphs of its shape are only Python objects (about 1 MB each for Gemma)
MAX_PLANS_PER_BATCH = 2
SLOW_REFERENCE_BYTES = 16 << 20  # weights beyond this on the reference backend get a warning: it is slow
DEFAULT_PARALLEL = 16  # generate_many's prompts computed at once by default
PERPLEXITY_ROWS = 32  # logits rows perplexity takes to float64 at once


@dataclass(frozen=True)
class Token:
    """One generated token: its id, the text it completes (possibly "" until a UTF-8 character split
    over several tokens is whole) and its piece's raw bytes (what llama.cpp's command line writes:
    joined, the tokens' bytes are the output exactly, a character cut at the end included)."""

    id: int
    text: str
    bytes: bytes = b""


class TokenText:
    """The :class:`Token` of each generated id of one generation, in order: its piece, its UTF-8 text
    completed across tokens (see :meth:`Model.generate`); ``last``: no token follows, so bytes no token
    completed become U+FFFD."""

    def __init__(self, tokenizer: Any, special: bool) -> None:
        self.tokenizer, self.special = tokenizer, special
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, tok: int, *, last: bool) -> Token:
        piece = self.tokenizer.piece_bytes(tok, self.special)
        return Token(tok, self.utf8.decode(piece, final=last), piece)


@dataclass
class Timings:
    """Of the last :meth:`Model.generate`: prompt tokens and seconds, decoded tokens and seconds, and the
    seconds the backend spent compiling kernels meanwhile (a JIT backend's first graphs; not counted in
    the prompt or decode seconds, so the speeds are the kernels')."""

    n_prompt: int = 0
    prompt_s: float = 0.0
    n_decode: int = 0
    decode_s: float = 0.0
    compile_s: float = 0.0

    def timed(self, step, backend: Backend) -> tuple[Any, float]:
        """``step()``'s result and its seconds less the backend's compiling meanwhile (added to compile_s)."""
        compiled = backend.compile_seconds()
        start = time.perf_counter()
        out = step()
        seconds = time.perf_counter() - start
        compiling = backend.compile_seconds() - compiled
        self.compile_s += compiling
        return out, max(0.0, seconds - compiling)

    @property
    def prompt_tok_s(self) -> float:
        return self.n_prompt / self.prompt_s if self.prompt_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s else 0.0


@dataclass
class _Graph:
    plan: Plan
    step: Step
    logits: Tensor
    tensors: list[Tensor]  # every tensor the graph added to the model's context, discarded with it
    tapped: Any = None  # what the model's tap selected in this graph (see Model.tap)


class Model:
    """A GGUF language model. Build it with :func:`prism_core.models.load`."""

    def __init__(self, tensors: Mapping[str, Tensor], meta: Mapping[str, Any], *, backend: Backend | str | None = None,
                 n_ctx: int | None = None, cache_type: GGMLType | str = F16, n_batch: int = 512, tokenizer: Any = None,
                 source: Any = None, flash_attn: bool = True, lora: Seq[tuple[Any, float]] = (),
                 n_seq: int = 1) -> None:
        self.arch = arch_for(meta)
        self.meta = meta
        embd = tensors.get("token_embd.weight")
        if embd is None:
            raise InvalidArgument(f"{self.arch.name} model: tensor 'token_embd.weight' is missing from the file")
        self.hparams = hp = self.arch.hparams(meta, embd.ne[1])
        self.lora = list(lora)  # (LoraFile, scale): applied unmerged, see set_lora
        self.weights = w = Weights(tensors, self.arch.name, lora_products(self.lora, tensors, self.arch.name))
        w.get("token_embd.weight", (hp.n_embd, hp.n_vocab))
        self.output_norm = w.get("output_norm.weight", (hp.n_embd,))
        self.head = w.get("output.weight", (hp.n_embd, hp.n_vocab), required=False) or embd  # tied when absent
        if isinstance(n_batch, bool) or not isinstance(n_batch, int) or n_batch <= 0:
            raise InvalidArgument(f"n_batch must be a positive int, got {n_batch!r}")
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, hp.n_ctx_train)
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > hp.n_ctx_train:
            raise InvalidArgument(f"n_ctx={n_ctx} exceeds the model's training context {hp.n_ctx_train}")
        self.ctx = embd.ctx
        self.cache = KVCache(self.ctx, hp, n_ctx, cache_type, n_batch, n_seq)
        self.n_batch = n_batch
        if not isinstance(flash_attn, bool):
            raise InvalidArgument(f"flash_attn must be a bool, got {flash_attn!r}")
        self.flash_attn = flash_attn  # FLASH_ATTN_EXT; off: llama.cpp's default unfused attention (its rounding)
        self.workspace = Workspace()  # one compute graph runs at a time: every plan's scratch in one buffer
        self.backend = select_backend(backend) if not isinstance(backend, Backend) else backend
        weight_bytes = sum(t.nbytes for t in tensors.values())
        if self.backend.is_reference and weight_bytes > SLOW_REFERENCE_BYTES:
            warnings.warn(f"the {self.backend.name} reference backend computes a model exactly, in float64: about "
                          "0.2-0.7 tokens/s for Gemma 3 270M; it is the ground truth the other backends are checked "
                          "against, not a runner (use csimd or numba for speed)", PrismWarning, stacklevel=3)
        self._tokenizer = tokenizer
        self.source = source  # the loaded file, kept open while the model lives
        self._graphs: OrderedDict[tuple[int, int, int], _Graph] = OrderedDict()
        self.max_plans = MAX_PLANS
        self._tap: Any = None
        self.timings = Timings()
        self._lock = threading.Lock()  # see _exclusive
        self._owner: int | None = None  # the thread holding it
        self._deferred: list[int] = []  # sequences to close at the lock's next taking
        self._local = threading.local()  # each thread's default sequence
        self._graph(1, self.cache.n_kv_min(), 1)  # the decode graph; building it checks every layer's tensors

    def set_lora(self, lora: Seq[tuple[Any, float]]) -> None:
        """Apply these (LoraFile, scale) adapters instead of the current ones (an empty list: none); the
        weights are untouched, the graphs are built again on their next use."""
        adapters = lora_products(list(lora), self.weights.tensors, self.arch.name)  # refuses before any change
        for g in self._graphs.values():
            g.plan.release()
            self.ctx.discard(g.tensors)
        self._graphs.clear()
        self.lora, self.weights.adapters = list(lora), {k: tuple(v) for k, v in adapters.items()}

    # ------------------------------------------------------------ graphs
    def _build(self, n_tok: int, n_kv: int, n_out: int) -> _Graph:
        hp, ctx = self.hparams, self.ctx
        swa, n_kv_swa = bool(hp.sliding_window), min(self.cache.n_ring, n_kv)
        first = ctx.mark()[0]
        with ctx.transaction():
            step = Step(tokens=ctx.new_tensor(I32, (n_tok,)).set_input(), pos=ctx.new_tensor(I32, (n_tok,)).set_input(),
                        cells=ctx.new_tensor(I64, (n_tok,)).set_input(),
                        mask=ctx.new_tensor(F16, (n_kv, n_tok)).set_input(),
                        cells_swa=ctx.new_tensor(I64, (n_tok,)).set_input() if swa else None,
                        mask_swa=ctx.new_tensor(F16, (n_kv_swa, n_tok)).set_input() if swa else None,
                        out_rows=ctx.new_tensor(I32, (n_out,)).set_input(), n_kv=n_kv, n_kv_swa=n_kv_swa,
                        flash_attn=self.flash_attn)
            x = B.get_rows(self.weights.get("token_embd.weight"), step.tokens)
            if hp.embed_scale != 1.0:
                x = B.scale(x, hp.embed_scale)
            for il in range(hp.n_layer):
                x = self.arch.layer(hp, self.weights, il, x, step, self.cache)
            x = rms_norm(B.get_rows(x, step.out_rows), self.output_norm, hp.eps)
            logits = B.mul_mat(self.head, x)
            if hp.final_softcap:
                logits = B.scale(B.tanh(B.scale(logits, 1.0 / hp.final_softcap)), hp.final_softcap)
            logits.set_output()
            graph = Graph(capacity=64 * hp.n_layer + 64).expand(logits)
            tapped = self._tap.select(graph) if self._tap is not None else None  # it flags them as outputs
            # inputs and logits in the shared workspace too: eval sets the one and copies the other out
            # around each compute, so no graph holds memory of its own (as llama.cpp's compute buffer)
            p = plan(graph, self.backend, workspace=self.workspace, io_in_arena=True)
            return _Graph(p, step, logits, ctx.tensors[first:], tapped)

    def _graph(self, n_tok: int, n_kv: int, n_out: int) -> _Graph:
        key = (n_tok, n_kv, n_out)
        g = self._graphs.get(key)
        if g is None:
            same = [k for k in self._graphs if k[::2] == key[::2]]  # this batch shape's, least recently used first
            victims = same[:max(0, len(same) - MAX_PLANS_PER_BATCH + 1)]
            others = [k for k in self._graphs if k not in victims]
            victims += others[:max(0, len(others) - self.max_plans + 1)]
            for old in victims:
                gone = self._graphs.pop(old)
                gone.plan.release()
                self.ctx.discard(gone.tensors)
            g = self._graphs[key] = self._build(n_tok, n_kv, n_out)
        self._graphs.move_to_end(key)
        return g

    def plans(self) -> list[Plan]:
        """The planned graphs the model keeps now (at least the decode graph), least recently used first:
        which backend computes each node and what fell back to the reference (``Plan.fallbacks``)."""
        return [g.plan for g in self._graphs.values()]

    def tap(self, tap: Any) -> None:
        """Read intermediate tensors of the model's own graphs: ``tap.select(graph)`` is called on every graph
        built from now on (before it is planned; it flags what it wants as outputs and returns them), and
        ``tap.collect(selected)`` after each compute of that graph. None removes the tap. The graphs built
        so far are dropped (they were planned without it). prism_core.models.imatrix uses this."""
        for g in self._graphs.values():
            g.plan.release()
            self.ctx.discard(g.tensors)
        self._graphs.clear()
        self._tap = tap

    # ------------------------------------------------------------ sequences and evaluation
    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The model's lock: one caller at a time places tokens in the cache and computes a graph (every
        graph's inputs and scratch live in the one workspace). Removals deferred meanwhile happen first."""
        with self._lock:
            self._owner = threading.get_ident()
            try:
                while self._deferred:
                    seq = self._deferred.pop()
                    if seq in self.cache.next_pos:
                        self.cache.free_seq(seq)
                yield
            finally:
                self._owner = None

    def _release(self, seq: int) -> None:
        """Close sequence ``seq``; from inside the lock's holder (a handle collected mid-call), at its next use."""
        if self._owner == threading.get_ident():
            self._deferred.append(seq)
            return
        with self._exclusive():
            if seq in self.cache.next_pos:
                self.cache.free_seq(seq)

    def new_sequence(self, label: str | None = None) -> Sequence:
        """A new, empty sequence of this model's cache: its own tokens, eval/logits/generate/perplexity, its
        cells freed by :meth:`Sequence.remove` (or leaving a ``with`` block, or when it is collected).
        ``label`` names it in refusals (default "sequence N")."""
        with self._exclusive():
            seq = self.cache.new_seq(label or "")
        return Sequence(self, seq)

    def default_sequence(self) -> Sequence:
        """The calling thread's own sequence, which :meth:`eval` continues and :meth:`logits` restarts (a
        thread's calls never see another's tokens); created on first use, freed when the thread ends."""
        seq = getattr(self._local, "seq", None)
        if seq is None or not seq.open:
            seq = self._local.seq = self.new_sequence(f"thread {threading.current_thread().name!r}'s sequence")
        return seq

    def _check_ids(self, ids: Seq[int]) -> np.ndarray:
        try:
            arr = np.asarray(ids)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"token ids must be a sequence of ints ({e})") from None
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise InvalidArgument(f"token ids must be a non-empty 1-d sequence of ints, got {ids!r:.80}")
        bad = (arr < 0) | (arr >= self.hparams.n_vocab)
        if bad.any():
            raise InvalidArgument(f"token id {int(arr[bad][0])} is outside the vocabulary [0, {self.hparams.n_vocab})")
        return arr.astype(np.int32)

    def _compute(self, tokens: np.ndarray, seq: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """One batch (under the lock): token i of sequence seq[i] at position pos[i]; the float32 logits of
        the batch rows ``rows``. Nothing stays placed in the cache when the compute fails."""
        slots = self.cache.place(seq, pos)
        try:
            n = len(tokens)
            g = self._graph(n, slots.n_kv, len(rows))
            step = g.step  # the inputs are written through their host views: their types and sizes are ours
            step.tokens.host().reshape(-1)[:] = tokens
            step.pos.host().reshape(-1)[:] = pos
            step.cells.host().reshape(-1)[:] = slots.cells
            swa = step.mask_swa is not None
            self.cache.masks(slots, step.mask.host().reshape(n, -1),
                             step.mask_swa.host().reshape(n, -1) if swa else None)
            if swa:
                step.cells_swa.host().reshape(-1)[:] = slots.cells_swa
            step.out_rows.host().reshape(-1)[:] = rows
            g.plan.compute()
            if self._tap is not None:
                self._tap.collect(g.tapped)
            return g.logits.host().reshape(len(rows), -1).copy()  # out of the workspace, which the next reuses
        except BaseException:
            for s in np.unique(seq).tolist():
                self.cache.seq_rm(s, int(pos[seq == s].min()))
            raise

    def eval(self, ids: Seq[int], *, all_logits: bool = False) -> np.ndarray:
        """Feed ``ids`` after the tokens already in the calling thread's sequence (:meth:`default_sequence`);
        returns the float32 logits of every new position (``all_logits``) or of the last one, shape
        (rows, n_vocab)."""
        return self.default_sequence().eval(ids, all_logits=all_logits)

    def logits(self, ids: Seq[int]) -> np.ndarray:
        """Float32 logits of every position of ``ids`` from an empty sequence (the calling thread's, which
        holds them afterwards): shape (len(ids), n_vocab)."""
        return self.default_sequence().logits(ids)

    # ------------------------------------------------------------ text
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from ..tokenizer import from_metadata
            self._tokenizer = from_metadata(self.meta)
        return self._tokenizer

    @cached_property
    def eog_ids(self) -> frozenset[int]:
        """The ids that end generation: the vocabulary's (llama.cpp's end-of-generation set: eos, eot, eom
        and the tokens it knows by name); without a vocabulary, the eos/eot/eom ids the metadata names."""
        vocab = getattr(self.tokenizer, "vocab", None) if "tokenizer.ggml.tokens" in self.meta else None
        if vocab is not None:
            return vocab.eog
        return frozenset(int(self.meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                                     "tokenizer.ggml.eom_token_id") if k in self.meta)

    def encode(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidArgument("the prompt is empty")
            return self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        return [int(i) for i in self._check_ids(prompt)]

    def _checked_generation(self, prompt: str | Seq[int], max_tokens: int, sampler: Any,
                            n_past: int = 0) -> tuple[list[int], Any]:
        """A generation's prompt ids and sampler, refused before any work when they are bad or the prompt and
        ``max_tokens`` after ``n_past`` tokens exceed the context."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise InvalidArgument(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        sampler = checked_sampler(sampler)
        ids = self.encode(prompt)
        if n_past + len(ids) + max_tokens > self.cache.n_ctx:
            after = f" after the sequence's {n_past}" if n_past else ""
            raise BoundExceeded(f"the prompt ({len(ids)} tokens) and max_tokens={max_tokens}{after} exceed the "
                                f"context of {self.cache.n_ctx} tokens")
        return ids, sampler

    def generate(self, prompt: str | Seq[int], max_tokens: int = 64, sampler: Sampler | None = None, *,
                 special: bool = False) -> Iterator[Token]:
        """Yield tokens as they are produced, on a sequence of its own (so generators and threads never see
        each other's tokens; freed when the generator ends or is closed; the calling thread's
        :meth:`default_sequence` is emptied first, as the single cache of old was), until ``max_tokens`` or an
        end-of-generation token (not yielded). Each token's text is its piece (llama_token_to_piece),
        as llama.cpp's command line streams it: nothing stripped or cleaned, so the pieces joined
        continue the prompt's text; control tokens show their text only with ``special`` (its
        ``--special``). The bytes of a UTF-8 character split over several tokens come with the token
        that completes it; bytes no token completes become U+FFFD in the last token's text (``max_tokens``
        reached) or are left out of the text (an end-of-generation token came first); each token's
        ``bytes`` keeps them. :attr:`timings` is the latest generation's."""
        ids, sampler = self._checked_generation(prompt, max_tokens, sampler)
        mine = getattr(self._local, "seq", None)
        if mine is not None and mine.open:  # as the single cache did: the thread's eval tokens are forgotten
            mine.clear()
        with self.new_sequence("a generation's sequence") as seq:
            self.timings = seq.timings = Timings()
            yield from seq._generate(ids, max_tokens, sampler, special)

    def generate_many(self, prompts: Seq[str | Seq[int]], n_predict: int = 64, sampler: Any = None, *,
                      seed: int | None = None, special: bool = False,
                      n_parallel: int | None = None) -> list[list[Token]]:
        """Generate after every prompt at once, batched (:class:`~.engine.Engine`): for each prompt, in order,
        the list of its :class:`Token` (``"".join(t.text for t in toks)`` is its text), as
        :meth:`generate` would yield them: up to ``n_predict`` tokens, ending early at an end-of-generation
        token. ``sampler``: None (greedy), a :class:`Sampler` (copied per prompt: prompt i draws with seed
        ``seed + i``, ``seed`` defaulting to the sampler's own), or a list of one sampler per prompt.
        ``n_parallel``: prompts computed at once (default: all of them, up to 16)."""
        from .engine import Engine, samplers_for
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Seq) or not prompts:
            raise InvalidArgument(f"prompts must be a non-empty list of prompts (texts or token-id lists), "
                                  f"got {prompts!r:.80}")
        samplers = samplers_for(sampler, len(prompts), seed)
        engine = Engine(self, n_parallel if n_parallel is not None else min(len(prompts), DEFAULT_PARALLEL))
        try:
            requests = [engine.submit(p, n_predict, s, special=special) for p, s in zip(prompts, samplers)]
            engine.run()
        finally:
            engine.close()  # an interrupted run frees its sequences
        for r in requests:
            if r.error is not None:
                raise r.error
        return [r.tokens for r in requests]

    def perplexity(self, text: str | Seq[int]) -> float:
        """exp of the mean negative log-likelihood of each token given the ones before it (from empty, on the
        calling thread's sequence, as :meth:`logits`)."""
        return self.default_sequence().perplexity(text)

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Model({hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, vocab {hp.n_vocab}, "
                f"backend {self.backend.name}, {self.cache!r})")


class Sequence:
    """One sequence of a model's KV cache (:meth:`Model.new_sequence`): the tokens fed to it so far, in cells
    it holds (some shared with the sequence it copied a prefix from). Safe to use from any thread; calls
    on one sequence from several threads at once run one after the other, in an order of their making."""

    def __init__(self, model: Model, seq: int) -> None:
        self.model, self.id = model, seq
        self.timings = Timings()
        self._finalizer = weakref.finalize(self, _release, weakref.ref(model), seq)  # not keeping the model alive

    @property
    def open(self) -> bool:
        return self._finalizer.alive

    @property
    def label(self) -> str:
        return self.model.cache.labels.get(self.id, f"sequence {self.id} (removed)")

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise InvalidArgument(f"sequence {self.id} was removed; make a new one with model.new_sequence()")

    @property
    def n_past(self) -> int:
        """Tokens in the sequence (the position the next one takes)."""
        self._check_open()
        return self.model.cache.next_pos[self.id]

    def cells(self) -> tuple[int, int]:
        """Cells the sequence holds: on full-attention layers, on sliding-window layers (shared ones count)."""
        self._check_open()
        with self.model._exclusive():
            return self.model.cache.holders()[self.id]

    def remove(self) -> None:
        """Free the sequence's cells (those no other sequence shares); the handle is unusable afterwards."""
        self._finalizer()

    def __enter__(self) -> Sequence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def clear(self) -> None:
        """Forget the sequence's tokens; it stays open, empty."""
        self._check_open()
        with self.model._exclusive():
            self.model.cache.seq_rm(self.id)

    def copy_prefix(self, other: Sequence, n: int | None = None) -> None:
        """This sequence becomes the first ``n`` tokens of ``other`` (all of them by default), sharing its
        cells: a common prefix (a system prompt) is computed once (llama.cpp's seq_cp)."""
        self._check_open()
        if not isinstance(other, Sequence) or other.model is not self.model:
            raise InvalidArgument(f"copy_prefix: other must be a Sequence of the same model, got {other!r:.80}")
        other._check_open()
        with self.model._exclusive():
            self.model.cache.seq_cp(other.id, self.id, self.model.cache.next_pos[other.id] if n is None else n)

    def eval(self, ids: Seq[int], *, all_logits: bool = False) -> np.ndarray:
        """Feed ``ids`` after the sequence's tokens, in batches of n_batch; returns the float32 logits of every
        new position (``all_logits``) or of the last one, shape (rows, n_vocab). Refused before any work when
        they do not fit; nothing stays of them when a compute fails."""
        m = self.model
        arr = m._check_ids(ids)
        self._check_open()
        out = []
        with m._exclusive():
            past = m.cache.next_pos[self.id]
            m.cache.probe(self.id, len(arr))  # refuse a context or cache overflow before any work
            try:
                for lo in range(0, len(arr), m.n_batch):
                    chunk = arr[lo:lo + m.n_batch]
                    n = len(chunk)
                    rows = np.arange(n, dtype=np.int32) if all_logits else np.array([n - 1], np.int32)
                    z = m._compute(chunk, np.full(n, self.id, np.int32),
                                   np.arange(past + lo, past + lo + n, dtype=np.int32), rows)
                    if all_logits or lo + m.n_batch >= len(arr):
                        out.append(z)
            except BaseException:
                m.cache.seq_rm(self.id, past)
                raise
        return out[0] if len(out) == 1 else np.concatenate(out)

    def logits(self, ids: Seq[int]) -> np.ndarray:
        """Float32 logits of every position of ``ids`` from empty (the sequence is cleared first, and holds
        ``ids`` afterwards): shape (len(ids), n_vocab)."""
        self.model._check_ids(ids)
        self.clear()
        return self.eval(ids, all_logits=True)

    def generate(self, prompt: str | Seq[int], max_tokens: int = 64, sampler: Sampler | None = None, *,
                 special: bool = False) -> Iterator[Token]:
        """As :meth:`Model.generate`, continuing this sequence: the prompt is fed after its tokens (on an empty
        sequence, exactly Model.generate). Afterwards it holds the prompt and every generated token but the
        last (never fed); :attr:`timings` says how long it took."""
        ids, sampler = self.model._checked_generation(prompt, max_tokens, sampler, self.n_past)
        self.timings = Timings()
        yield from self._generate(ids, max_tokens, sampler, special)

    def _generate(self, ids: list[int], max_tokens: int, sampler: Sampler | None, special: bool) -> Iterator[Token]:
        m, t = self.model, self.timings
        sampler = sampler if sampler is not None else Sampler.greedy()
        t.n_prompt = len(ids)
        logits, t.prompt_s = t.timed(lambda: self.eval(ids)[-1], m.backend)
        history, n_out = list(ids), 0
        text = TokenText(m.tokenizer, special)
        for _ in range(max_tokens):
            tok = sampler(logits, history)
            if tok in m.eog_ids:
                return
            history.append(tok)
            n_out += 1
            yield text(tok, last=n_out == max_tokens)
            if n_out < max_tokens:
                logits, seconds = t.timed(lambda: self.eval([tok])[-1], m.backend)  # noqa: B023 - called now
                t.decode_s += seconds
                t.n_decode += 1

    def perplexity(self, text: str | Seq[int]) -> float:
        """As :meth:`Model.perplexity`, from empty (the sequence is cleared first)."""
        ids = self.model.encode(text)
        if len(ids) < 2:
            raise InvalidArgument("perplexity needs at least two tokens")
        self.clear()
        n_batch = self.model.n_batch
        with self.model._exclusive():
            self.model.cache.probe(self.id, len(ids))  # refuse a context overflow before any work
        nll = 0.0
        for lo in range(0, len(ids) - 1, n_batch):  # a batch of logits at a time, not (len(ids), n_vocab)
            z = self.eval(ids[lo:lo + n_batch], all_logits=True)
            nxt = np.asarray(ids[lo + 1:lo + 1 + len(z)])
            for r in range(0, len(nxt), PERPLEXITY_ROWS):  # float64 a few rows at a time
                zr = z[r:r + PERPLEXITY_ROWS][:len(nxt) - r].astype(np.float64)
                m = zr.max(axis=1)
                lse = m + np.log(np.exp(zr - m[:, None]).sum(axis=1))
                nll += float((lse - zr[np.arange(len(zr)), nxt[r:r + len(zr)]]).sum())
        return float(np.exp(nll / (len(ids) - 1)))

    def __repr__(self) -> str:
        return f"Sequence({self.label}, {self.n_past if self.open else 'removed'})"


def _release(model: weakref.ref, seq: int) -> None:
    m = model()
    if m is not None:
        m._release(seq)
