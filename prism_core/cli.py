"""The ``prism`` command: info, ops, conformance, demo, gguf."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from . import __version__
from .errors import PrismError


def cmd_info(args: argparse.Namespace) -> int:
    from .hookspecs import INTERFACE_VERSION
    from .registry import ENV_BACKEND, backends, broken_plugins
    print(f"prism {__version__} (plugin interface {INTERFACE_VERSION})")
    infos = backends()
    print(f"backends ({len(infos)}), best first:")
    for i in infos:
        state = "available" if i.available else f"UNAVAILABLE: {i.reason}"
        extra = []
        if i.backend is not None:
            if i.backend.is_reference:
                extra.append("reference")
            extra.append(f"device={i.backend.device}")
            extra.append(f"interface={i.interface_version}")
            try:
                extra.append(f"threads={i.backend.threads}")
            except Exception as e:  # noqa: BLE001 - an optional capability must not break info
                extra.append(f"threads=? ({e})")
        print(f"  {i.name:<10} {i.version:<24} priority={i.priority:<4} {state}  [{', '.join(extra)}]"
              f"  from {i.plugin}")
    broken = broken_plugins()
    if broken:
        print(f"broken plugins ({len(broken)}), skipped:")
        for b in broken:
            print(f"  {b.plugin}: {b.reason}")
    if os.environ.get(ENV_BACKEND):
        print(f"{ENV_BACKEND}={os.environ[ENV_BACKEND]}")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from .build import builders_for
    from .optable import OPS, describe_types
    for d in OPS.values():
        srcs = ", ".join(f"{s.name}{'?' if s.optional else ''}" for s in d.srcs)
        params = ", ".join(p.name + ("" if p.required else f"={p.default!r}") for p in d.params)
        flags = [f for f, on in (("inplace", d.inplace), ("view", d.view_only)) if on]
        print(f"{d.key:<24} {d.op.name}={int(d.op):<3} ({srcs})" + (f" [{params}]" if params else "")
              + (f" {{{', '.join(flags)}}}" if flags else ""))
        print(f"{'':<24} {d.doc}; builders: {', '.join(builders_for(d)) or 'node(' + repr(d.key) + ', ...)'}")
        print(f"{'':<24} types: " + "; ".join(f"{s.name}: {describe_types(s.types)}" for s in d.srcs))
        if d.differentiable:
            print(f"{'':<24} gradient for: {', '.join(k for k, r in d.grad.items() if r != 'ignore')}"
                  + (f" (not: {d.nograd})" if d.nograd else ""))
        else:
            print(f"{'':<24} not differentiable: {d.nograd or 'piecewise constant: the gradient is zero'}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance.cases import all_cases
    from .conformance.gradcheck import grad_cases
    from .conformance.report import certificate, summary, table, to_json, to_markdown
    from .conformance.runner import DEFAULT_TIMEOUT, run, run_grad
    from .optable import OPS, opdef
    from .registry import backend, backends
    ops = [opdef(o).key for o in args.op] if args.op else list(OPS)
    if args.mode == "grad":
        ops = [k for k in ops if OPS[k].differentiable]
    if args.random is not None and args.mode == "grad":
        raise PrismError("--random draws forward cases only; use it without --mode grad")
    infos = {i.name: i for i in backends()}
    if not args.backend or "all" in args.backend:
        selected = [i.backend for i in infos.values() if i.available]
        for i in infos.values():
            if not i.available:
                print(f"skipping {i.name}: unavailable ({i.reason})")
    else:
        selected = [backend(n) for n in args.backend]
    if args.random is not None:
        from .conformance.random_cases import RANDOM, random_cases
        skipped = [k for k in ops if k not in RANDOM]
        if args.op and skipped:
            print(f"no random cases for {', '.join(skipped)} (random cases cover the elementwise, "
                  "MUL_MAT, SOFT_MAX and norm families)")
        ops = [k for k in ops if k in RANDOM]
        cases = random_cases(ops, args.random, args.seed)
    else:
        cases = grad_cases(ops) if args.mode == "grad" else all_cases(ops)
    timeout = DEFAULT_TIMEOUT if args.timeout is None else (args.timeout or None)
    results = {}
    for b in selected:
        runner = run_grad if args.mode == "grad" else run
        results[b.name] = runner(b, cases, timeout=timeout)
        if args.quiet:
            print(summary(b.name, results[b.name]))
    if not args.quiet:
        print(table(results, ops))
    if args.report:
        meta = {}
        for b in selected:
            i = infos.get(b.name)
            meta[b.name] = {"version": str(b.version), "plugin": i.plugin if i else "",
                            "interface_version": b.interface_version, "priority": b.priority,
                            "reference": bool(b.is_reference)}
        run_info = {"timeout_s": timeout}
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
    return 1 if any(r.failed for rs in results.values() for r in rs) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo
    return demo(args.backend)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism", description="Prism: ggml's tensor semantics with pluggable backends")
    p.add_argument("--version", action="version", version=f"prism {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="list backends and their state").set_defaults(func=cmd_info)
    sub.add_parser("ops", help="list the op table").set_defaults(func=cmd_ops)
    c = sub.add_parser("conformance", help="run the conformance suite and print the op-by-backend table")
    c.add_argument("--backend", action="append", metavar="NAME", help="backend name or 'all' (default: all)")
    c.add_argument("--op", action="append", metavar="OP", help="only this op key (repeatable)")
    c.add_argument("--mode", default="forward", choices=["forward", "grad"],
                   help="forward: values against the reference; grad: gradients against finite differences")
    c.add_argument("--report", nargs=2, action="append", metavar=("FORMAT", "FILE"),
                   help="also write the support table as FORMAT (json or markdown) to FILE (repeatable)")
    c.add_argument("--random", type=int, metavar="N", default=None,
                   help="instead of the fixed cases, N random cases per op (elementwise, matmul, softmax, "
                        "norm families): random shapes, types, strides/layouts and params")
    c.add_argument("--seed", type=int, default=0, metavar="S", help="seed of --random (default 0); "
                   "the same seed draws the same cases")
    c.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per-case limit for the backend under test (default 120; 0: none, run in the "
                        "calling thread); a case over it is reported TIMEOUT and the suite moves on")
    c.add_argument("-q", "--quiet", action="store_true", help="print only the summary line per backend")
    c.set_defaults(func=cmd_conformance)
    d = sub.add_parser("demo", help="build and run a small graph end to end")
    d.add_argument("--backend", default=None, help="backend name (default: best available)")
    d.set_defaults(func=cmd_demo)
    from . import cli_run
    cli_run.add_parser(sub)
    from .cli_gguf import add_parser as add_gguf_parser
    add_gguf_parser(sub)
    from .tokenizer.cli import add_parser as add_tokenize
    add_tokenize(sub)
    args = p.parse_args(argv)
    if getattr(args, "report", None):
        for fmt, _ in args.report:
            if fmt not in ("json", "markdown", "md"):
                p.error(f"--report FORMAT must be json or markdown, got {fmt!r}")
    if getattr(args, "random", None) is not None and args.random < 1:
        p.error("--random N needs N >= 1")
    if hasattr(signal, "SIGPIPE"):  # `prism ops | head` should end quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return args.func(args)
    except PrismError as e:
        print(f"prism: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
