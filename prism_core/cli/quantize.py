"""``prism quantize IN OUT TYPE``: a GGUF model quantized to a file type, as llama.cpp's llama-quantize writes it."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..settings import MAX_THREADS
from .args import int_at_least


def add_parser(sub) -> None:
    from ..models.quant_rules import ALIASES, PRESETS
    q = sub.add_parser("quantize", help="quantize a GGUF model to a file type (Q4_K_M, Q8_0, IQ4_XS, ...), "
                                        "byte for byte as llama.cpp's llama-quantize",
                       description="Quantize a GGUF model as llama.cpp 0.3.36's llama-quantize does: the same "
                                   "per-tensor types (its mixture rules) and bytes. Types: "
                                   + ", ".join([*PRESETS, *ALIASES]) + " (or a file type number).")
    q.add_argument("input", help="the GGUF model to quantize (a path, or a known model name: gemma3-270m)")
    q.add_argument("output", help="the GGUF file to write")
    q.add_argument("type", help="the file type: Q4_K_M, Q8_0, IQ4_XS, ... (see above)")
    q.add_argument("--imatrix", metavar="FILE", help="an importance matrix (GGUF or legacy .dat), as from "
                                                      "prism imatrix or llama-imatrix")
    q.add_argument("-t", "--threads", type=_threads, default=None,
                   help=f"threads of the quantizers, 1 to {MAX_THREADS} (default: $PRISM_NUM_THREADS, else every core)")
    q.add_argument("--allow-requantize", action="store_true", help="allow quantizing tensors that already are")
    q.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    q.add_argument("--output-tensor-type", metavar="T", help="the type of output.weight (e.g. q8_0, f16)")
    q.add_argument("--token-embedding-type", metavar="T", help="the type of token_embd.weight")
    q.add_argument("--pure", action="store_true", help="every quantizable tensor of the default type (no mixture)")
    q.add_argument("-v", "--verbose", action="store_true", help="one line per tensor: its types and any fallback")
    q.add_argument("--json", action="store_true", help="print the result as one JSON object")
    q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: only when stderr is a terminal)")
    q.set_defaults(func=cmd_quantize)


_threads = int_at_least(1)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..errors import InvalidArgument
    from ..models.quantize import quantize_model
    from ..progress_bars import ProgressBars
    from ..types import traits
    from .models import model_path
    if args.threads is not None and args.threads > MAX_THREADS:
        raise InvalidArgument(f"--threads: at most {MAX_THREADS}, got {args.threads}")
    src = model_path(args.input, args.progress)
    t0 = time.perf_counter()
    with ProgressBars(sys.stderr, enabled=args.progress):
        r = quantize_model(src, args.output, args.type, imatrix=args.imatrix, threads=args.threads,
                           allow_requantize=args.allow_requantize, leave_output_tensor=args.leave_output_tensor,
                           output_tensor_type=args.output_tensor_type,
                           token_embedding_type=args.token_embedding_type, pure=args.pure)
    seconds = time.perf_counter() - t0
    mib = 1 << 20
    bpw_in = 8 * r.bytes_in / max(1, r.n_elements)
    bpw_out = 8 * r.bytes_out / max(1, r.n_elements)
    if args.json:
        print(json.dumps({"input": src, "output": r.path, "type": r.preset.name, "file_type": r.preset.ftype,
                          "seconds": round(seconds, 3), "bytes_in": r.bytes_in, "bytes_out": r.bytes_out,
                          "imatrix_entries": r.imatrix_entries, "quantized_without_imatrix": r.missing_imatrix,
                          "tensors": [{"name": p.name, "from": traits(p.source).name, "to": traits(p.target).name,
                                       **({"fallback": p.fallback} if p.fallback else {})} for p in r.plans]}))
        return 0
    if args.verbose:
        for p in r.plans:
            change = f"{traits(p.source).name} -> {traits(p.target).name}" if p.target != p.source \
                else traits(p.source).name
            print(f"{p.name:40s} {change}" + (f"  ({p.fallback})" if p.fallback else ""))
    print(f"{r.path}: {r.preset.name} (file type {r.preset.ftype}), {len(r.plans)} tensors in {seconds:.2f} s")
    print(f"model size {r.bytes_in / mib:9.2f} MiB ({bpw_in:.2f} BPW)")
    print(f"quant size {r.bytes_out / mib:9.2f} MiB ({bpw_out:.2f} BPW)")
    if r.fallbacks:
        print(f"{len(r.fallbacks)} of {len(r.plans)} tensors needed a fallback type (-v lists them)")
    if r.missing_imatrix:
        print(f"no importance matrix for {len(r.missing_imatrix)} quantized tensors: "
              + ", ".join(r.missing_imatrix[:4]) + (" ..." if len(r.missing_imatrix) > 4 else ""), file=sys.stderr)
    return 0
