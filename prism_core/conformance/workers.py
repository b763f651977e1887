"""Conformance in worker processes: a backend that crashes or hangs ends its worker, not the run.

A kernel that segfaults, calls ``exit`` from native code, or hangs while holding the GIL
cannot be contained by a thread. Here each backend's cases run in a child process (a
*worker*) that rebuilds the same cases from a :class:`Suite` (the cases are code, not data)
and streams one result per case back over a pipe. The parent only waits:

* a worker that dies is reported as CRASHED on the case it was computing, with the signal
  (or exit status) and, from Python's ``faulthandler``, the innermost frame; the rest of that
  op's cases are reported without running (one crash costs one restart, not one per case),
  and a fresh worker resumes with the next op;
* a case that takes longer than the per-case ``timeout`` gets its worker killed (a hang is
  really stopped, GIL or not) and is reported TIMEOUT with where it hung; the rest of that
  op's cases are reported TIMEOUT without running, and a fresh worker resumes after them;
* when the overall ``budget`` runs out, or the run is interrupted (Ctrl-C), the workers
  are stopped and every unfinished case is reported NOT_RUN: results so far are kept.

A worker is started once per backend (per batch of cases with ``jobs > 1``, reused for the
next batch of the same backend): its cost is one interpreter start plus importing the
backend (numba's compiled kernels come from its on-disk cache after the first run), not a
process per case. ``jobs`` workers run at once; each backend's cases are cut into batches
at op boundaries so that several workers share one backend.

The worker sees what this process sees: the same ``sys.path`` and environment, every
in-process plugin that it can load again (a module importable by name, or a picklable
object), and this process's probes of third-party plugins (so it imports only those that
passed, without probing them again). Backends of a plugin it cannot load (a module object built in memory) are run
in this process by the caller (see :func:`in_process_only`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..isolation.channel import POLL, Closed, Late, Stopped
from ..isolation.child import STARTUP_TIMEOUT, Child
from .runner import CRASHED, DEFAULT_TIMEOUT, NOT_RUN, TIMEOUT, CaseResult, case_detail


@dataclass(frozen=True)
class Suite:
    """Which cases to run; a worker rebuilds exactly these from it."""
    mode: str = "forward"  # "forward" or "grad"
    ops: tuple[str, ...] | None = None  # op keys; None: every op
    random: int | None = None  # N random cases per op instead of the fixed ones (forward mode)
    seed: int = 0

    def cases(self) -> list:
        ops = list(self.ops) if self.ops is not None else None
        if self.mode == "grad":
            from .gradcheck import grad_cases
            return grad_cases(ops)
        if self.random is not None:
            from .random_cases import random_cases
            return random_cases(ops, self.random, self.seed)
        from .cases import all_cases
        return all_cases(ops)


def fingerprint(cases: list) -> str:
    return hashlib.sha1("\n".join(c.name for c in cases).encode()).hexdigest()


# ------------------------------------------------------------------ plugins a worker can load again
def _reloadable(plugin: Any) -> tuple[str, Any] | None:
    """How a worker loads ``plugin`` (an in-process registration) again, or None."""
    if isinstance(plugin, type(sys)):
        spec = getattr(plugin, "__spec__", None)
        if spec is None or getattr(plugin, "__file__", None) is None:
            return None
        try:
            found = importlib.util.find_spec(plugin.__name__)
        except (ImportError, ValueError):
            return None
        return ("module", plugin.__name__) if found is not None and found.origin == spec.origin else None
    try:
        return "pickle", pickle.dumps(plugin)
    except Exception:  # noqa: BLE001 - not picklable: it cannot cross a process boundary
        return None


def _carried_plugins() -> list[tuple[str, str, Any]]:
    from ..plugin.registry import REGISTRY
    out = []
    for label, plugin in REGISTRY.in_process_plugins:
        how = _reloadable(plugin)
        if how is not None:
            out.append((label, *how))
    return out


def in_process_only(names: list[str]) -> list[str]:
    """The backends among ``names`` whose plugin was registered in this process in a form a
    worker cannot load (they run in this process, without protection from crashes)."""
    from ..plugin.registry import REGISTRY
    stuck = {label for label, plugin in REGISTRY.in_process_plugins if _reloadable(plugin) is None}
    return [n for n in names if REGISTRY.info(n).plugin in stuck]


# ------------------------------------------------------------------ the parent's side of one worker
class Worker(Child):
    """One child process computing ``backend``'s cases of ``suite``."""

    def __init__(self, backend: str, suite: Suite, timeout: float | None) -> None:
        super().__init__("prism_core.conformance.worker_main")
        self.backend = backend
        self.timeout = timeout
        self.ready = False
        from ..plugin.registry import REGISTRY
        self.send(("init", {"backend": backend, "suite": asdict(suite), "timeout": timeout,
                             "plugins": _carried_plugins(), "probes": REGISTRY.probes()}))

    def start(self, fingerprint_: str, deadline: float | None, stop: threading.Event | None) -> str:
        """Wait until the worker is ready: "" or why it could not start."""
        limit = None if not self.timeout else time.monotonic() + max(STARTUP_TIMEOUT, self.timeout)
        if deadline is not None:
            limit = deadline if limit is None else min(limit, deadline)
        try:
            msg = self.reader.get(limit, stop)
        except Closed:
            return self.death()
        except Late:
            self.kill()
            return "it did not start in time"
        except Stopped:
            self.kill()
            return "stopped"
        if msg[0] == "error":
            self.close()
            return msg[1]
        if msg[1] != fingerprint_:
            self.close()
            return "it built other cases than this process (are both on the same sys.path and seed?)"
        self.ready = True
        return ""

    def run(self, indices: list[int], skip: dict[str, tuple[str, str]], record: Callable[[int, dict], None],
            deadline: float | None, stop: threading.Event | None) -> tuple[str, str]:
        """Run cases ``indices`` in order, calling ``record(index, fields)`` per result; the cases
        of the ops in ``skip`` are only checked for support (op -> the status and message of
        those the backend claims). Returns ("ok", ""), or (what, why) with what in crashed,
        timeout, budget, stopped: the case after the last recorded one did not finish and the
        worker is gone."""
        if not self.send(("run", indices, skip)):
            return "crashed", self.death()
        while True:
            limit = None if not self.timeout else time.monotonic() + self.timeout
            by_budget = deadline is not None and (limit is None or deadline < limit)
            try:
                msg = self.reader.get(deadline if by_budget else limit, stop)
            except Closed:
                return "crashed", self.death()
            except Late:
                where = self.hang_site()
                return ("budget", "") if by_budget else ("timeout", f"did not finish within {self.timeout:g} s"
                                                                    f"{'; it hung' + where if where else ''}")
            except Stopped:
                self.kill()
                return "stopped", ""
            if msg[0] == "done":
                return "ok", ""
            record(msg[1], msg[2])


# ------------------------------------------------------------------ one backend over a series of batches
@dataclass
class BackendRun:
    """A backend's cases of one suite in workers, restarted after each crash or hang; the ops
    that crashed or hung are remembered, so their later cases are reported without running."""
    backend: str
    suite: Suite
    cases: list
    timeout: float | None
    on_event: Callable[[str], None] | None = None
    worker: Worker | None = None
    skip: dict[str, tuple[str, str]] = field(default_factory=dict)  # op -> (status, message)
    broken: str = ""  # why no worker can start for this backend

    def run(self, indices: list[int], record: Callable[[int, CaseResult], None], *,
            deadline: float | None = None, stop: threading.Event | None = None) -> str:
        """Record a result for every index, in order: "ok", or "budget"/"stopped" (the unrecorded
        indices are left to the caller)."""
        pending = deque(indices)
        fp = fingerprint(self.cases)
        while pending:
            while pending and self.broken:
                i = pending.popleft()
                record(i, CaseResult(self.cases[i], self.backend, CRASHED,
                                     f"not run: the worker could not start: {self.broken}"))
            if not pending:
                break
            if self.worker is None:
                self.worker = Worker(self.backend, self.suite, self.timeout)
                why = self.worker.start(fp, deadline, stop)
                if why:
                    self.worker = None
                    if stop is not None and stop.is_set():
                        return "stopped"
                    if deadline is not None and time.monotonic() >= deadline:
                        return "budget"
                    self.broken = why
                    self._event(f"{self.backend}: the worker could not start: {why}")
                    continue

            def got(i: int, fields: dict) -> None:
                assert pending and pending[0] == i, "a worker answered out of order"
                pending.popleft()
                record(i, CaseResult(self.cases[i], self.backend, **fields))

            what, why = self.worker.run(list(pending), self.skip, got, deadline, stop)
            if what == "ok":
                break
            self.worker = None
            if what in ("budget", "stopped"):
                return what
            if not pending:  # it ended after its last result
                continue
            i = pending.popleft()
            case = self.cases[i]
            status = CRASHED if what == "crashed" else TIMEOUT
            text = f"{why} while computing this case" if status == CRASHED else why
            record(i, CaseResult(case, self.backend, status, text, detail=case_detail(case)))
            verb = "crashed the worker" if status == CRASHED else "timed out on this backend"
            self.skip[case.key] = (status, f"not run: an earlier case of {case.key} ({case.desc}) {verb}")
            self._event(f"{self.backend}: {case.name}: {status.upper()}: {text}; "
                        f"a new worker resumes after the cases of {case.key}")
        return "ok"

    def _event(self, text: str) -> None:
        if self.on_event is not None:
            self.on_event(text)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


# ------------------------------------------------------------------ a whole run: backends x batches, `jobs` at once
@dataclass
class Outcome:
    results: dict[str, list[CaseResult]]
    interrupted: bool = False  # Ctrl-C: the unfinished cases are NOT_RUN
    out_of_budget: bool = False  # the overall budget ran out: the unfinished cases are NOT_RUN


def _batches(cases: list, n: int) -> list[list[int]]:
    """The case indices cut into about ``n`` batches of similar size, at op boundaries."""
    groups: list[list[int]] = []
    for i, c in enumerate(cases):
        if groups and cases[groups[-1][0]].key == c.key:
            groups[-1].append(i)
        else:
            groups.append([i])
    if n <= 1:
        return [list(range(len(cases)))] if cases else []
    target = len(cases) / n
    out: list[list[int]] = [[]]
    for g in groups:
        if out[-1] and len(out[-1]) + len(g) / 2 > target:
            out.append([])
        out[-1] += g
    return [b for b in out if b]


def run_suite(backends: list[str], suite: Suite, *, timeout: float | None = DEFAULT_TIMEOUT,
              timeouts: dict[str, float | None] | None = None, budget: float | None = None, jobs: int = 1,
              on_event: Callable[[str], None] | None = None,
              cases: list | None = None,
              on_result: Callable[[str, CaseResult], None] | None = None) -> Outcome:
    """Every case of ``suite`` (``cases``: ``suite.cases()`` when already built) on each backend
    (by name), in worker processes, ``jobs`` at a time; see the module docstring for what a
    crash, a hang and the budget do. ``timeouts`` overrides the per-case ``timeout`` by backend.
    ``on_result(backend, result)`` is called (from the worker threads, one call at a time) as
    each case's result arrives."""
    cases = suite.cases() if cases is None else cases
    deadline = None if not budget else time.monotonic() + budget
    got: dict[str, dict[int, CaseResult]] = {b: {} for b in backends}
    lock = threading.Lock()
    per_backend = 1 if jobs <= 1 else 2 * jobs  # more batches than workers: they even out
    work = deque((b, batch) for b in backends for batch in _batches(cases, per_backend))
    stop = threading.Event()
    state = {"budget": False}

    def slot(finished: threading.Event) -> None:
        current: BackendRun | None = None
        try:
            while not stop.is_set():
                with lock:
                    if not work:
                        return
                    name, batch = work.popleft()
                if current is None or current.backend != name:
                    if current is not None:
                        current.close()
                    current = BackendRun(name, suite, cases, (timeouts or {}).get(name, timeout), on_event)

                def record(i: int, r: CaseResult, name: str = name) -> None:
                    with lock:
                        got[name][i] = r
                        if on_result is not None:
                            on_result(name, r)
                end = current.run(batch, record, deadline=deadline, stop=stop)
                if end == "budget":
                    state["budget"] = True
                    stop.set()
        finally:
            if current is not None:
                current.close()
            finished.set()

    # Each worker is started and ended by the same thread (a worker dies with the thread
    # that started it: see worker_main). The main thread waits on events, not Thread.join: a
    # Ctrl-C inside join marks a running thread as finished on Python 3.11.
    finished = [threading.Event() for _ in range(max(1, min(jobs, len(work))))]
    for k, done in enumerate(finished):
        threading.Thread(target=slot, args=(done,), name=f"prism-conformance-slot-{k}", daemon=True).start()
    interrupted = False
    try:
        for done in finished:
            while not done.wait(POLL):
                pass
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        for done in finished:
            done.wait()
    why = ("not run: interrupted" if interrupted else
           f"not run: the overall budget of {budget:g} s ran out" if state["budget"] else "not run")
    results = {b: [got[b].get(i) or CaseResult(c, b, NOT_RUN, why) for i, c in enumerate(cases)] for b in backends}
    return Outcome(results, interrupted=interrupted, out_of_budget=state["budget"])


# ------------------------------------------------------------------ one case at a time, for pytest
class SessionRunner:
    """Workers kept for a whole pytest session, one per (backend, suite): each test asks for
    one case. What crashed or hung is remembered for the session, so a hung op costs one
    timeout, not one per test."""

    def __init__(self, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._cases: dict[Suite, tuple[list, dict[str, int]]] = {}
        self._runs: dict[tuple[str, Suite], BackendRun] = {}

    def result(self, backend: str, suite: Suite, case: Any) -> CaseResult:
        """The result of ``case`` (one of ``suite``'s cases, by name) on ``backend``."""
        if suite not in self._cases:
            cases = suite.cases()
            self._cases[suite] = cases, {c.name: i for i, c in enumerate(cases)}
        cases, index = self._cases[suite]
        run = self._runs.get((backend, suite))
        if run is None:
            run = self._runs[backend, suite] = BackendRun(backend, suite, cases, self.timeout)
        out: list[CaseResult] = []
        run.run([index[case.name]], lambda i, r: out.append(r))
        (r,) = out
        return CaseResult(case, r.backend, r.status, r.message, r.err, r.bound, r.worst, r.detail)

    def close(self) -> None:
        for run in self._runs.values():
            run.close()
        self._runs.clear()
