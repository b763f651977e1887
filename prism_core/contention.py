"""When a parallel kernel should take fewer threads: the rule every parallel backend follows.

A parallel region ends at a barrier, so it lasts as long as its slowest thread. When another process
keeps one of the cores busy, every region waits for the thread the scheduler has parked: beside one
busy process on a 2-core machine, Gemma 3 270M decode at 2 threads ran at 29-33 tok/s on csimd and
16-23 on numba, against 66-69 and 43 on 1 thread (78-81 and 58-62 on 2 threads when idle).

The calling thread's run-queue delay tells that apart: the time it was ready to run but waited for
a CPU (Linux's ``/proc/thread-self/schedstat``). Measured there: at most 1.1% of the wall time on
the idle machine, 31-38% at 2 threads beside the busy process, 0.1-0.2% at 1 thread beside it.

The wait alone cannot tell whose threads held the CPUs: right after a NumPy matrix product,
OpenBLAS's worker threads of this very process spin on for ~50 ms, and a kernel that starts its own
threads then waits behind them (an F32 GEMM called alternately with NumPy's ran single-threaded, at
0.67x OpenBLAS on 2 cores). The process's own CPU time (every thread of it; ``CLOCK_PROCESS_CPUTIME_ID``)
tells that apart: over the same interval, the CPUs this process may run on give ``ncpu`` CPU-seconds a
second; what the process did not use of them went to other processes (or idled). Only when that is at
least :data:`OUTSIDE_CPUS` of a CPU was the wait another process's doing.

So every :data:`LOOK_S` seconds, at the entry of a kernel that asks for several threads, two shares
of the time since the last look are taken: the calling thread's wait, against :data:`DELAY_SHARE`, and
the CPUs' time this process left to others, against :data:`OUTSIDE_CPUS`. Above both (the thread
waited, and not for its own process), kernels take half the threads (at least one) for a hold of
:data:`HOLD_MIN_S`, halving again while still above; after the hold every thread is tried for one
look: a failed try doubles the hold (up to :data:`HOLD_MAX_S`), a passed one resets it. A kernel's
values never depend on its thread count, so this changes speed, never bits (tested on csimd and numba:
whole-tensor sums over rows that cancel, and Gemma 3 logits past its sliding window).

``PRISM_ADAPTIVE_THREADS=0`` keeps the count asked for (backends read :func:`adaptive` when they are
selected, and call :func:`threads_now` only when it is on). Where the scheduler statistics cannot be
read (not Linux), nothing changes. The csimd backend runs the same rule in C (csrc/csimd_threads.h,
with these constants), since it looks at every kernel entry.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from .settings import env_int

ENV_ADAPTIVE = "PRISM_ADAPTIVE_THREADS"
LOOK_S = 0.1
DELAY_SHARE = 0.1
HOLD_MIN_S = 1.0
HOLD_MAX_S = 8.0
OUTSIDE_CPUS = 0.5  # CPUs' time (per second) the process left to others, below which a wait is its own doing
SCHEDSTAT = "/proc/thread-self/schedstat"


def adaptive() -> bool:
    """``$PRISM_ADAPTIVE_THREADS`` (0 or 1, default 1); InvalidArgument naming it otherwise."""
    return bool(env_int(ENV_ADAPTIVE, 1, 0, 1))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the machine's count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class ThreadWatch:
    """One calling thread's watch: :meth:`look` is the rule, fed a time, the thread's total
    run-queue delay and the process's total CPU time (all in seconds); ``ncpu``: the CPUs the
    process may run on."""

    ncpu: int = field(default_factory=usable_cpus)
    t0: float = 0.0
    delay0: float = 0.0
    cpu0: float = 0.0
    hold: float = HOLD_MIN_S
    until: float = 0.0
    limit: int = 0  # 0: none, else the most threads a kernel takes
    started: bool = False

    def look(self, t: float, delay: float, cpu: float, nth: int) -> int:
        """Update with a look at time ``t`` (the thread having waited ``delay`` s in all, the process
        having run ``cpu`` s on all its threads), ``nth`` threads asked for; returns the limit (0: none)."""
        if not self.started:
            self.t0, self.delay0, self.cpu0, self.started = t, delay, cpu, True
            return self.limit
        dt = t - self.t0
        if dt < LOOK_S:
            return self.limit
        busy = ((delay - self.delay0) / dt > DELAY_SHARE
                and self.ncpu - (cpu - self.cpu0) / dt >= OUTSIDE_CPUS)
        if self.limit == 0:
            if busy:
                self.limit, self.until = max(1, nth // 2), t + self.hold
            else:
                self.hold = HOLD_MIN_S
        elif busy and self.limit > 1:
            self.limit, self.until = max(1, self.limit // 2), t + self.hold
        elif t >= self.until:
            self.limit, self.hold = 0, min(2 * self.hold, HOLD_MAX_S)  # a failed try holds longer
        self.t0, self.delay0, self.cpu0 = t, delay, cpu
        return self.limit


_local = threading.local()


def _run_delay() -> float | None:
    """The calling thread's run-queue delay so far (s), or None where Linux's statistics are missing."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


_have_schedstat: bool | None = None  # found out at the first parallel kernel, not at import


def threads_now(nth: int) -> int:
    """How many of ``nth`` threads the calling thread's next parallel kernel should take."""
    global _have_schedstat
    if nth <= 1:
        return nth
    if _have_schedstat is None:
        _have_schedstat = _run_delay() is not None
    if not _have_schedstat:
        return nth
    w = getattr(_local, "watch", None)
    if w is None:
        w = _local.watch = ThreadWatch()
    t = time.monotonic()
    if not w.started or t - w.t0 >= LOOK_S:
        delay = _run_delay()
        if delay is not None:
            w.look(t, delay, time.process_time(), nth)
    return min(nth, w.limit) if w.limit else nth


__all__ = ["DELAY_SHARE", "ENV_ADAPTIVE", "HOLD_MAX_S", "HOLD_MIN_S", "LOOK_S", "OUTSIDE_CPUS", "ThreadWatch",
           "adaptive", "threads_now", "usable_cpus"]
