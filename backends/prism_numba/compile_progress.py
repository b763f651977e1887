"""numba's compilations reported as Prism progress (:mod:`prism_core.progress`): with a cold cache the first
graphs of a process compile kernels for tens of seconds, and a front end such as ``prism run`` shows
"numba: compiling kernels, n so far, the kernel in hand" meanwhile. Loads from numba's on-disk cache are
not compilations and are not reported.

numba broadcasts a "numba:compile" event around every dispatcher compilation, nested when a kernel's
typing compiles a helper it calls; one kernel counts once, when its outermost compilation ends. Compilation
holds numba's global compiler lock, so the events arrive one thread at a time."""

from __future__ import annotations

import time

from numba.core import event

from prism_core import progress

TASK = "numba: compiling kernels"
PACKAGE = __name__.rpartition(".")[0]  # "prism_numba": compilations of other code are not this backend's


def _kernel_name(data: object) -> tuple[str, str]:
    """The compiled function's name and module."""
    dispatcher = data.get("dispatcher") if isinstance(data, dict) else None
    func = getattr(dispatcher, "py_func", None)
    return getattr(func, "__name__", "?"), getattr(func, "__module__", "") or ""


class CompileListener(event.Listener):
    """Counts this backend's outermost compilations and reports each start (the kernel's name) and end."""

    def __init__(self) -> None:
        self.depth = 0
        self.compiled = 0  # kernels compiled by this process so far
        self.seconds = 0.0  # time spent in this backend's outermost compilations
        self._started = 0.0
        self._ours = False  # whether the outermost compilation in progress is one of this backend's kernels

    def on_start(self, ev: event.Event) -> None:
        self.depth += 1
        if self.depth == 1:
            name, module = _kernel_name(ev.data)
            self._ours = module == PACKAGE or module.startswith(PACKAGE + ".")
            self._started = time.perf_counter()
            if self._ours and progress.active():
                progress.report(TASK, self.compiled, unit="kernels", detail=f"compiling {name}")

    def on_end(self, ev: event.Event) -> None:
        self.depth -= 1
        if self.depth == 0 and self._ours:
            self.compiled += 1
            self.seconds += time.perf_counter() - self._started
            if progress.active():
                progress.report(TASK, self.compiled, unit="kernels", detail=f"compiled {_kernel_name(ev.data)[0]}")


LISTENER = CompileListener()
_installed = False


def install() -> CompileListener:
    """Listen to numba's compile events for the rest of the process (once; called when the kernels load)."""
    global _installed
    if not _installed:
        event.register("numba:compile", LISTENER)
        _installed = True
    return LISTENER
