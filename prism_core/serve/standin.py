"""A stand-in for :class:`prism_core.models.engine.Engine` (same interface) until the multi-sequence engine
lands: a thread per request and one lock around ``model.generate``, so one request computes at a time."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ..models import Sampler, Token

_END = object()


class Request:
    def __init__(self, engine: Engine, prompt: str | Sequence[int], max_tokens: int, sampler: Sampler | None,
                 special: bool) -> None:
        self.n_prompt = len(engine.model.encode(prompt))
        self.n_generated = 0
        self.finish_reason: str | None = None
        self._prompt, self._max, self._sampler, self._special = prompt, max_tokens, sampler, special
        self._q: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._engine = engine
        threading.Thread(target=self._work, daemon=True, name="prism-serve-request").start()

    def _work(self) -> None:
        try:
            with self._engine._lock:
                if self._cancel.is_set():
                    self.finish_reason = "cancelled"
                    return
                for tok in self._engine.model.generate(self._prompt, self._max, self._sampler, special=self._special):
                    self.n_generated += 1
                    self._q.put(tok)
                    if self._cancel.is_set():
                        self.finish_reason = "cancelled"
                        return
                self.finish_reason = "length" if self.n_generated >= self._max else "stop"
        except BaseException as e:  # handed to the reader
            self._q.put(e)
        finally:
            self._q.put(_END)

    def __iter__(self) -> Iterator[Token]:
        while True:
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self._cancel.set()


class Engine:
    def __init__(self, model: Any, n_parallel: int = 1) -> None:
        self.model = model
        self.n_parallel = n_parallel
        self._lock = threading.Lock()

    def submit(self, prompt: str | Sequence[int], max_tokens: int, sampler: Sampler | None = None, *,
               special: bool = False) -> Request:
        return Request(self, prompt, max_tokens, sampler, special)

    def close(self) -> None:
        pass

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
