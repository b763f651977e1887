"""Progress of slow work: prism_core.progress reports and the tqdm bars of ``prism run`` (on stderr only)."""

from __future__ import annotations

import io

import pytest

from prism_core import progress
from prism_core.errors import InvalidArgument
from prism_core.progress_bars import ProgressBars


def recorded() -> tuple[list[progress.Progress], progress.Listener]:
    events: list[progress.Progress] = []
    return events, events.append


# ---------------------------------------------------------------- reports
def test_reports_reach_listeners_only_inside_the_block():
    events, listen = recorded()
    progress.report("before", 1)
    assert not progress.active()
    with progress.listening(listen):
        assert progress.active()
        progress.report("copying", 3, 10, unit="B", detail="x")
        with progress.listening(listen):  # nested: both registrations hear it
            progress.report("copying", 10, 10, unit="B")
    progress.report("after", 1)
    assert not progress.active()
    assert [(e.task, e.done, e.total, e.unit, e.detail, e.finished) for e in events] == [
        ("copying", 3, 10, "B", "x", False), ("copying", 10, 10, "B", "", True), ("copying", 10, 10, "B", "", True)]


@pytest.mark.parametrize("done, total", [(-1, None), (1.5, None), (True, None), (1, -2), (1, "9")])
def test_bad_counts_are_refused(done, total):
    with progress.listening(lambda e: None), pytest.raises(InvalidArgument, match="progress of 'task'"):
        progress.report("task", done, total)
    with pytest.raises(InvalidArgument, match="must be callable"):
        with progress.listening("print"):
            pass


# ---------------------------------------------------------------- bars
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_draw_on_their_stream_and_nothing_after_close():
    out = io.StringIO()
    with ProgressBars(out, enabled=True) as bars:
        progress.report("numba: compiling kernels", 0, unit="kernels", detail="compiling add")
        progress.report("numba: compiling kernels", 1, unit="kernels", detail="compiled add")
        progress.report("copying f", 512, 1024, unit="B")
        progress.report("copying f", 1024, 1024, unit="B")
        bars.close()
        progress.report("numba: compiling kernels", 2, unit="kernels", detail="compiling late")
    text = out.getvalue()
    assert "numba: compiling kernels: 1 kernels" in text and "compiled add" in text
    assert "copying f: 100%" in text and "1.00k/1.00k" in text  # bytes scaled by 1024
    assert "late" not in text


@pytest.mark.parametrize("stream, enabled, drawn", [(FakeTerminal, None, True), (io.StringIO, None, False),
                                                   (FakeTerminal, False, False), (io.StringIO, True, True)])
def test_bars_default_to_drawing_only_on_a_terminal(stream, enabled, drawn):
    out = stream()
    with ProgressBars(out, enabled=enabled):
        progress.report("copying f", 1, 2)
    assert ("copying f" in out.getvalue()) is drawn
