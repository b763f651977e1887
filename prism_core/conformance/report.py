"""What ``prism conformance`` prints and publishes.

:func:`table` is the op-by-backend table with a summary line per backend and every
failure spelled out; :func:`certificate` is the same run as a JSON-ready support table
(:func:`to_json`, :func:`to_markdown`) for a backend to publish.
"""

from __future__ import annotations

import json
import platform
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

from .accuracy import grade, worst_grade
from .runner import CRASHED, FAIL, FAILED, NOT_RUN, PASS, TIMEOUT, UNSUPPORTED, CaseResult

REPORT_FORMAT = 1  # bumped when the JSON layout changes incompatibly


def _bad(c: Counter) -> int:
    return sum(c[s] for s in FAILED)


def cell(results: list[CaseResult]) -> str:
    c = Counter(r.status for r in results)
    n = len(results)
    bad = _bad(c)
    if bad:
        why = [f"{c[s]} {word}" for s, word in ((TIMEOUT, "timeout"), (CRASHED, "crashed"), (NOT_RUN, "not run"))
               if c[s]]
        return f"FAIL {bad}/{n}" + (f" ({', '.join(why)})" if why else "")
    if c[UNSUPPORTED] == n:
        return "unsupported"
    word = "core" if _is_view(results[0].case.key) else "ok"
    if c[UNSUPPORTED]:
        return f"{word} {c[PASS]}/{n}, {c[UNSUPPORTED]} unsup"
    return f"{word} {n}/{n}"


def _is_view(key: str) -> bool:
    from ..ops.table import OPS
    d = OPS.get(key)
    return bool(d is not None and d.view_only)


def op_status(results: list[CaseResult]) -> str:
    """One word per op: ok (every case passed), partial (passed some, the rest unsupported),
    core (a view op: the core computes it, so it passes on any backend and certifies nothing
    about this one), fail (any case failed, timed out, crashed or was not run), unsupported
    (no case supported), no cases."""
    if not results:
        return "no cases"
    c = Counter(r.status for r in results)
    if _bad(c):
        return "fail"
    if c[UNSUPPORTED] == len(results):
        return "unsupported"
    if _is_view(results[0].case.key):
        return "core"
    return "partial" if c[UNSUPPORTED] else "ok"


def verdict(name: str, results: list[CaseResult], require: list[str] | None = None) -> tuple[bool, str]:
    """The one line a CI log greps: ``certified: 86 cases on 5 ops; 1754 unsupported (NAME)``,
    or ``NOT certified: <why> (NAME)``. A backend is certified when no case failed, at least one
    case of an op it computes itself passed (view ops, computed by the core, do not count) and
    every op of ``require`` has cases and passed all of them."""
    by = _by_op(results)
    c = Counter(r.status for r in results)
    own = {op: rs for op, rs in by.items() if not _is_view(op)}
    passed_ops = [op for op, rs in own.items() if any(r.status == PASS for r in rs)]
    passed = sum(1 for rs in own.values() for r in rs if r.status == PASS)
    why = []
    bad = _bad(c)
    if bad:
        why.append(f"{bad} failing cases on {sum(1 for rs in by.values() if _bad(Counter(r.status for r in rs)))} ops")
    for op in require or []:
        rs = by.get(op, [])
        oc = Counter(r.status for r in rs)
        if not rs:
            why.append(f"required op {op} has no cases in this run")
        elif oc[UNSUPPORTED] or _bad(oc):
            why.append(f"required op {op}: {oc[UNSUPPORTED]} unsupported, {_bad(oc)} failing of {len(rs)} cases")
    if not passed:
        why.append("no case passed on an op the backend computes itself")
    if why:
        return False, f"NOT certified: {'; '.join(why)} ({name})"
    return True, f"certified: {passed} cases on {len(passed_ops)} ops; {c[UNSUPPORTED]} unsupported ({name})"


def _by_op(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    by: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by[r.case.key].append(r)
    return by


def op_grade(results: list[CaseResult]) -> str | None:
    """The accuracy grade of one op's passed cases (see .accuracy): exact, within 4 ulp, or
    within the bound; None when none passed."""
    return worst_grade([grade(r.exact, r.ulp) for r in results if r.status == PASS])


def summary(name: str, results: list[CaseResult]) -> str:
    """``name: P passed, F failed, U unsupported cases, T timed out[, C crashed][, N not run]
    (ops ...)``."""
    c = Counter(r.status for r in results)
    ops_c = Counter(op_status(v) for v in _by_op(results).values())
    more = "".join(f", {c[s]} {s}" for s in (CRASHED, NOT_RUN) if c[s])
    return (f"{name}: {c[PASS]} passed, {c[FAIL]} failed, {c[UNSUPPORTED]} unsupported cases, "
            f"{c[TIMEOUT]} timed out{more} ({ops_c['ok']} ops ok, {ops_c['partial']} partial, "
            f"{ops_c['fail']} failing, {ops_c['unsupported']} unsupported, {ops_c['core']} core views)")


def table(results: dict[str, list[CaseResult]], ops: list[str], verbose: bool = False) -> str:
    """``results`` maps backend name -> its case results (in op order); ``verbose`` adds every
    unsupported case with the backend's reason and its replay command."""
    names = list(results)
    by = {b: _by_op(rs) for b, rs in results.items()}
    rows = [["op", *names]]
    for op in ops:
        rows.append([op, *(cell(by[b][op]) if by[b].get(op) else "no cases" for b in names)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [summary(b, results[b]) for b in names]
    failures = [r for rs in results.values() for r in rs if r.failed]
    if failures:
        lines += ["", "Failures:"] + [f"  {r.describe()}" for r in failures]
    if verbose:
        lines += ["", "Accuracy (worst element of the passed cases, in ulp at the output's scale):"]
        for b in names:
            grades = {op: op_grade(v) for op, v in by[b].items()}
            counts = Counter(g for g in grades.values() if g)
            lines.append(f"  {b}: " + ", ".join(f"{counts[g]} ops {g}" for g in ("exact", "within 4 ulp",
                                                                               "within the bound") if counts[g]))
    unsupported = [r for rs in results.values() for r in rs if r.status == UNSUPPORTED]
    if verbose and unsupported:
        lines += ["", "Unsupported:"] + [f"  {r.describe()}" for r in unsupported]
    elif unsupported:
        lines += ["", f"{len(unsupported)} unsupported cases; -v lists them with the backend's reasons"]
    return "\n".join(lines)


# ------------------------------------------------------------------ certification report
def certificate(results: dict[str, list[CaseResult]], ops: list[str], *, mode: str,
                backends: dict[str, dict[str, Any]] | None = None, run: dict[str, Any] | None = None) -> dict:
    """The run as a JSON-ready dict: prism and plugin-interface versions, mode, and per
    backend its name/version/plugin, summary counts, per-op status and counts, and every
    failure with its case, metric, bound and worst element."""
    from .. import __version__
    from ..plugin.hookspecs import INTERFACE_VERSION
    out: dict[str, Any] = {
        "format": REPORT_FORMAT, "prism_version": __version__, "interface_version": INTERFACE_VERSION,
        "mode": mode, "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(), "platform": platform.platform(), **(run or {}), "backends": [],
    }
    for name, rs in results.items():
        by = _by_op(rs)
        c = Counter(r.status for r in rs)
        entry: dict[str, Any] = {"name": name, **(backends or {}).get(name, {}),
                                 "summary": {"cases": len(rs), "passed": c[PASS], "failed": c[FAIL],
                                             "unsupported": c[UNSUPPORTED], "timeout": c[TIMEOUT],
                                             "crashed": c[CRASHED], "not_run": c[NOT_RUN]},
                                 "ops": {}, "failures": [r.to_dict() for r in rs if r.failed]}
        for op in ops:
            ors = by.get(op, [])
            oc = Counter(r.status for r in ors)
            info: dict[str, Any] = {"status": op_status(ors), "cases": len(ors), "passed": oc[PASS],
                                    "failed": oc[FAIL], "unsupported": oc[UNSUPPORTED], "timeout": oc[TIMEOUT],
                                    "crashed": oc[CRASHED], "not_run": oc[NOT_RUN]}
            g = op_grade(ors)
            if g is not None:
                info["grade"] = g
                ulps = [r.ulp for r in ors if r.status == PASS and r.ulp is not None]
                info["worst_ulp"] = max(ulps) if ulps else None
            reasons = sorted({r.message for r in ors if r.status == UNSUPPORTED})
            if reasons:
                info["unsupported_reasons"] = reasons
            entry["ops"][op] = info
        entry["summary"]["ops"] = dict(Counter(v["status"] for v in entry["ops"].values()))
        out["backends"].append(entry)
    return out


def to_json(cert: dict) -> str:
    return json.dumps(cert, indent=2) + "\n"


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(cert: dict) -> str:
    """The certificate as a Markdown support table (one column per backend) and failure list."""
    lines = [f"# Prism conformance report ({cert['mode']} mode)", "",
             f"prism {cert['prism_version']}, plugin interface {cert['interface_version']}, "
             f"generated {cert['generated']} on Python {cert['python']} ({cert['platform']})"]
    if cert.get("random"):
        lines[-1] += f"; random cases: {cert['random']} per op, seed {cert.get('seed')}"
    if cert.get("complete") is False:
        lines += ["", "**Incomplete run**: " + _md(cert.get("incomplete_reason", "not every case ran"))]
    lines += ["", "| backend | version | plugin | passed | failed | unsupported | timeout | crashed | not run |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for b in cert["backends"]:
        s = b["summary"]
        lines.append(f"| {_md(b['name'])} | {_md(b.get('version', ''))} | {_md(b.get('plugin', ''))} | "
                     f"{s['passed']} | {s['failed']} | {s['unsupported']} | {s['timeout']} | "
                     f"{s.get('crashed', 0)} | {s.get('not_run', 0)} |")
    names = [b["name"] for b in cert["backends"]]
    ops = list(cert["backends"][0]["ops"]) if cert["backends"] else []
    lines += ["", "## Support by op", "", "| op | " + " | ".join(map(_md, names)) + " |",
              "|---|" + "---|" * len(names)]
    for op in ops:
        cells = []
        for b in cert["backends"]:
            o = b["ops"][op]
            if o["status"] in ("ok", "partial", "core"):
                word = "core" if o["status"] == "core" else "ok"
                txt = f"{word} {o['passed']}/{o['cases']}" + (f", {o['unsupported']} unsup" if o["unsupported"] else "")
                txt += f" ({o['grade']})" if o.get("grade") else ""
            elif o["status"] == "fail":
                bad = o["failed"] + o["timeout"] + o.get("crashed", 0) + o.get("not_run", 0)
                txt = f"**FAIL** {bad}/{o['cases']}"
            else:
                txt = o["status"]
            cells.append(txt)
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    fails = [(b["name"], f) for b in cert["backends"] for f in b["failures"]]
    lines += ["", "## Failures", ""]
    if not fails:
        lines.append("None.")
    for name, f in fails:
        metric = ""
        if f["nmse"] is not None:
            metric = f" nmse {f['nmse']:.3g} (bound {f['bound']:.3g})" if isinstance(f["nmse"], float) \
                else f" nmse {f['nmse']} (bound {f['bound']})"
        worst = ""
        if f["worst"] is not None:
            w = f["worst"]
            worst = f"; worst element {w['index']}: expected {w['expected']}, got {w['got']}"
        lines.append(f"- **{_md(name)}** `{_md(f['name'])}`: {f['status'].upper()}{metric}{worst}"
                     + (f": {_md(f['message'])}" if f["message"] else ""))
        if f["detail"]:
            lines.append(f"  - tensors: `{_md(f['detail'])}`")
    return "\n".join(lines) + "\n"
