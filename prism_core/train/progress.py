"""ggml-opt's progress bar (``ggml_opt_epoch_callback_progress_bar``), same format."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

_PARTIAL = ("\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589")  # 1/8 .. 7/8
_FULL = "\u2588"
BAR_LENGTH = 8


def time_us() -> int:
    """Monotonic microseconds (ggml_time_us)."""
    return time.perf_counter_ns() // 1000


def hms(t_us: int) -> str:
    s = max(int(t_us), 0) // 1_000_000
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def bar(ibatch: int, ibatch_max: int) -> str:
    """The 8 cells of the bar, each filled in eighths (integer arithmetic as ggml)."""
    ibatch8 = 8 * ibatch
    cells = []
    for j in range(BAR_LENGTH):
        if ibatch_max * (8 * j + 8) // BAR_LENGTH < ibatch8:
            cells.append(_FULL)
            continue
        for k in range(7, 0, -1):
            if ibatch_max * (8 * j + k) // BAR_LENGTH < ibatch8:
                cells.append(_PARTIAL[k - 1])
                break
        else:
            cells.append(" ")
    return "".join(cells)


def progress_line(train: bool, batch_size: int, loss: tuple[float, float], accuracy: tuple[float, float],
                  ibatch: int, ibatch_max: int, t_start_us: int, now_us: int | None = None) -> str:
    """One progress-bar line, ending in ``\\r`` (and ``\\n`` once ``ibatch == ibatch_max``)."""
    now = time_us() if now_us is None else now_us
    t_us = now - t_start_us
    eta_us = t_us * (ibatch_max - ibatch) // ibatch if ibatch > 0 else 0
    (lv, lu), (av, au) = loss, accuracy
    line = (f"{'train: ' if train else 'val:   '}[{bar(ibatch, ibatch_max)}] "
            f"data={ibatch * batch_size:07d}/{ibatch_max * batch_size:07d} "
            f"loss={lv:.5f}\u00b1{lu:.5f} acc={100.0 * av:.2f}\u00b1{100.0 * au:.2f}% "
            f"t={hms(t_us)} ETA={hms(eta_us)} \r")
    if ibatch == ibatch_max:
        line += "\n"
    return line


def progress_bar_callback(stream: IO[str] | None = None):
    """An epoch callback that draws ggml's progress bar on ``stream`` (default stderr)."""
    def callback(train: bool, opt_ctx: Any, dataset: Any, result: Any, ibatch: int, ibatch_max: int,
                 t_start_us: int) -> None:
        out = stream if stream is not None else sys.stderr
        out.write(progress_line(train, opt_ctx.inputs.ne[1], result.loss(), result.accuracy(), ibatch, ibatch_max,
                                t_start_us))
        out.flush()
    return callback


def is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - closed or odd streams count as "not a terminal"
        return False
