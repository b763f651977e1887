"""``prism gguf MODEL [--json]``: a GGUF file's header, metadata and tensor table (MODEL: a path or a name)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from ..gguf.file import GGUFFile, load
from ..gguf.format import V
from .args import int_at_least

LONG_ARRAY = 8  # arrays longer than this are summarised: item type, length, first items
LONG_STRING = 120


def _plain(v: Any, t: V) -> Any:
    if t == V.FLOAT32:  # the shortest decimal that reads back as the same float32 (1e-06, not 9.99999997e-07)
        return float(str(np.float32(v)))
    return v.item() if isinstance(v, np.generic) else v


def _short(s: str) -> str:
    return s if len(s) <= LONG_STRING else f"{s[:LONG_STRING]}... ({len(s)} chars)"


def describe(f: GGUFFile, long_array: int = LONG_ARRAY) -> dict[str, Any]:
    """Header, metadata (long arrays as type, length and first items) and tensor table as plain data."""
    meta: dict[str, Any] = {}
    for key, t in f.meta_types.items():
        if t == V.ARRAY:
            n = f.meta.count(key)
            entry_t = f.meta.element_types[key]
            entry: dict[str, Any] = {"type": "ARRAY", "item_type": entry_t.name, "length": n}
            if n > long_array:
                entry["first"] = [_plain(x, entry_t) for x in f.meta.head(key, long_array)]
            else:
                entry["value"] = [_plain(x, entry_t) for x in f.meta.head(key, n)]
            meta[key] = entry
        else:
            meta[key] = {"type": t.name, "value": _plain(f.meta[key], t)}
    tensors = [{"name": ti.name, "type": ti.type.name, "ne": list(ti.ne), "bytes": ti.nbytes,
                "offset": ti.offset, "file_offset": ti.file_offset} for ti in f.tensor_info.values()]
    return {"path": f.path, "version": f.version, "alignment": f.alignment, "data_offset": f.data_offset,
            "file_size": f.file_size, "metadata_count": len(meta), "tensor_count": len(tensors),
            "tensor_bytes": sum(t["bytes"] for t in tensors), "metadata": meta, "tensors": tensors}


def _fmt_value(entry: dict[str, Any]) -> str:
    if entry["type"] != "ARRAY":
        v = entry["value"]
        return _short(repr(v)) if isinstance(v, str) else repr(v)
    items = entry.get("value", entry.get("first", []))
    shown = ", ".join(_short(repr(x)) for x in items)
    more = ", ..." if "first" in entry else ""
    return f"[{entry['item_type']} x {entry['length']}] [{shown}{more}]"


def render(d: dict[str, Any]) -> str:
    lines = [f"{d['path']}: GGUF v{d['version']}, {d['file_size']} bytes, alignment {d['alignment']}, "
             f"data at byte {d['data_offset']}",
             f"metadata ({d['metadata_count']} keys):"]
    width = max((len(k) for k in d["metadata"]), default=0)
    for key, entry in d["metadata"].items():
        lines.append(f"  {key:<{width}}  {entry['type'] if entry['type'] != 'ARRAY' else '':<7} {_fmt_value(entry)}")
    lines.append(f"tensors ({d['tensor_count']}, {d['tensor_bytes']} bytes):")
    rows = [(t["name"], t["type"], "x".join(str(n) for n in t["ne"]), str(t["bytes"]), str(t["offset"]))
            for t in d["tensors"]]
    head = ("name", "type", "ne", "bytes", "offset")
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, *rows]:
        lines.append(f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}  {r[4]:>{w[4]}}")
    return "\n".join(lines)


def cmd_gguf(args: argparse.Namespace) -> int:
    from .models import model_path
    try:
        with load(model_path(args.file)) as f:
            d = describe(f, args.items)
    except OSError as e:
        print(f"prism: error: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(json.dumps(d, indent=1, default=str) if args.json else render(d))
    return 0


def add_parser(sub: Any) -> None:
    g = sub.add_parser("gguf", help="show a GGUF file's header, metadata and tensor table")
    g.add_argument("file", metavar="MODEL", help="a .gguf file, or a model known by name (prism models)")
    g.add_argument("--json", action="store_true", help="print it as JSON")
    g.add_argument("--items", type=int_at_least(0), default=LONG_ARRAY, metavar="N",
                   help=f"arrays longer than N are summarised by their first N items (default {LONG_ARRAY})")
    g.set_defaults(func=cmd_gguf)
