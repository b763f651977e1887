"""Progress of work that takes seconds (a backend compiling its kernels, a model file being assembled),
reported to whoever shows it.

The work calls :func:`report` as it goes; with nobody listening that is one check. A front end listens
for as long as it shows progress (``prism run`` draws tqdm bars on stderr: :mod:`prism_core.progress_bars`).
Neither the core nor a backend prints progress itself: they report, the listener decides whether and where
it appears, so a library user sees nothing unless they ask::

    with prism_core.progress.listening(print):
        model = prism_core.models.load("gemma3-270m", backend="numba")
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import InvalidArgument


@dataclass(frozen=True)
class Progress:
    """One report: ``done`` units of ``task`` so far, out of ``total`` (None: open-ended, a count)."""

    task: str  # what is being done: "numba: compiling kernels", "assembling gemma-3-270m-q4_k_m.gguf"
    done: int
    total: int | None = None
    unit: str = ""  # "B" for bytes (shown scaled), else a plural noun ("kernels"); "" counts items
    detail: str = ""  # the item in hand, e.g. the kernel being compiled

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total


Listener = Callable[[Progress], None]
_listeners: tuple[Listener, ...] = ()  # replaced whole under _LOCK, so report() reads it without the lock
_LOCK = threading.Lock()


def active() -> bool:
    """Whether anyone listens: work may skip preparing a report's detail when nobody does."""
    return bool(_listeners)


def report(task: str, done: int, total: int | None = None, *, unit: str = "", detail: str = "") -> None:
    """Tell every listener that ``done`` units of ``task`` are done (of ``total``, when known). Report the
    same ``task`` text for one piece of work, with ``done`` growing; ``done == total`` ends it."""
    listeners = _listeners
    if not listeners:
        return
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise InvalidArgument(f"progress of {task!r}: done must be an int >= 0, got {done!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise InvalidArgument(f"progress of {task!r}: total must be None or an int >= 0, got {total!r}")
    event = Progress(str(task), done, total, str(unit), str(detail))
    for listener in listeners:
        listener(event)


@contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """Call ``listener(Progress)`` for every report made (by any thread) inside the block."""
    global _listeners
    if not callable(listener):
        raise InvalidArgument(f"a progress listener must be callable, got {type(listener).__name__}")
    with _LOCK:
        _listeners = (*_listeners, listener)
    try:
        yield listener
    finally:
        with _LOCK:
            rest = list(_listeners)
            rest.remove(listener)
            _listeners = tuple(rest)
