"""The ``prism`` command: info, ops, conformance, demo."""

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
    from .optable import OPS
    for d in OPS.values():
        srcs = ", ".join(f"{s.name}{'?' if s.optional else ''}" for s in d.srcs)
        params = ", ".join(p.name + ("" if p.required else f"={p.default!r}") for p in d.params)
        flags = [f for f, on in (("inplace", d.inplace), ("view", d.view_only)) if on]
        print(f"{d.key:<24} {d.op.name}={int(d.op):<3} ({srcs})" + (f" [{params}]" if params else "")
              + (f" {{{', '.join(flags)}}}" if flags else ""))
        print(f"{'':<24} {d.doc}; builders: {', '.join(builders_for(d)) or 'node(' + repr(d.key) + ', ...)'}")
        if d.differentiable:
            print(f"{'':<24} gradient for: {', '.join(k for k, r in d.grad.items() if r != 'ignore')}"
                  + (f" (not: {d.nograd})" if d.nograd else ""))
        else:
            print(f"{'':<24} not differentiable: {d.nograd or 'piecewise constant: the gradient is zero'}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance.cases import all_cases
    from .conformance.gradcheck import grad_cases, run_grad
    from .conformance.report import table
    from .conformance.runner import FAIL, run
    from .optable import OPS, opdef
    from .registry import backend, backends
    ops = [opdef(o).key for o in args.op] if args.op else list(OPS)
    if args.mode == "grad":
        ops = [k for k in ops if OPS[k].differentiable]
    if not args.backend or "all" in args.backend:
        infos = backends()
        selected = [i.backend for i in infos if i.available]
        for i in infos:
            if not i.available:
                print(f"skipping {i.name}: unavailable ({i.reason})")
    else:
        selected = [backend(n) for n in args.backend]
    cases = grad_cases(ops) if args.mode == "grad" else all_cases(ops)
    results = {}
    for b in selected:
        results[b.name] = run_grad(b, cases) if args.mode == "grad" else run(b, cases)
    print(table(results, ops))
    return 1 if any(r.status == FAIL for rs in results.values() for r in rs) else 0


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
    c.set_defaults(func=cmd_conformance)
    d = sub.add_parser("demo", help="build and run a small graph end to end")
    d.add_argument("--backend", default=None, help="backend name (default: best available)")
    d.set_defaults(func=cmd_demo)
    args = p.parse_args(argv)
    if hasattr(signal, "SIGPIPE"):  # `prism ops | head` should end quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return args.func(args)
    except PrismError as e:
        print(f"prism: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
