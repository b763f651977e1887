"""llama.cpp's adapter flags, shared by ``prism run`` and ``prism export-lora``: ``--lora FNAME`` (scale 1;
comma-separated for several, repeatable) and ``--lora-scaled FNAME SCALE`` or llama.cpp's current
``--lora-scaled FNAME:SCALE[,FNAME:SCALE...]``."""

from __future__ import annotations

import argparse
import math

from ..errors import InvalidArgument


def add_lora_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", action="append", default=[], metavar="FNAME",
                   help="apply a LoRA adapter (scale 1); comma-separated or repeated for several")
    p.add_argument("--lora-scaled", action="append", nargs="+", default=[], metavar="FNAME SCALE",
                   help="apply a LoRA adapter with a scale: FNAME SCALE, or FNAME:SCALE[,FNAME:SCALE...]")


def _scale(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidArgument(f"--lora-scaled {where}: the scale {text!r} is not a number") from None
    if not math.isfinite(v):
        raise InvalidArgument(f"--lora-scaled {where}: the scale must be finite, got {text!r}")
    return v


def lora_list(args: argparse.Namespace) -> list[tuple[str, float]]:
    """The (path, scale) pairs of ``--lora`` and ``--lora-scaled``, in the order given per flag; a malformed
    ``--lora-scaled`` raises InvalidArgument."""
    out = [(item, 1.0) for arg in args.lora for item in arg.split(",") if item]
    for group in args.lora_scaled:
        if len(group) == 2 and ":" not in group[1]:
            out.append((group[0], _scale(group[1], " ".join(group))))
            continue
        for arg in group:
            for item in arg.split(","):
                name, sep, scale = item.rpartition(":")
                if not sep or not name:
                    raise InvalidArgument(f"--lora-scaled {item!r}: expected FNAME SCALE or FNAME:SCALE")
                out.append((name, _scale(scale, item)))
    return out
