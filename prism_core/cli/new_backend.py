"""``prism new-backend NAME``: write a ready backend plugin package to start from."""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    nb = sub.add_parser("new-backend", help="write a ready backend plugin package to start from")
    nb.add_argument("name", metavar="NAME", help="the backend's name (lowercase letters, digits, _)")
    nb.add_argument("--dir", default=None, metavar="D", help="where to write it (default ./prism-NAME; "
                    "must not exist or be empty)")
    nb.set_defaults(func=cmd_new_backend)


def cmd_new_backend(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..scaffold import write_backend
    files = write_backend(args.name, args.dir)
    root = Path(os.path.commonpath(files))
    print(f"wrote the {args.name} backend package ({len(files)} files) into {root}:")
    for f in files:
        print(f"  {f.relative_to(root)}")
    print(f"next: pip install -e {root} && prism conformance --backend {args.name} (see its README.md)")
    return 0
