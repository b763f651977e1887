"""``prism models``: the models known by name, whether their files are here, where they live, their sizes.

Every command that takes a model file takes these names too (:func:`model_path`)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="list the models known by name (gemma3-270m ...), where their files live")
    m.add_argument("--json", action="store_true", help="print the list as JSON")
    m.set_defaults(func=cmd_models)


def model_path(model: str, progress: bool | None = None) -> str:
    """A GGUF path, or the file of a model known by name, assembled from its package on first use (with
    progress bars on stderr: ``progress`` None draws them only on a terminal)."""
    from ..models.catalog import resolve
    from ..progress_bars import ProgressBars
    with ProgressBars(sys.stderr, enabled=progress):
        return resolve(model)


def cmd_models(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..models.catalog import entries
    found = entries()
    if args.json:
        print(json.dumps([asdict(e) for e in found], indent=1))
        return 0
    for e in found:
        if not e.installed:
            state = f"not installed: pip install {e.requirement} (or prism-tensor[model])"
        elif e.present:
            state = f"{e.size / 1e6:.0f} MB at {e.path}" + ("" if e.verified else " (not verified yet)")
        else:
            state = (f"installed ({e.size / 1e6:.0f} MB in chunks); assembled on first use into {e.path}")
        print(f"{e.name:<14} {state}")
    return 0
