"""``prism conformance``: run the suite on backends and print the op-by-backend table."""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import InvalidArgument, PrismError
from .args import budget_arg, int_at_least, jobs_arg, timeout_arg


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("conformance", help="run the conformance suite and print the op-by-backend table")
    c.add_argument("--backend", action="append", metavar="NAME", help="backend name or 'all' (default: all)")
    c.add_argument("--op", action="append", metavar="OP", help="only this op key (repeatable)")
    c.add_argument("--mode", default="forward", choices=["forward", "grad"],
                   help="forward: values against the reference; grad: gradients against finite differences")
    c.add_argument("--report", nargs=2, action="append", metavar=("FORMAT", "FILE"),
                   help="also write the support table as FORMAT (json or markdown) to FILE (repeatable)")
    c.add_argument("--random", type=int_at_least(1), metavar="N", default=None,
                   help="instead of the fixed cases, N random cases per op (elementwise, matmul, softmax, "
                        "norm families): random shapes, types, strides/layouts and params")
    c.add_argument("--seed", type=int_at_least(0), default=0, metavar="S", help="seed of --random (default 0); "
                   "the same seed draws the same cases")
    c.add_argument("--timeout", type=timeout_arg, action="append", default=None, metavar="[BACKEND=]SECONDS",
                   help="per-case limit (default 120; 0: none); a case over it is reported TIMEOUT, its worker "
                        "is killed and a new one resumes after that op's cases. BACKEND=SECONDS sets it for "
                        "that backend only (repeatable), e.g. a short limit for one suspected of hanging")
    c.add_argument("--budget", type=budget_arg, default=None, metavar="SECONDS",
                   help="overall limit of the run; when it runs out the workers are stopped and the cases "
                        "left are reported NOT RUN (the results so far are printed and reported)")
    c.add_argument("--jobs", "-j", type=jobs_arg, default=1, metavar="N",
                   help="worker processes at once (default 1; 'auto': one per core); each backend's cases "
                        "are split into batches at op boundaries")
    c.add_argument("--in-process", action="store_true",
                   help="run the backends in this process (worker threads with the per-case timeout; 0: the "
                        "calling thread), for debugging a kernel: a crash or a GIL-holding hang ends the run")
    c.add_argument("--require", action="append", metavar="OP[,OP...]",
                   help="exit 1 unless every case of these ops passed on each backend (an unsupported "
                        "case fails the requirement; repeatable)")
    c.add_argument("--require-all", action="store_true",
                   help="require every op of the run that the backend computes itself (view ops are "
                        "computed by the core and excluded)")
    c.add_argument("-q", "--quiet", action="store_true", help="print only the summary line per backend")
    c.add_argument("-v", "--verbose", action="store_true",
                   help="also list every unsupported case with the backend's reason and its replay command")
    c.add_argument("--case", action="append", metavar="ID",
                   help="re-run exactly this case (its id from a report's replay line) on --backend NAME, "
                        "in this process, printing its inputs, the expected and the actual output")
    m = c.add_argument_group("model certification (--model)")
    m.add_argument("--model", metavar="MODEL",
                   help="certify the backends on this model (a GGUF path or a catalog name such as "
                        "gemma3-270m) against the reference: teacher-forced logits, decode vs batch, greedy "
                        "tokens, for each KV cache type; instead of the op suite")
    m.add_argument("--prompts", type=int_at_least(1), default=None, metavar="N",
                   help="the first N built-in prompts (default 3, at most 8)")
    m.add_argument("--tokens", type=int_at_least(1), default=None, metavar="N",
                   help="greedy tokens generated per prompt (default 4)")
    m.add_argument("--cache-type", action="append", metavar="TYPE[,TYPE...]",
                   help="KV cache types to certify (f16, f32, q8_0; default all three)")
    m.add_argument("--reference-cache", metavar="DIR",
                   help="where the reference's logits are kept between runs (default: $PRISM_CACHE_DIR or "
                        "~/.cache/prism, reference-logits/; 'none': not kept)")
    m.add_argument("--no-sweep", dest="sweep", action="store_false",
                   help="skip the node-by-node sweep when every check passed (it runs on the first prompt "
                        "otherwise, and always on a failure)")
    c.set_defaults(func=cmd_conformance)


def cmd_conformance(args: argparse.Namespace) -> int:
    from ..conformance.report import certificate, summary, table, to_json, to_markdown, verdict
    from ..conformance.runner import DEFAULT_TIMEOUT, NOT_RUN, CaseResult, run, run_grad
    from ..conformance.workers import Suite, in_process_only, run_suite
    from ..ops.table import OPS, opdef
    from ..plugin.registry import REGISTRY, backend, backends
    from .info import print_broken_plugins
    if args.case:
        return _replay(args)
    if args.model is not None:
        from .conformance_model import cmd_model_conformance
        return cmd_model_conformance(args)
    model_only = [f for f, v in (("--prompts", args.prompts), ("--tokens", args.tokens),
                                 ("--cache-type", args.cache_type), ("--reference-cache", args.reference_cache),
                                 ("--no-sweep", not args.sweep)) if v]
    if model_only:
        raise InvalidArgument(f"{', '.join(model_only)} certify a model: give --model MODEL with them")
    ops = [opdef(o).key for o in args.op] if args.op else list(OPS)
    require = [opdef(o.strip()).key for r in args.require or [] for o in r.split(",") if o.strip()]
    if args.mode == "grad":
        ops = [k for k in ops if OPS[k].differentiable]
    if args.random is not None and args.mode == "grad":
        raise InvalidArgument("--random draws forward cases only; use it without --mode grad")
    if not args.backend or "all" in args.backend:
        infos = {i.name: i for i in backends()}
        names = [n for n, i in infos.items() if i.available]
        for i in infos.values():
            if not i.available:
                print(f"skipping {i.name}: unavailable ({i.reason})")
    else:
        names = list(dict.fromkeys(backend(n).name for n in args.backend))  # selecting asks only these
    if not args.backend or "all" in args.backend or any(REGISTRY.info(n).installed for n in names):
        # the third-party plugins were probed: say which ones failed
        print_broken_plugins()
    if args.random is not None:
        from ..conformance.random_cases import RANDOM
        skipped = [k for k in ops if k not in RANDOM]
        if args.op and skipped:
            print(f"no random cases for {', '.join(skipped)} (random cases cover the elementwise, "
                  "MUL_MAT, SOFT_MAX and norm families)")
        ops = [k for k in ops if k in RANDOM]
    suite = Suite(mode=args.mode, ops=tuple(ops), random=args.random, seed=args.seed)
    cases = suite.cases()
    timeout, timeouts = _timeouts(args.timeout or [], names, DEFAULT_TIMEOUT)
    deadline = time.monotonic() + args.budget if args.budget else None
    local = names if args.in_process else in_process_only(names)
    for n in local if not args.in_process else ():
        print(f"running {n} in this process: its plugin was registered in-process in a form a worker "
              "process cannot load, so a crash there ends the run")

    def event(text: str) -> None:
        print(f"prism: {text}", file=sys.stderr, flush=True)
    stream = _Stream(cases, len(names), rows=not args.quiet)
    with stream:
        outcome = run_suite([n for n in names if n not in local], suite, timeout=timeout, timeouts=timeouts,
                            budget=args.budget,
                            jobs=args.jobs, on_event=event, cases=cases, on_result=stream)
    interrupted, out_of_budget = outcome.interrupted, outcome.out_of_budget
    results = {}
    for name in names:
        if name not in local:
            results[name] = outcome.results[name]
            continue
        done: list[CaseResult] = []

        def got(r: CaseResult, name: str = name, done: list[CaseResult] = done) -> None:
            done.append(r)
            stream(name, r)
        if not interrupted:
            try:
                runner = run_grad if args.mode == "grad" else run
                with stream:
                    runner(backend(name), cases, timeout=timeouts.get(name, timeout), progress=got,
                           deadline=deadline)
            except KeyboardInterrupt:
                interrupted = True
        why = "not run: interrupted" if interrupted else "not run: the overall budget ran out"
        results[name] = done + [CaseResult(c, name, NOT_RUN, why) for c in cases[len(done):]]
        out_of_budget |= any(r.status == NOT_RUN for r in done)
    if stream.printed:
        print()
    if args.quiet:
        for name, rs in results.items():
            print(summary(name, rs))
    else:
        print(table(results, ops, verbose=args.verbose))
    incomplete = ("interrupted" if interrupted else
                  f"the overall budget of {args.budget:g} s ran out" if out_of_budget else "")
    if incomplete:
        print(f"incomplete run: {incomplete}; cases that did not run are reported NOT RUN")
    if args.report:
        meta = {}
        for name in names:
            i = REGISTRY.info(name)
            meta[name] = {"version": i.version, "plugin": i.plugin, "interface_version": i.interface_version,
                          "priority": i.priority, "reference": bool(i.backend.is_reference),
                          "timeout_s": timeouts.get(name, timeout)}
        run_info = {"timeout_s": timeout, "budget_s": args.budget, "jobs": args.jobs,
                    "isolation": "in-process" if args.in_process else "process", "complete": not incomplete}
        if incomplete:
            run_info["incomplete_reason"] = incomplete
        if args.random is not None:
            run_info.update(random=args.random, seed=args.seed)
        cert = certificate(results, ops, mode=args.mode, backends=meta, run=run_info)
        for fmt, path in args.report:
            text = to_json(cert) if fmt == "json" else to_markdown(cert)
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as e:
                raise PrismError(f"cannot write the {fmt} report to {path}: {e}") from None
            print(f"wrote {fmt} report to {path}")
    if args.require_all:
        require += [k for k in ops if not OPS[k].view_only and k not in require]
    certified = True
    for name, rs in results.items():
        ok, line = verdict(name, rs, require)
        certified &= ok
        print(line)
    if interrupted:
        return 130
    return 0 if certified else 1


def _timeouts(given: list[tuple[str | None, float]], names: list[str],
              default: float) -> tuple[float | None, dict[str, float | None]]:
    """``--timeout`` values as (the limit of every backend, {backend: its own limit}); 0 is no
    limit (None). The last value for a backend (or for all) wins."""
    every: float | None = default
    own: dict[str, float | None] = {}
    for name, seconds in given:
        if name is None:
            every = seconds or None
            continue
        if name not in names:
            raise InvalidArgument(f"--timeout {name}={seconds:g}: backend {name!r} is not in this run "
                                  f"(running: {', '.join(names)})")
        own[name] = seconds or None
    return every, own


class _Stream:
    """While the suite runs: one row per (backend, op) as that op's last case arrives
    (``op  backend  cell``, on stdout), and a tqdm bar of the cases on stderr when it is a
    terminal (prism_core.progress_bars). Called from the worker threads, one at a time."""

    def __init__(self, cases: list, backends: int, rows: bool) -> None:
        from collections import Counter, defaultdict
        self.expected = Counter(c.key for c in cases)
        self.width = max((len(k) for k in self.expected), default=0)
        self.total = len(cases) * backends
        self.rows = rows
        self.done = 0
        self.printed = False
        self.got: dict[tuple[str, str], list] = defaultdict(list)
        self.bars = None

    def __enter__(self) -> _Stream:
        from ..progress_bars import ProgressBars
        self.bars = ProgressBars(sys.stderr).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bars is not None:
            self.bars.__exit__(*exc)
            self.bars = None

    def __call__(self, name: str, r) -> None:
        from .. import progress
        from ..conformance.report import cell
        key = r.case.key
        got = self.got[name, key]
        got.append(r)
        self.done += 1
        progress.report("conformance", self.done, self.total, unit="cases", detail=f"{name} {key}")
        if self.rows and len(got) == self.expected[key]:
            from tqdm import tqdm
            tqdm.write(f"{key.ljust(self.width)}  {name}  {cell(got)}", file=sys.stdout)
            sys.stdout.flush()
            self.printed = True


def _replay(args: argparse.Namespace) -> int:
    """``--case ID``: exactly that case, in this process, with its inputs and both outputs."""
    from ..conformance.replay import replay
    from ..plugin.registry import backend
    if not args.backend or "all" in args.backend or len(args.backend) != 1:
        raise InvalidArgument("--case replays on one backend: give --backend NAME once")
    if args.op or args.random is not None or args.report:
        raise InvalidArgument("--case names the case itself; it takes no --op, --random or --report")
    be = backend(args.backend[0])
    failed = False
    for cid in args.case:
        text, result = replay(cid, be)
        print(text)
        failed |= result.failed
    return 1 if failed else 0
