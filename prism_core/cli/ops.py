"""``prism ops [OP] [--markdown DIR] [--json]``: the op table, or one op's page generated from it."""

from __future__ import annotations

import argparse

from ..errors import PrismError


def add_parser(sub: argparse._SubParsersAction) -> None:
    o = sub.add_parser("ops", help="list the op table, or print an op's specification page")
    o.add_argument("op", nargs="?", metavar="OP", help="print this op's full page (e.g. SOFT_MAX, gelu)")
    o.add_argument("--markdown", metavar="DIR", help="write every op's page (and index.md) into DIR")
    o.add_argument("--json", action="store_true", help="print every op's page as JSON")
    o.set_defaults(func=cmd_ops)


def cmd_ops(args: argparse.Namespace) -> int:
    from ..ops.spec import all_pages, listing_line, page, to_markdown
    from ..ops.table import OPS, opdef
    if args.json:
        import json
        print(json.dumps({"ops": all_pages()}, indent=1))
        return 0
    if args.markdown:
        from pathlib import Path
        root = Path(args.markdown)
        try:
            root.mkdir(parents=True, exist_ok=True)
            index = ["# Prism op specification", "", "One page per op of the table (`prism ops OP`).", ""]
            for k, d in OPS.items():
                (root / f"{k}.md").write_text(to_markdown(page(k)), encoding="utf-8")
                index.append(f"- [{k}]({k}.md): {d.doc}")
            (root / "index.md").write_text("\n".join(index) + "\n", encoding="utf-8")
        except OSError as e:
            raise PrismError(f"cannot write the op pages to {root}: {e}") from None
        print(f"wrote {len(OPS)} op pages and index.md to {root}")
        return 0
    if args.op:
        print(to_markdown(page(opdef(args.op).key)), end="")
        return 0
    for d in OPS.values():
        print("\n".join(listing_line(d)))
    return 0
