"""What ``prism conformance --model`` prints: one row per prompt as it finishes, the check-by-backend
table, the bounds each backend was held to, and the verdict line a CI log greps."""

from __future__ import annotations

from .model_cert import BackendResult, Check, PromptResult

KINDS = (("teacher-forced", "teacher-forced logits"), ("batch", "decode vs batch"), ("greedy", "greedy tokens"))


def _check(p: PromptResult, kind: str) -> Check | None:
    return next((c for c in p.checks if c.kind == kind), None)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2g}"


def cell(prompts: list[PromptResult], kind: str) -> str:
    """One check kind over the prompts of one backend and cache type."""
    if not prompts:
        return "not run"
    errors = [p for p in prompts if p.error]
    checks = [c for p in prompts if (c := _check(p, kind)) is not None]
    n, bad = len(prompts), len(errors) + sum(not c.passed for c in checks)
    head = f"FAIL {bad}/{n}" if bad else None
    if kind == "greedy":
        agree, total = sum(c.agree for c in checks), sum(c.total for c in checks)
        text = f"{agree}/{total} tokens" + (f" ({total - agree} near ties)" if agree < total and not bad else "")
        return f"{head} {text}" if head else text
    if not checks:
        return head or "not run"
    if not bad and all(c.exact for c in checks):
        return f"exact {n}/{n}"
    rms = max(c.rms for c in checks)
    worst = max(checks, key=lambda c: c.max_rel)
    unit = " logits" if kind == "batch" else ""
    text = f"rms {_num(rms)}, max {_num(worst.max_rel)} ({_num(worst.max_abs)}{unit})"
    return f"{head or f'ok {n}/{n}'} {text}"


def _sweep_cell(r: BackendResult) -> str:
    if r.sweep_ops is None:
        return "not run"
    if not r.sweep_ops:
        return "ok"
    return "FAIL " + ", ".join(f"{op} x{n}" for op, n in r.sweep_ops.items())


def prompt_row(p: PromptResult) -> str:
    """The line streamed when a prompt's checks are done."""
    label = f"{p.cache:<5} prompt {p.prompt + 1} ({p.n_tokens} tokens)"
    if p.error:
        return f"{label}  {p.backend}  ERROR {p.error}"
    parts = []
    for kind, _ in KINDS:
        c = _check(p, kind)
        if c is None:
            continue
        if kind == "greedy":
            parts.append(f"greedy {c.agree}/{c.total}" + ("" if c.passed else " FAIL"))
        else:
            word = "exact" if c.exact else ("ok" if c.passed else "FAIL")
            parts.append(f"{kind} {word}" + ("" if c.exact else f" rms {_num(c.rms)} max {_num(c.max_abs)}"))
    return f"{label}  {p.backend}  " + "; ".join(parts)


def table(results: dict[str, BackendResult], cache_types: tuple[str, ...]) -> str:
    names = list(results)
    rows = [["check", *names]]
    for cache in cache_types:
        for kind, title in KINDS:
            rows.append([f"{title} ({cache})",
                         *(cell([p for p in results[b].prompts if p.cache == cache], kind) for b in names)])
    rows.append(["node sweep", *(_sweep_cell(results[b]) for b in names)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", "teacher-forced: the batched logits against the reference's, rms error over the reference's "
              "rms and the worst logit's error over its row's rms (in logits); decode vs batch: the same "
              "backend's decoded rows against its batched ones; greedy: tokens equal to the reference's "
              "argmax (a near tie within the bound may differ); node sweep: each node of a batched pass and "
              "a decode step computed from the reference's inputs, judged with its op's bounds", "", "Bounds:"]
    for b, r in results.items():
        lines.append(f"  {b}: {r.bounds.text() if r.bounds else 'none (the model did not load)'}")
    notes = []
    for b, r in results.items():
        for cache in cache_types:
            fb = sorted({op for p in r.prompts if p.cache == cache for op in p.fallbacks})
            if fb:
                notes.append(f"  {b}, {cache} cache: {', '.join(fb)} ran on the reference (not certified here)")
        failures = [f"  {b}, {p.cache} cache, prompt {p.prompt + 1}: "
                    + (p.error or "; ".join(f"{c.kind}: {c.message}" for c in p.checks if not c.passed))
                    for p in r.prompts if not p.passed]
        notes += failures
        if r.sweep:
            notes.append(f"  {b}: {r.sweep}")
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def verdict(r: BackendResult, model: str) -> tuple[bool, str]:
    """``certified on MODEL: 27 checks (3 prompts x 3 cache types); greedy 36/36 tokens (NAME)`` or
    ``NOT certified on MODEL: <why> (NAME)``."""
    checks = [c for p in r.prompts for c in p.checks]
    agree = sum(c.agree for c in checks if c.kind == "greedy")
    total = sum(c.total for c in checks if c.kind == "greedy")
    n_prompts = len({p.prompt for p in r.prompts})
    n_caches = len({p.cache for p in r.prompts})
    if r.passed:
        return True, (f"certified on {model}: {len(checks)} checks ({n_prompts} prompts x {n_caches} cache types); "
                      f"greedy {agree}/{total} tokens ({r.backend})")
    why = []
    errors = [p for p in r.prompts if p.error]
    if errors:
        why.append(f"{len(errors)} runs failed ({errors[0].error})")
    bad = [f"{c.kind} {p.cache}" for p in r.prompts for c in p.checks if not c.passed]
    if bad:
        kinds = sorted(set(bad))
        why.append(f"{len(bad)} failing checks ({', '.join(kinds)})")
    if r.node:
        why.append(f"first node out of bound: {r.node.split(':')[0]}")
    elif r.sweep_ops:
        why.append(r.sweep)
    return False, f"NOT certified on {model}: {'; '.join(why) or 'no checks ran'} ({r.backend})"


def certificate(results: dict[str, BackendResult], *, model: str, model_sha256: str, reference: str,
                prompts: tuple[str, ...], cache_types: tuple[str, ...], tokens: int) -> dict:
    """The run as a JSON-ready dict (``--report json``): the model, the reference, per backend its bounds,
    every prompt's checks with their measurements, the node sweep and the verdict."""
    from dataclasses import asdict

    from .. import __version__
    from .report import REPORT_FORMAT
    out = {"format": REPORT_FORMAT, "prism_version": __version__, "mode": "model", "model": model,
           "model_sha256": model_sha256, "reference": reference, "prompts": list(prompts),
           "cache_types": list(cache_types), "tokens": tokens, "backends": []}
    for name, r in results.items():
        b = r.bounds
        ok, line = verdict(r, model)
        out["backends"].append({
            "name": name, "certified": ok, "verdict": line,
            "bounds": None if b is None else {"precision": b.precision, "unit": b.unit, "products": b.n_products,
                                              "rms": b.rms, "element": b.element, "text": b.text()},
            "prompts": [{"cache": p.cache, "prompt": p.prompt, "tokens": p.n_tokens, "error": p.error,
                         "fallbacks": p.fallbacks, "checks": [asdict(c) for c in p.checks]} for p in r.prompts],
            "sweep": {"ran": r.sweep_ops is not None, "out_of_bounds": r.sweep_ops or {}, "text": r.sweep}})
    return out


def to_markdown(cert: dict, table_text: str) -> str:
    lines = [f"# Prism model conformance: {cert['model']}", "",
             f"prism {cert['prism_version']}; reference {cert['reference']}; model SHA-256 {cert['model_sha256']}; "
             f"{len(cert['prompts'])} prompts x {len(cert['cache_types'])} cache types, {cert['tokens']} greedy "
             "tokens each", "", "```text", table_text, "```", ""]
    lines += [f"- {b['verdict']}" for b in cert["backends"]]
    return "\n".join(lines) + "\n"
