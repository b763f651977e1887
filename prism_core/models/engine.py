"""Continuous batching: many generations share each pass over the weights.

An :class:`Engine` holds up to ``n_parallel`` active requests, each on a sequence of its own in the
model's KV cache. One :meth:`Engine.step` computes the next token of every request that is decoding plus
a chunk of the prompts still being read (mixed prefill and decode in one batch, as llama-server's
slots): up to ``n_batch`` tokens per step (llama.cpp's logical batch), computed as graphs of at most
``n_ubatch`` tokens (its physical batch; the decode rows come first, so they share one graph). Each row
carries its own sequence and position; the cache gives each row a mask over the cells of its own
sequence (and, on sliding-window layers, of its own window), so a request's tokens never see another's.
The model plans one graph per (tokens, cells, logits rows) shape and reuses it, as for a single sequence.

Each request samples with its own :class:`~.sampling.Sampler` (its own generator, seeded once), stops at
``max_tokens`` or an end-of-generation token, and frees its sequence's cells when it ends or is
cancelled. A request waits when every slot is busy; when the cache has no room for a step, the most
recently admitted request is preempted: its cells are freed and it goes back to the front of the queue,
to read its prompt and the tokens it generated again (vLLM's recompute preemption) and continue.

Two ways to drive it: :meth:`Engine.start` runs the steps on a worker thread of its own, and any thread
may :meth:`Engine.submit` and read its :class:`Request` as an iterator of tokens (a server); or the caller
calls :meth:`Engine.run` (scripts: :meth:`Model.generate_many <.model.Model.generate_many>`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BoundExceeded, InvalidArgument
from .model import Model, Sequence, Token, TokenText
from .sampling import Sampler, SamplerLike, checked_sampler

_END = object()
# planned graphs the engine lets the model keep: decode steps of every active count and a few mixed ones
EXTRA_PLANS = 6


class Request:
    """One generation submitted to an :class:`Engine`: iterate it (once, from any one thread) for its tokens as
    they come, or read ``tokens`` (those so far); :meth:`cancel` ends it at the engine's next step.
    ``finish_reason`` once it ended: "length" (``max_tokens`` reached), "stop" (an end-of-generation token,
    not yielded), "cancelled", or "error" (``error`` says why; iterating raises it)."""

    def __init__(self, ids: list[int], max_tokens: int, sampler: SamplerLike, text: TokenText, number: int) -> None:
        self.n_prompt = len(ids)
        self.max_tokens = max_tokens
        self.n_generated = 0
        self.tokens: list[Token] = []
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.number = number
        self._sampler, self._text = sampler, text
        self._history = list(ids)  # every token fed or to be fed: what a repetition penalty reads
        self._todo = list(ids)  # tokens still to feed, in order; the last one's logits pick the next token
        self._seq: Sequence | None = None
        self._decoding = False  # its prompt is read: one token to feed per step
        self._n_past = 0
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._engine: Engine | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop generating; the request's cells are freed at the engine's next step (at once when it was
        still waiting)."""
        self._cancel.set()
        if self._engine is not None:
            self._engine._cancelled(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request ended (True) or ``timeout`` seconds passed (False)."""
        return self._done.wait(timeout)

    def __iter__(self) -> Iterator[Token]:
        while True:
            item = self._q.get()
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    # ------------------------------------------------------------ the engine's side
    def _emit(self, tok: Token) -> None:
        self.tokens.append(tok)
        self._q.put(tok)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if self._seq is not None:
            self._seq.remove()
            self._seq = None
        self.finish_reason, self.error = reason, error
        self._done.set()
        self._q.put(_END)

    def __repr__(self) -> str:
        state = self.finish_reason or ("active" if self._seq is not None else "waiting")
        return f"Request({self.number}, {self.n_prompt} prompt tokens, {self.n_generated} generated, {state})"


@dataclass
class EngineStats:
    """Totals since the engine was made: steps, prompt tokens read (re-read ones of preempted requests
    included), tokens generated, preemptions, and seconds spent computing steps (less a JIT backend's
    compiling meanwhile)."""

    steps: int = 0
    prompt_tokens: int = 0
    generated: int = 0
    preempted: int = 0
    compute_s: float = 0.0


class Engine:
    """Continuous batching over one model (see the module's docstring). ``n_parallel``: requests computed
    at once (each holds a sequence of the cache); ``n_batch``: tokens per step; ``n_ubatch``: tokens per
    graph (both at most the model's ``n_batch``, which the cache's sliding-window cells were sized for)."""

    def __init__(self, model: Model, n_parallel: int = 4, *, n_batch: int | None = None,
                 n_ubatch: int | None = None) -> None:
        from .kv_cache import MAX_SEQ
        if not isinstance(model, Model):
            raise InvalidArgument(f"Engine needs a prism_core.models.Model, got {type(model).__name__}")
        if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or not 0 < n_parallel <= MAX_SEQ:
            raise InvalidArgument(f"n_parallel must be an int in [1, {MAX_SEQ}], got {n_parallel!r}")
        for name, v in (("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= model.n_batch):
                raise InvalidArgument(f"{name} must be an int in [1, {model.n_batch}] (the model's n_batch), "
                                      f"got {v!r}")
        self.model, self.n_parallel = model, n_parallel
        self.n_batch = n_batch or model.n_batch
        self.n_ubatch = min(n_ubatch or self.n_batch, self.n_batch)
        model.max_plans = max(model.max_plans, n_parallel + EXTRA_PLANS)
        self.stats = EngineStats()
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []  # admission order: the last one is preempted first
        self._cond = threading.Condition()  # guards _waiting and the worker's sleep
        self._numbers = itertools.count()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._hold = False  # a request was preempted for room: admit none until one ends
        self._progress = False  # the last step computed something

    # ------------------------------------------------------------ submitting
    def submit(self, prompt: str | Seq[int], max_tokens: int = 64, sampler: SamplerLike | None = None, *,
               special: bool = False) -> Request:
        """Queue a generation of up to ``max_tokens`` tokens after ``prompt`` (text, or token ids) with
        ``sampler`` (None: greedy; give each request its own Sampler: its generator advances with every
        draw). Refused (BoundExceeded) when the prompt and ``max_tokens`` exceed the context. Thread-safe."""
        m = self.model
        ids, sampler = m._checked_generation(prompt, max_tokens, sampler)
        with self._cond:
            if self._closed:
                raise InvalidArgument("the engine is closed")
            req = Request(ids, max_tokens, sampler, TokenText(m.tokenizer, special), next(self._numbers))
            req._engine = self
            if max_tokens == 0:
                req._finish("length")
                return req
            self._waiting.append(req)
            self._cond.notify_all()
        return req

    def _cancelled(self, req: Request) -> None:
        with self._cond:
            if req in self._waiting:  # never admitted: nothing to free
                self._waiting.remove(req)
                req._finish("cancelled")
            self._cond.notify_all()  # an idle worker wakes to free the cells

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._waiting and not self._active

    # ------------------------------------------------------------ driving
    def run(self) -> None:
        """Step until every submitted request has ended (in the calling thread; not with :meth:`start`)."""
        if self._worker is not None:
            raise InvalidArgument("the engine runs on its worker thread (start()); submit and read requests instead")
        while self.step():
            if not self._progress and not self._active:
                raise BoundExceeded(f"no request can start: the KV cache's sequences are all open; held: "
                                    f"{self.model.cache.holders_text()}")

    def start(self) -> Engine:
        """Run the steps on a worker thread until :meth:`close`."""
        with self._cond:
            if self._worker is None and not self._closed:
                self._worker = threading.Thread(target=self._work, daemon=True, name="prism-engine")
                self._worker.start()
        return self

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._active:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.step()
                if not self._progress:  # waiting for a sequence of the cache that other users hold
                    with self._cond:
                        self._cond.wait(0.05)
            except BaseException as e:  # never leave a reader waiting on a dead worker
                with self._cond:
                    pending = list(self._waiting) + self._active
                    self._waiting.clear()
                    self._active.clear()
                for req in pending:
                    req._finish("error", e)
                if not isinstance(e, Exception):
                    raise

    def close(self) -> None:
        """Stop the worker; requests not ended are cancelled and their cells freed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.join()
        with self._cond:
            for req in list(self._waiting) + self._active:
                req._finish("cancelled")
            self._waiting.clear()
            self._active.clear()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ one step
    def step(self) -> bool:
        """Compute one batch: the next token of every decoding request and prompt chunks up to n_batch
        tokens. Returns whether requests remain (active or waiting)."""
        self._drop_cancelled()
        self._admit()
        rows = self._rows()
        self._progress = bool(rows)
        if rows:
            for lo in range(0, len(rows), self.n_ubatch):
                if not self._compute(rows[lo:lo + self.n_ubatch]):
                    break  # a request was preempted: the next step plans again
            self.stats.steps += 1
        with self._cond:
            return bool(self._waiting or self._active)

    def _drop_cancelled(self) -> None:
        for req in [r for r in self._active if r._cancel.is_set()]:
            self._end(req, "cancelled")

    def _admit(self) -> None:
        while len(self._active) < self.n_parallel and not (self._hold and self._active):
            with self._cond:
                if not self._waiting:
                    return
                req = self._waiting.popleft()
            try:
                req._seq = self.model.new_sequence(f"request {req.number}")
            except BoundExceeded:  # every sequence of the cache is open (other users of the model)
                with self._cond:
                    self._waiting.appendleft(req)
                return
            req._n_past = 0
            self._active.append(req)

    def _rows(self) -> list[tuple[Request, int, bool]]:
        """(request, token, whether its logits are wanted) per row: decoding requests first (one row each),
        then prompt chunks in admission order until n_batch rows."""
        rows: list[tuple[Request, int, bool]] = []
        decoding = [r for r in self._active if r._decoding]
        reading = [r for r in self._active if not r._decoding]
        for req in decoding + reading:
            room = self.n_batch - len(rows)
            if room <= 0:
                break
            chunk = req._todo[:room]
            rows += [(req, tok, False) for tok in chunk]
            if len(chunk) == len(req._todo):
                rows[-1] = (req, chunk[-1], True)
        return rows

    def _compute(self, rows: list[tuple[Request, int, bool]]) -> bool:
        """One graph of ``rows``; then each request whose last fed token's logits came samples its next.
        False when the cache had no room and a request was preempted (nothing of these rows computed)."""
        m = self.model
        reqs = [r for r, _, _ in rows]
        n_fed: dict[Request, int] = {}
        pos = np.empty(len(rows), np.int32)
        for i, req in enumerate(reqs):
            k = n_fed.get(req, 0)
            pos[i], n_fed[req] = req._n_past + k, k + 1
        out = [i for i, (_, _, want) in enumerate(rows) if want] or [len(rows) - 1]  # a graph has >= 1 logits row
        tokens = np.fromiter((t for _, t, _ in rows), np.int32, len(rows))
        seqs = np.fromiter((r._seq.id for r in reqs), np.int32, len(rows))
        compiled = m.backend.compile_seconds()
        start = time.perf_counter()
        try:
            with m._exclusive():
                logits = m._compute(tokens, seqs, pos, np.asarray(out, np.int32))
        except BoundExceeded as e:
            self._preempt(set(reqs), e)
            return False
        except Exception as e:  # the step's requests end with the error; the engine serves on
            for req in dict.fromkeys(reqs):
                if req in self._active:
                    self._end(req, "error", e)
            return False
        self.stats.compute_s += max(0.0, time.perf_counter() - start - (m.backend.compile_seconds() - compiled))
        for req, k in n_fed.items():
            del req._todo[:k]
            req._n_past += k
            if not req._decoding:
                self.stats.prompt_tokens += k
        for row, i in enumerate(out):
            req, _, want = rows[i]
            if want:
                try:
                    self._sample(req, logits[row])
                except Exception as e:  # a sampler (any callable) that fails ends its own request only
                    self._end(req, "error", e)
        return True

    def _sample(self, req: Request, logits: np.ndarray) -> None:
        tok = int(req._sampler(logits, req._history))
        if tok in self.model.eog_ids:
            self._end(req, "stop")
            return
        req.n_generated += 1
        self.stats.generated += 1
        req._history.append(tok)
        req._emit(req._text(tok, last=req.n_generated == req.max_tokens))
        if req.n_generated == req.max_tokens:
            self._end(req, "length")
        else:
            req._todo, req._decoding = [tok], True

    def _end(self, req: Request, reason: str, error: BaseException | None = None) -> None:
        self._active.remove(req)
        req._finish(reason, error)
        self._hold = False

    def _preempt(self, batch: set[Request], error: BoundExceeded) -> None:
        """No room for a step: free the most recently admitted request and queue it first again, to re-read
        everything it holds; a request alone in the cache that does not fit ends with the error."""
        req = self._active.pop()
        if not self._active:
            req._finish("error", error)
            return
        req._seq.remove()
        req._seq, req._n_past, req._decoding = None, 0, False
        req._todo = list(req._history)
        self.stats.preempted += 1
        self._hold = True  # no admission until a request ends: the preempted one would not fit again
        with self._cond:
            self._waiting.appendleft(req)


def samplers_for(sampler: SamplerLike | Seq[SamplerLike] | None, n: int, seed: int | None) -> list[SamplerLike]:
    """One sampler per prompt for :meth:`Model.generate_many`: a list is taken as given (one per prompt); a
    :class:`Sampler` is copied per prompt with seed ``base + i`` (``base``: ``seed``, else the sampler's own;
    unseeded without either); None is greedy; any other callable is shared by every prompt."""
    import dataclasses
    if isinstance(sampler, (list, tuple)):
        if len(sampler) != n:
            raise InvalidArgument(f"sampler: a list of one sampler per prompt ({n}), got {len(sampler)}")
        return [checked_sampler(s) for s in sampler]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidArgument(f"seed must be an int >= 0 or None, got {seed!r}")
    sampler = checked_sampler(sampler)
    if not isinstance(sampler, Sampler):
        return [sampler] * n
    base = seed if seed is not None else sampler.seed
    return [dataclasses.replace(sampler, seed=None if base is None else base + i) for i in range(n)]
