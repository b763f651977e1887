"""The op-by-backend table printed by ``prism conformance``."""

from __future__ import annotations

from collections import Counter, defaultdict

from .runner import FAIL, PASS, UNSUPPORTED, CaseResult


def cell(results: list[CaseResult]) -> str:
    c = Counter(r.status for r in results)
    n = len(results)
    if c[FAIL]:
        return f"FAIL {c[FAIL]}/{n}"
    if c[UNSUPPORTED] == n:
        return "unsupported"
    if c[UNSUPPORTED]:
        return f"ok {c[PASS]}/{n}, {c[UNSUPPORTED]} unsup"
    return f"ok {n}/{n}"


def table(results: dict[str, list[CaseResult]], ops: list[str]) -> str:
    """``results`` maps backend name -> its case results (in op order)."""
    names = list(results)
    by = {b: defaultdict(list) for b in names}
    for b, rs in results.items():
        for r in rs:
            by[b][r.case.key].append(r)
    rows = [["op", *names]]
    for op in ops:
        rows.append([op, *(cell(by[b][op]) if by[b][op] else "no cases" for b in names)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for b in names:
        c = Counter(r.status for r in results[b])
        ops_c = Counter(cell(v).split()[0] for v in by[b].values())
        lines.append(f"{b}: {c[PASS]} passed, {c[FAIL]} failed, {c[UNSUPPORTED]} unsupported cases "
                     f"({ops_c['ok']} ops ok, {ops_c['FAIL']} failing, {ops_c['unsupported']} unsupported)")
    failures = [r for rs in results.values() for r in rs if r.status == FAIL]
    if failures:
        lines += ["", "Failures:"] + [f"  {r.describe()}" for r in failures]
    return "\n".join(lines)
