"""``prism tokenize MODEL TEXT``: the ids and pieces of a prompt, the command to debug one with."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("tokenize", help="print the token ids and pieces of TEXT under MODEL's vocabulary (a file, "
                       "or a name: gemma3-270m)")
    t.add_argument("file", metavar="MODEL", help="a GGUF file (a model or a vocabulary-only file), or a model "
                   "known by name (prism models)")
    t.add_argument("text", metavar="TEXT", help="the text to tokenize")
    t.add_argument("--no-add-special", dest="add_special", action="store_false",
                   help="do not add the BOS/EOS tokens the vocabulary asks for")
    t.add_argument("--parse-special", action="store_true",
                   help="recognise control tokens written in TEXT (such as <start_of_turn>)")
    t.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    t.set_defaults(func=cmd_tokenize)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from ..tokenizer import from_gguf
    from .models import model_path
    tok = from_gguf(model_path(args.file))
    ids = tok.encode(args.text, add_special=args.add_special, parse_special=args.parse_special)
    pieces = tok.pieces(ids)
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
        return 0
    print(f"{len(ids)} tokens")
    width = len(str(max(ids))) if ids else 1
    for i, p in zip(ids, pieces):
        print(f"{i:>{width}}  {p!r}")
    return 0
