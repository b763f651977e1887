"""Stable case ids, and re-running exactly one case.

A case id names one case of the suite independently of which other cases exist or of their
order: ``KEY:xxxxxxxx`` for a fixed forward case (a CRC-32 of its description), ``KEY:g…`` for
a gradient case, ``KEY:r<seed>.<i>`` for random case ``i`` of ``--random N --seed S``.
``prism conformance --backend NAME --case ID`` runs that case alone and prints its inputs,
the expected (reference) and the actual output (:func:`replay`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..plan import plan
from ..plugin.base import Backend
from ..plugin.registry import REGISTRY
from ..schedule import compute
from ..tensor import Tensor
from .cases import Case, case_id
from .runner import CaseResult, _build, describe_node, quiet_reference, run_case

_ID = re.compile(r"^([A-Z0-9_]+):(g?[0-9a-f]{8}|r(\d+)\.(\d+))$")


def find_case(cid: str) -> Any:
    """The case with id ``cid``; InvalidArgument when the id is malformed or names no case."""
    key_part, _, rest = cid.strip().partition(":")
    cid = f"{key_part.upper()}:{rest}"
    m = _ID.match(cid)
    if m is None:
        raise InvalidArgument(f"malformed case id {cid!r}: expected KEY:xxxxxxxx (fixed), KEY:gxxxxxxxx "
                              "(gradient) or KEY:r<seed>.<i> (random), as a report prints it")
    key = m.group(1)
    from ..ops.table import opdef
    key = opdef(key).key
    if m.group(3) is not None:
        from .random_cases import random_cases_for
        seed, i = int(m.group(3)), int(m.group(4))
        cases = random_cases_for(key, i + 1, seed)  # draws depend on the earlier ones: draw them again
        if len(cases) <= i:
            raise InvalidArgument(f"case id {cid!r}: {key} has no random cases")
        return cases[i]
    if m.group(2).startswith("g"):
        from .gradcheck import grad_cases
        pool = grad_cases([key])
    else:
        from .cases import cases_for
        pool = cases_for(key)
    for c in pool:
        if case_id(c) == cid:
            return c
    raise InvalidArgument(f"no case {cid!r}: {key} has {len(pool)} such cases "
                          f"({', '.join(case_id(c) for c in pool[:6])}{', ...' if len(pool) > 6 else ''}); "
                          "ids change only when a case's description does")


def _values(t: Tensor) -> str:
    with np.printoptions(precision=8, threshold=256, linewidth=110):
        try:
            arr = t.numpy()
        except Exception as e:  # noqa: BLE001 - a block type without a host view still gets a line
            return f"<cannot read: {e}>"
        return np.array2string(np.asarray(arr).reshape(tuple(reversed(t.ne))), prefix="    ")


def _describe(t: Tensor) -> str:
    return f"{t.traits.name} ne={list(t.ne)} nb={list(t.nb)}"


def replay(cid: str, backend: Backend) -> tuple[str, CaseResult]:
    """Run case ``cid`` on ``backend`` in this process; the text shows the node, every source
    (type, extents, strides, values), the expected and the actual output, and the verdict."""
    case = find_case(cid)
    if not isinstance(case, Case):  # gradient cases: the verdict is the report
        from .runner import _grad_case
        r = _grad_case(case, backend, None)
        return f"case {cid}: {case.name}\n{r.describe()}\n", r
    reference = REGISTRY.reference()
    lines = [f"case {cid}: {case.name}", f"backend: {backend.name}"]
    _, ref_graph, ref_built = _build(case, 0)
    out = ref_built.out
    lines.append(f"node: {describe_node(out) if out.opdef is not None else out.label}")
    for i, s in enumerate(out.src):
        if s is not None:
            name = out.opdef.srcs[i].name if out.opdef is not None and i < len(out.opdef.srcs) else f"src{i}"
            lines += [f"input {name}: {_describe(s)}", "    " + _values(s)]
    with quiet_reference():
        compute(ref_graph, reference, strict=True)
    lines += [f"expected ({reference.name}): {_describe(out)}", "    " + _values(out)]
    _, graph, built = _build(case, 0)
    try:
        plan(graph, backend, strict=True, reuse=False).compute()
        lines += [f"actual ({backend.name}):", "    " + _values(built.out)]
    except Exception as e:  # noqa: BLE001 - the verdict below says what happened
        lines.append(f"actual ({backend.name}): raised {type(e).__name__}: {e}")
    r = run_case(case, backend, reference, timeout=None)
    lines.append(f"verdict: {r.describe()}")
    return "\n".join(lines) + "\n", r
