"""``prism info``: the installed backends, their state and the broken plugins."""

from __future__ import annotations

import argparse
import os

from .. import __version__


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("info", help="list backends and their state").set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    from ..plugin.hookspecs import INTERFACE_VERSION
    from ..plugin.registry import ENV_BACKEND, REGISTRY, backends
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
    print_broken_plugins()
    best = next((i.name for i in REGISTRY.candidates() if i.available), "none")
    named_only = [i.name for i in infos if i.installed]
    print(f"default (no backend named): {best}"
          + (f"; installed third-party backends are used only when named ({', '.join(named_only)})"
             if named_only else ""))
    if os.environ.get(ENV_BACKEND):
        print(f"{ENV_BACKEND}={os.environ[ENV_BACKEND]}")
    return 0


def print_broken_plugins() -> None:
    """The plugins discovery skipped, with why (a crash or hang in the probe, a failed import, ...)."""
    from ..plugin.registry import broken_plugins
    broken = broken_plugins()
    if broken:
        print(f"broken plugins ({len(broken)}), skipped:")
        for b in broken:
            print(f"  {b.plugin}: {b.reason}")
