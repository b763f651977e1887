"""``prism export-lora MODEL --lora ADAPTER -o MERGED.gguf``: merge LoRA adapters into a model file (llama.cpp's
export-lora), each merged matrix requantized to its original type."""

from __future__ import annotations

import argparse
import sys

from .lora_args import add_lora_args, lora_list


def add_parser(sub) -> None:
    e = sub.add_parser("export-lora", help="merge LoRA adapters into a model, keeping each matrix's type")
    e.add_argument("model", help="a GGUF file, or a known model name: gemma3-270m")
    add_lora_args(e)
    e.add_argument("-o", "--output", required=True, help="the merged model to write")
    e.add_argument("--outtype", choices=("keep", "f16", "f32"), default="keep",
                   help="the merged matrices' type: each one's own, requantized (default), or F16/F32 (llama.cpp's "
                        "export-lora writes F16)")
    e.set_defaults(func=cmd_export_lora)


def cmd_export_lora(args: argparse.Namespace) -> int:
    from ..finetune.export import merge
    from .models import model_path
    merged = merge(model_path(args.model), lora_list(args), args.output,
                   None if args.outtype == "keep" else args.outtype)  # a refusal: prism_core.cli.exit_status
    print(f"prism export-lora: wrote {args.output}: {len(merged)} matrices merged", file=sys.stderr)
    return 0
