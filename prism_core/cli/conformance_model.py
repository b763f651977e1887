"""``prism conformance --model MODEL``: certify backends on a real model (prism_core.conformance.model_cert)."""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import InvalidArgument


def _refuse_op_suite_options(args: argparse.Namespace) -> None:
    given = [f for f, v in (("--op", args.op), ("--random", args.random), ("--require", args.require),
                            ("--require-all", args.require_all),
                            ("--budget", args.budget), ("--timeout", args.timeout), ("--in-process", args.in_process),
                            ("--mode grad", args.mode == "grad")) if v]
    if given:
        raise InvalidArgument(f"{', '.join(given)}: options of the op suite, not of --model")


def cmd_model_conformance(args: argparse.Namespace) -> int:
    from ..conformance import model_cert as mc
    from ..conformance.reference_cache import default_dir
    from ..models import certify
    from ..plugin.registry import REGISTRY, backend, backends
    _refuse_op_suite_options(args)
    caches = [c.strip() for a in args.cache_type or [] for c in a.split(",") if c.strip()]
    ref_dir = args.reference_cache
    s = certify.setup(args.model, prompts=args.prompts or mc.DEFAULT_PROMPTS, tokens=args.tokens or mc.DEFAULT_TOKENS,
                      cache_types=caches or mc.CACHE_TYPES,
                      reference_dir=None if ref_dir == "none" else (ref_dir or default_dir()))
    reference = REGISTRY.reference()
    if not args.backend or "all" in args.backend:
        infos = backends()
        for i in infos:
            if not i.available:
                print(f"skipping {i.name}: unavailable ({i.reason})")
        names = [i.name for i in infos if i.available and i.name != reference.name]
        print(f"{reference.name} is the reference the others are checked against (name it with --backend to "
              "certify it against itself)")
    else:
        names = list(dict.fromkeys(backend(n).name for n in args.backend))
    if not names:
        raise InvalidArgument(f"no backend to certify besides the reference (--backend {reference.name} certifies "
                              "it against itself)")
    model = os.path.basename(s.path)
    print(f"certifying {', '.join(names)} on {model}: {len(s.prompts)} prompts x {len(s.cache_types)} cache types "
          f"({', '.join(s.cache_types)}), {s.tokens} greedy tokens each; reference: {reference.name} (activation "
          f"precision {reference.activation_precision}; "
          f"{'logits kept in ' + str(s.reference_dir) if s.reference_dir else 'logits not kept'})", flush=True)
    return _run(args, s, names, reference, model)


def _run(args: argparse.Namespace, s, names: list[str], reference, model: str) -> int:
    from .. import progress
    from ..conformance import model_cert as mc
    from ..conformance.model_report import prompt_row, table, verdict
    from ..models import certify
    from ..plugin.registry import backend
    from ..progress_bars import ProgressBars
    total = len(names) * len(s.prompts) * len(s.cache_types)
    done = 0
    certifier = certify.Certifier(s, reference)
    results: dict[str, mc.BackendResult] = {}

    def got(p: mc.PromptResult) -> None:
        nonlocal done
        done += 1
        progress.report("model conformance", done, total, unit="prompts", detail=f"{p.backend} {p.cache}")
        if not args.quiet:
            from tqdm import tqdm
            tqdm.write(prompt_row(p), file=sys.stdout)
            sys.stdout.flush()
    interrupted = False
    try:
        with ProgressBars(sys.stderr):
            for name in names:
                results[name] = certify.certify(s, backend(name), reference, certifier=certifier, on_prompt=got,
                                           sweep=args.sweep)
                certifier.close()
    except KeyboardInterrupt:
        interrupted = True
    print()
    text = table(results, s.cache_types) if results else ""
    if text and not args.quiet:
        print(text)
        print()
    if args.report and results:
        _write_reports(args.report, results, s, reference, model, text)
    n_ref = certifier.refs.computed
    print(f"reference: {n_ref} token sequences computed by {reference.name}"
          + (f", the rest read from {s.reference_dir}" if s.reference_dir else ""))
    certified = bool(results)
    for r in results.values():
        ok, line = verdict(r, model)
        certified &= ok
        print(line)
    if interrupted:
        print("incomplete run: interrupted")
        return 130
    return 0 if certified else 1


def _write_reports(reports: list, results: dict, s, reference, model: str, text: str) -> None:
    from ..conformance.model_report import certificate, to_markdown
    from ..conformance.reference_cache import file_digest
    from ..conformance.report import to_json
    from ..errors import PrismError
    cert = certificate(results, model=model, model_sha256=file_digest(s.path), reference=reference.name,
                       prompts=s.prompts, cache_types=s.cache_types, tokens=s.tokens)
    for fmt, path in reports:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(to_json(cert) if fmt == "json" else to_markdown(cert, text))
        except OSError as e:
            raise PrismError(f"cannot write the {fmt} report to {path}: {e}") from None
        print(f"wrote {fmt} report to {path}")
