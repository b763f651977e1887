"""Run conformance cases on a backend and compare with the reference.

The comparison follows ggml's test-backend-ops: NaN where the reference has none
fails; infinities must match in sign; the rest is judged by the normalised mean
squared error ``sum((a - b)^2) / sum(a^2)`` (a = backend under test, b = reference)
against the op's bound from the op table. Outputs live in a context with guard bytes
around every buffer, so a kernel that writes outside its output is caught.

Fault isolation, in process: every case of the backend under test runs in a worker
thread with a per-case timeout (:data:`DEFAULT_TIMEOUT`; ``timeout=None`` or 0 runs in the
calling thread). A kernel that raises, replaces a tensor's memory or metadata, writes into
its inputs or past its output, or does not return in time fails that case only; each case
has its own context, so nothing it did reaches the next case or another backend. A hung
kernel cannot be stopped from inside the process: the suite reports TIMEOUT, abandons the
worker thread (a daemon, it never blocks exit) and moves on; the remaining cases of that op
on that backend are reported TIMEOUT without being run, so one hang costs one timeout, not
one per case. A kernel that crashes the interpreter (a segfault) or hangs while holding the
GIL takes the process with it: :mod:`.workers` runs backends in worker processes for that,
and ``prism conformance`` and the pytest plugin use it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..context import Context
from ..errors import Unsupported
from ..graph import Graph
from ..plan import plan
from ..plugin.base import Backend
from ..plugin.registry import REGISTRY
from ..schedule import backend_reason, compute, computes_nothing
from ..tensor import Tensor
from ..types import traits
from .accuracy import element_bound, reads_block_types, ulp_errors
from .cases import Built, Case, case_id, replay_command

PASS, FAIL, UNSUPPORTED, TIMEOUT = "pass", "fail", "unsupported", "timeout"
CRASHED = "crashed"  # the worker process died (a signal, or an exit from native code) in this case
NOT_RUN = "not run"  # the overall budget ran out, or the run was interrupted, before this case
FAILED = (FAIL, TIMEOUT, CRASHED, NOT_RUN)  # a backend with any of these is not certified
GUARD_BYTES = 64
DEFAULT_TIMEOUT = 120.0  # seconds per case of the backend under test (JIT compilation included)


@dataclass(frozen=True)
class CaseResult:
    case: Any  # a Case (forward) or a GradCase (gradient mode)
    backend: str
    status: str
    message: str = ""
    err: float | None = None
    bound: float | None = None
    worst: tuple | None = None  # (index, expected, got); index in ggml order (i0, i1, i2, i3) when known
    detail: str = ""  # the tensors of the case: type, ne, nb of each source and the result, params
    ulp: float | None = None  # the worst element's error in ulp at the output's scale (see .accuracy)
    exact: bool = False  # every output element bit-equal to the reference

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    def describe(self) -> str:
        s = f"{self.case.name} on {self.backend}: {self.status.upper()}"
        if self.err is not None:
            s += f" nmse={self.err:.3g} (bound {self.bound:.3g})"
        if self.worst is not None:
            s += f"; worst element {_index(self.worst[0])}: expected {self.worst[1]!r}, got {self.worst[2]!r}"
        s += f": {self.message}" if self.message else ""
        s += f" [{self.detail}]" if self.detail and self.status != PASS else ""
        return s + (f"\n    replay: {self.replay}" if self.status != PASS else "")

    @property
    def case_id(self) -> str:
        return case_id(self.case)

    @property
    def replay(self) -> str:
        """The command that re-runs exactly this case on this backend."""
        return replay_command(self.backend, self.case)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record of this result (used by the certification report)."""
        d: dict[str, Any] = {"op": self.case.key, "case": self.case.desc, "name": self.case.name,
                             "id": self.case_id, "replay": self.replay,
                             "status": self.status, "message": self.message, "detail": self.detail,
                             "nmse": _num(self.err), "bound": _num(self.bound), "worst": None,
                             "ulp": _num(self.ulp), "exact": self.exact}
        if self.worst is not None:
            idx = self.worst[0]
            d["worst"] = {"index": list(idx) if isinstance(idx, tuple) else idx,
                          "expected": _num(self.worst[1]), "got": _num(self.worst[2])}
        return d


def _num(x: Any) -> Any:
    """A float for JSON: NaN and infinities as strings (JSON has no literal for them)."""
    if x is None:
        return None
    x = float(x)
    return x if np.isfinite(x) else str(x)


def _index(i: Any) -> str:
    return "[" + ",".join(str(int(v)) for v in i) + "]" if isinstance(i, tuple) else str(i)


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    """ggml's error metric, normalised by the tested backend's values (0/0 counts as 0)."""
    num = float(np.sum((got - ref) ** 2))
    den = float(np.sum(got**2))
    if num == 0.0:
        return 0.0
    return num / den if den > 0 else float("inf")


def compare(got: np.ndarray, ref: np.ndarray, bound: float) -> tuple[bool, str, float | None, tuple | None]:
    got, ref = np.asarray(got, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
    if got.shape != ref.shape:
        return False, f"shape {got.shape} differs from the reference {ref.shape}", None, None
    bad_nan = np.isnan(got) & ~np.isnan(ref)
    if bad_nan.any():
        i = int(np.argmax(bad_nan))
        return False, "NaN where the reference has a number", None, (i, ref[i], got[i])
    lost_nan = np.isnan(ref) & ~np.isnan(got)
    if lost_nan.any():
        i = int(np.argmax(lost_nan))
        return False, "a number where the reference has NaN", None, (i, ref[i], got[i])
    zero_sign = (got == 0) & (ref == 0) & (np.signbit(got) != np.signbit(ref))
    if zero_sign.any():  # ggml's expressions fix the sign of a zero result: every backend must agree
        i = int(np.argmax(zero_sign))
        return False, "a zero of the other sign than the reference's", None, (i, ref[i], got[i])
    inf = np.isinf(ref) | np.isinf(got)
    if np.any(inf & (got != ref)):
        i = int(np.argmax(inf & (got != ref)))
        return False, "infinity differs in sign or presence", None, (i, ref[i], got[i])
    fin = ~inf & ~np.isnan(ref)
    err = nmse(got[fin], ref[fin])
    worst = None
    if fin.any():
        with np.errstate(invalid="ignore"):
            diff = np.where(fin, np.abs(got - ref), -1.0)
        i = int(np.argmax(diff))
        worst = (i, float(ref[i]), float(got[i]))
    return err <= bound, "", err, worst


# ------------------------------------------------------------------ describing a case
def _tensor_desc(t: Tensor) -> str:
    s = f"{traits(t.type).name} ne={_list(t.ne)} nb={_list(t.nb)}"
    if t.view_src is not None:
        s += f" view+{t.view_offs}"
    return s


def _list(xs: Any) -> str:
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def describe_node(node: Tensor) -> str:
    """The node's sources (type, ne, nb strides, view offset), params and result."""
    parts = [f"src{i}: " + ("None" if s is None else _tensor_desc(s)) for i, s in enumerate(node.src)]
    if node.params:
        parts.append("params: " + ", ".join(f"{k}={_param(v)}" for k, v in node.params.items()))
    parts.append("out: " + _tensor_desc(node))
    return "; ".join(parts)


def _param(v: Any) -> str:
    return v.name if hasattr(v, "name") and not isinstance(v, (int, float)) else repr(v)


def _ggml_index(flat: int, ne: tuple[int, ...]) -> tuple[int, ...]:
    """A flat index into the NumPy-order values of a tensor of extents ``ne`` -> (i0, i1, i2, i3)."""
    return tuple(int(x) for x in reversed(np.unravel_index(flat, tuple(reversed(ne)))))


# ------------------------------------------------------------------ fault checks
class _Snapshot:
    """What a kernel must not change: every tensor's metadata and storage identity, and the
    bytes of every buffer no computed node writes (the case's inputs)."""

    def __init__(self, ctx: Context, graph: Graph, built: Built) -> None:
        self.meta = {id(t): (t, _meta(t)) for t in ctx.tensors}
        for t in ctx.tensors:
            t.storage()  # allocate now, so that a replaced buffer is told from a lazy first allocation
        self.storage = {id(t): (t, t._storage) for t in ctx.tensors if t.view_src is None}
        written = {id(n.base) for n in graph.nodes if n.opdef is not None and not n.opdef.view_only}
        written |= {id(t.base) for t in built.extra}
        self.inputs = {id(t): (t, t._storage.copy()) for t in ctx.tensors
                       if t.view_src is None and id(t) not in written}

    def problems(self) -> str:
        for t, m in self.meta.values():
            now = _meta(t)
            if now != m:
                what = [f"{k} {a!r} -> {b!r}" for k, a, b in zip(_META_FIELDS, m, now) if a != b]
                return f"changed the metadata of {t.label}: {', '.join(what)}"
        for t, buf in self.storage.values():
            if t._storage is not buf:
                new = t._storage
                got = (f"{type(new).__name__} {getattr(new, 'dtype', '')} shape {getattr(new, 'shape', '?')}"
                       if new is not None else "None")
                return (f"replaced the memory of {t.label} ({buf.nbytes} bytes) with a new {got}; "
                        "kernels must write into node.host() in place")
        for t, before in self.inputs.values():
            if not np.array_equal(t._storage, before):
                return f"wrote into its input {t.label}, which no node of the case outputs to"
        return ""


_META_FIELDS = ("type", "ne", "nb", "view_offs", "view_src", "op", "src")


def _meta(t: Tensor) -> tuple:
    return (t.type, tuple(t.ne), tuple(t.nb), t.view_offs, id(t.view_src), t.op, tuple(id(s) for s in t.src))


# ------------------------------------------------------------------ worker threads with a timeout
class _Timeout(Exception):
    pass


class _Worker:
    """One daemon thread that runs jobs in turn. A job that overruns its timeout leaves the
    thread stuck; the caller abandons it and starts a new worker."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="prism-conformance-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:  # abandoned: exit once the stuck job (if it ever does) returns
                return
            fn, box, done = job
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - SystemExit from a kernel fails the case, not the host
                box.append((False, e))
            done.set()

    def run(self, fn: Callable[[], Any], timeout: float) -> Any:
        box: list = []
        done = threading.Event()
        self.jobs.put((fn, box, done))
        if not done.wait(timeout):
            raise _Timeout
        ok, value = box[0]
        if ok:
            return value
        raise value


_LOCAL = threading.local()  # each calling thread has its own worker
_ABANDONED: list[_Worker] = []


def run_isolated(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()`` on the calling thread's conformance worker, raising :class:`TimeoutError`
    after ``timeout`` seconds (the stuck worker is abandoned). No timeout: in this thread."""
    if not timeout:
        return fn()
    worker = getattr(_LOCAL, "worker", None)
    if worker is None:
        worker = _LOCAL.worker = _Worker()
    try:
        return worker.run(fn, timeout)
    except _Timeout:
        _LOCAL.worker = None  # abandoned: it may never come back; the next case gets a new one
        worker.jobs.put(None)  # ... and it exits if the stuck job ever returns
        _ABANDONED.append(worker)
        raise TimeoutError(f"did not finish within {timeout:g} s") from None


def abandoned_threads() -> list[threading.Thread]:
    """Worker threads left running by cases that timed out (daemons: they never block exit)."""
    _ABANDONED[:] = [w for w in _ABANDONED if w.thread.is_alive()]
    return [w.thread for w in _ABANDONED]


# ------------------------------------------------------------------ running one case
def _build(case: Case, guard: int) -> tuple[Context, Graph, Built]:
    ctx = Context(guard_bytes=guard)
    built = case.build(ctx, np.random.default_rng(case.seed))
    built.out.set_output()
    return ctx, Graph().expand(built.out), built


def case_detail(case: Any) -> str:
    """The tensors of a forward case as run_case describes them ("" for other cases), for a
    case whose run ended without a result (its worker crashed or was killed)."""
    if not isinstance(case, Case):
        return ""
    try:
        _, _, built = _build(case, 0)
    except Exception:  # noqa: BLE001 - a description is optional
        return ""
    out = built.out
    return describe_node(out) if out.opdef is not None and not out.opdef.view_only else ""


def _outputs(built: Built) -> list[np.ndarray]:
    return [t.numpy() for t in (built.out, *built.extra)]


def _crash(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"raised {type(e).__name__}: {e}{where}"


def unsupported_message(backend: Backend, missing: list) -> str:
    """"does not support KEYS", with the backend's reason for the first refused node."""
    keys = ", ".join(sorted({n.opdef.key for n in missing}))
    why = backend_reason(backend, missing[0])
    return f"does not support {keys}" + (f": {why}" if why else "")


def _refusal(case: Case, backend: Backend, graph: Graph, detail: str) -> CaseResult | None:
    """UNSUPPORTED when the backend refuses a node of the case (FAIL when supports() raises),
    None when it claims them all."""
    try:
        missing = [n for n in graph.nodes if not computes_nothing(n) and not backend.supports(n)]
    except Exception as e:  # noqa: BLE001 - a crashing supports() fails the case
        return CaseResult(case, backend.name, FAIL, f"supports() {_crash(e)}", detail=detail)
    if missing:
        return CaseResult(case, backend.name, UNSUPPORTED, unsupported_message(backend, missing), detail=detail)
    return None


def refusal(case: Any, backend: Backend) -> CaseResult | None:
    """The result of a forward case the backend does not claim (see _refusal), without
    computing anything; None when it claims the case (or for gradient cases). Cases that are
    not run after a crash or a hang of their op are still reported unsupported when they are."""
    if not isinstance(case, Case):
        return None
    try:
        _, graph, built = _build(case, 0)
    except Exception:  # noqa: BLE001 - the run itself reports a case that cannot be built
        return None
    out = built.out
    return _refusal(case, backend, graph, describe_node(out) if out.opdef is not None and not out.opdef.view_only
                    else "")


@contextlib.contextmanager
def quiet_reference() -> Iterator[None]:
    """The reference's own warnings (a NumPy RuntimeWarning on an edge case, say) are dropped:
    a conformance run shows only what the backend under test does. NumPy's error state is per
    thread; the warning filters are the process's, and the plugin's kernels run after this."""
    with warnings.catch_warnings(record=True), np.errstate(all="ignore"):
        warnings.simplefilter("always")
        yield


def run_case(case: Case, backend: Backend, reference: Backend | None = None, *,
             timeout: float | None = DEFAULT_TIMEOUT) -> CaseResult:
    reference = reference or REGISTRY.reference()
    name = backend.name
    _, ref_graph, ref_built = _build(case, 0)
    with quiet_reference():
        compute(ref_graph, reference, strict=True)
    expected = _outputs(ref_built)

    ctx, graph, built = _build(case, GUARD_BYTES)
    detail = describe_node(built.out) if built.out.opdef is not None and not built.out.opdef.view_only else ""
    refused = _refusal(case, backend, graph, detail)
    if refused is not None:
        return refused
    snap = _Snapshot(ctx, graph, built)
    try:
        run_isolated(lambda: plan(graph, backend, strict=True, reuse=False).compute(), timeout)
    except TimeoutError as e:
        return CaseResult(case, name, TIMEOUT, f"{e}; the kernel is still running in an abandoned thread "
                          "(a hung kernel cannot be stopped in-process)", detail=detail)
    except Unsupported as e:
        return CaseResult(case, name, FAIL, f"claimed support, then raised Unsupported: {e}", detail=detail)
    except BaseException as e:  # noqa: BLE001 - a kernel's crash is a failure of that case, not of the suite
        if isinstance(e, KeyboardInterrupt):
            raise
        return CaseResult(case, name, FAIL, _crash(e), detail=detail)
    problem = snap.problems()
    if problem:
        return CaseResult(case, name, FAIL, problem, detail=detail)
    smashed = ctx.check_guards()
    if smashed:
        return CaseResult(case, name, FAIL, "wrote outside its output: guard bytes changed after "
                          + ", ".join(t.label for t in smashed), detail=detail)
    d = built.out.opdef
    worst_err, worst_el, worst_ulp, exact = 0.0, None, None, True
    for i, (t, got, ref) in enumerate(zip((built.out, *built.extra), _outputs(built), expected)):
        what = "output" if i == 0 else f"extra output {i}"
        v = judge(built.out, t, got, ref)
        if not v.ok:
            text = f"{what} {v.message}" if v.message.startswith("exceeds") else f"{what}: {v.message}"
            return CaseResult(case, name, FAIL, text, v.err, v.bound, v.worst, detail,
                              ulp=v.ulp, exact=False)
        exact &= v.exact
        if v.ulp is not None and (worst_ulp is None or v.ulp > worst_ulp):
            worst_ulp = v.ulp
        if v.err is not None and v.err >= worst_err:
            worst_err, worst_el = v.err, v.worst
    return CaseResult(case, name, PASS, "", worst_err, d.nmse if d else 0.0, worst_el, detail, ulp=worst_ulp,
                      exact=exact)


@dataclass
class Verdict:
    """One output of a node against the reference's: within the op's bounds or not, why, NMSE against
    its bound, the worst element (ggml index, expected, got), its error in ulp, bit-equality."""

    ok: bool
    message: str
    err: float | None
    bound: float
    worst: tuple | None
    ulp: float | None
    exact: bool


def judge(node: Tensor, t: Tensor, got: np.ndarray, ref: np.ndarray) -> Verdict:
    """Output ``t`` of ``node`` (``got``) against the reference's values ``ref``: the op's NMSE bound, then
    its per-element bound in ulp (:mod:`.accuracy`), as every conformance case is judged."""
    d = node.opdef
    bound = d.nmse if d else 0.0
    ok, msg, err, worst = compare(got, ref, bound)
    if worst is not None:
        worst = (_ggml_index(worst[0], t.ne), worst[1], worst[2])
    if not ok:
        text = msg or "exceeds the bound"
        if not msg and not np.any(got) and np.any(ref):
            text += " (left all zeros: a kernel writes into node.host(); a returned value is ignored)"
        return Verdict(False, text, err, bound, worst, None, False)
    exact = bool(np.array_equal(np.asarray(got).view(np.uint8), np.asarray(ref).view(np.uint8))
                 if np.asarray(got).dtype == np.asarray(ref).dtype else np.array_equal(got, ref, equal_nan=True))
    ulps = ulp_errors(got, ref, t.type)
    worst_ulp = None
    if ulps.size and d is not None:
        j = int(np.argmax(ulps))
        el_bound = element_bound(d, t.type, reads_block_types(node))
        if el_bound is not None and ulps[j] > el_bound:
            g, r = np.asarray(got, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
            return Verdict(False, f"element {_index(_ggml_index(j, t.ne))} is {ulps[j]:.3g} ulp off (bound "
                           f"{el_bound:g} ulp for {d.key} on {t.traits.name}; NMSE passed)", err, bound,
                           (_ggml_index(j, t.ne), float(r[j]), float(g[j])), float(ulps[j]), False)
        if el_bound is not None:
            worst_ulp = float(ulps[j])
    return Verdict(True, "", err, bound, worst, worst_ulp, exact)


def run_grad(backend: Backend, cases: list, *, timeout: float | None = DEFAULT_TIMEOUT,
             progress: Callable[[CaseResult], None] | None = None,
             deadline: float | None = None) -> list[CaseResult]:
    """Gradient mode (see :mod:`.gradcheck`) with the same isolation: each case in the
    worker thread with a timeout."""
    REGISTRY.reference()  # the reference must exist, as in forward mode
    return _run_all(backend, cases, lambda c: _grad_case(c, backend, timeout), progress, deadline)


def _grad_case(case: Any, backend: Backend, timeout: float | None) -> CaseResult:
    from .gradcheck import run_grad_case
    try:
        return run_isolated(lambda: run_grad_case(case, backend), timeout)
    except TimeoutError as e:
        return CaseResult(case, backend.name, TIMEOUT, f"{e}; the kernel is still running in an abandoned thread "
                          "(a hung kernel cannot be stopped in-process)")
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return CaseResult(case, backend.name, FAIL, _crash(e))


def _run_all(backend: Backend, cases: list, one: Callable[[Any], CaseResult],
             progress: Callable[[CaseResult], None] | None, deadline: float | None = None) -> list[CaseResult]:
    hung: dict[str, str] = {}
    results = []
    for c in cases:
        if c.key in hung:
            r = refusal(c, backend) or CaseResult(c, backend.name, TIMEOUT,
                                                  f"not run: {hung[c.key]} timed out on this backend")
        elif deadline is not None and time.monotonic() >= deadline:
            r = CaseResult(c, backend.name, NOT_RUN, "not run: the overall budget ran out")
        else:
            r = one(c)
            if r.status == TIMEOUT:
                hung[c.key] = f"an earlier case of {c.key} ({c.desc})"
        results.append(r)
        if progress is not None:
            progress(r)
    return results


def run(backend: Backend, cases: list[Case], *, timeout: float | None = DEFAULT_TIMEOUT,
        progress: Callable[[CaseResult], None] | None = None, deadline: float | None = None) -> list[CaseResult]:
    """Every case on ``backend``, in this process; after a case times out, the remaining cases
    of that op are reported TIMEOUT without running (the hung kernel is still busy). Cases
    that would start after ``deadline`` (a ``time.monotonic()`` value) are reported NOT_RUN."""
    reference = REGISTRY.reference()
    return _run_all(backend, cases, lambda c: run_case(c, backend, reference, timeout=timeout), progress, deadline)
