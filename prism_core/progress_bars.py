"""tqdm bars for :mod:`prism_core.progress` reports: one bar per task, on stderr (never stdout, which carries
the command's output)."""

from __future__ import annotations

import sys
import threading
from contextlib import ExitStack
from typing import IO, Any

from .progress import Progress, listening

TICK_S = 1.0  # open bars are redrawn this often: one kernel may compile for 20 s, and the clock should move
COUNT_FORMAT = "{desc}: {n_fmt} {unit} [{elapsed}{postfix}]"  # a task without a total: a count and the time


class ProgressBars:
    """While entered, draws every reported task as a tqdm bar on ``stream`` (default stderr). ``enabled``:
    True draws, False draws nothing, None (default) draws only when the stream is a terminal (tqdm's
    ``disable=None``). A task's bar closes, kept on screen, when it finishes; :meth:`close` ends the
    others and ignores later reports (call it before writing output to the same terminal)."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream
        self.disable = None if enabled is None else not enabled
        self._bars: dict[str, Any] = {}
        self._details: dict[str, str] = {}
        self._closed = False
        self._lock = threading.Lock()  # reports come from any thread; the ticker redraws from its own
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._stack = ExitStack()

    def __call__(self, p: Progress) -> None:
        with self._lock:
            if self._closed:
                return
            bar = self._bars.get(p.task)
            if bar is None:  # (a tqdm bar has no truth value while it has no total)
                bar = self._open(p)
            if p.detail != self._details.get(p.task, ""):
                self._details[p.task] = p.detail
                bar.set_postfix_str(p.detail, refresh=False)
                bar.update(p.done - bar.n)
                bar.refresh()  # a new item is news even when the count has not moved
            else:
                bar.update(p.done - bar.n)
            if p.finished:
                bar.close()
                del self._bars[p.task]
                self._details.pop(p.task, None)

    def _open(self, p: Progress) -> Any:
        from tqdm import tqdm
        scaled = p.unit == "B"
        bar = self._bars[p.task] = tqdm(
            total=p.total, desc=p.task, unit=p.unit or "it", unit_scale=scaled, unit_divisor=1024 if scaled else 1000,
            bar_format=COUNT_FORMAT if p.total is None else None, file=self.stream or sys.stderr,
            disable=self.disable, leave=True, dynamic_ncols=True)
        if not bar.disable and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="prism-progress", daemon=True)
            self._ticker.start()
        return bar

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                for bar in self._bars.values():
                    bar.refresh()

    def close(self) -> None:
        """End every open bar (kept on screen) and draw nothing more."""
        with self._lock:
            self._closed = True
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()

    def __enter__(self) -> ProgressBars:
        self._stack.enter_context(listening(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._stack.close()
