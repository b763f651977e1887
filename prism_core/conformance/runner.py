"""Run conformance cases on a backend and compare with the reference.

The comparison follows ggml's test-backend-ops: NaN where the reference has none
fails; infinities must match in sign; the rest is judged by the normalised mean
squared error ``sum((a - b)^2) / sum(a^2)`` (a = backend under test, b = reference)
against the op's bound from the op table. Outputs live in a context with guard bytes
around every buffer, so a kernel that writes outside its output is caught.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np

from ..backend import Backend
from ..context import Context
from ..errors import Unsupported
from ..graph import Graph
from ..registry import REGISTRY
from ..schedule import compute
from .cases import Built, Case

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
GUARD_BYTES = 64


@dataclass(frozen=True)
class CaseResult:
    case: Case
    backend: str
    status: str
    message: str = ""
    err: float | None = None
    bound: float | None = None
    worst: tuple | None = None  # (index, expected, got)

    def describe(self) -> str:
        s = f"{self.case.name} on {self.backend}: {self.status.upper()}"
        if self.err is not None:
            s += f" nmse={self.err:.3g} (bound {self.bound:.3g})"
        if self.worst is not None:
            s += f"; worst element {self.worst[0]}: expected {self.worst[1]!r}, got {self.worst[2]!r}"
        return s + (f": {self.message}" if self.message else "")


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


def _build(case: Case, guard: int) -> tuple[Context, Graph, Built]:
    ctx = Context(guard_bytes=guard)
    built = case.build(ctx, np.random.default_rng(case.seed))
    built.out.set_output()
    return ctx, Graph().expand(built.out), built


def _outputs(built: Built) -> list[np.ndarray]:
    return [t.numpy() for t in (built.out, *built.extra)]


def run_case(case: Case, backend: Backend, reference: Backend | None = None) -> CaseResult:
    reference = reference or REGISTRY.reference()
    name = backend.name
    _, ref_graph, ref_built = _build(case, 0)
    compute(ref_graph, reference, strict=True)
    expected = _outputs(ref_built)

    ctx, graph, built = _build(case, GUARD_BYTES)
    missing = [n for n in graph.nodes if n.opdef is not None and not n.opdef.view_only and not backend.supports(n)]
    if missing:
        keys = ", ".join(sorted({n.opdef.key for n in missing}))
        return CaseResult(case, name, UNSUPPORTED, f"does not support {keys}")
    try:
        compute(graph, backend, strict=True)
    except Unsupported as e:
        return CaseResult(case, name, FAIL, f"claimed support, then raised Unsupported: {e}")
    except Exception as e:  # noqa: BLE001 - a kernel's crash is a failure of that case, not of the suite
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return CaseResult(case, name, FAIL, f"raised {type(e).__name__}: {e} ({tb.filename}:{tb.lineno})")
    smashed = ctx.check_guards()
    if smashed:
        return CaseResult(case, name, FAIL, "wrote outside its output: guard bytes changed after "
                          + ", ".join(t.label for t in smashed))
    bound = built.out.opdef.nmse if built.out.opdef else 0.0
    worst_err, worst_el = 0.0, None
    for i, (got, ref) in enumerate(zip(_outputs(built), expected)):
        ok, msg, err, worst = compare(got, ref, bound)
        what = "output" if i == 0 else f"extra output {i}"
        if not ok:
            return CaseResult(case, name, FAIL, f"{what}: {msg}" if msg else f"{what} exceeds the bound",
                              err, bound, worst)
        if err is not None and err >= worst_err:
            worst_err, worst_el = err, worst
    return CaseResult(case, name, PASS, "", worst_err, bound, worst_el)


def run(backend: Backend, cases: list[Case]) -> list[CaseResult]:
    reference = REGISTRY.reference()
    return [run_case(c, backend, reference) for c in cases]
