"""``prism imatrix MODEL -f TEXT``: the importance matrix of a model on a text, as llama.cpp's llama-imatrix."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..settings import ENV_THREADS
from .args import int_at_least


def add_parser(sub) -> None:
    p = sub.add_parser("imatrix", help="compute an importance matrix (for prism/llama quantize --imatrix) as "
                                       "llama.cpp's llama-imatrix does")
    p.add_argument("model", help="a GGUF model (a path, or a known model name: gemma3-270m)")
    p.add_argument("-f", "--file", required=True, help="the text file to run the model over")
    p.add_argument("-o", "--output", default="imatrix.gguf", help="the file to write (default imatrix.gguf)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                   help="GGUF (current llama.cpp) or the legacy .dat (default: dat for a .dat name, else gguf)")
    p.add_argument("-c", "--ctx-size", type=int_at_least(16), default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int_at_least(1), default=None, help="at most this many chunks (default: all)")
    p.add_argument("--process-output", action="store_true", help="collect output.weight's inputs too")
    p.add_argument("--backend", default=None, help="backend name (default: the best available)")
    p.add_argument("-t", "--threads", type=int_at_least(1), default=None, help="threads per kernel")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: only when stderr is a terminal)")
    p.set_defaults(func=cmd_imatrix)


def read_text(path: str) -> str:
    """A text file as llama.cpp's tools read one (bytes as UTF-8; a clear error when it is missing)."""
    from ..errors import InvalidArgument
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError as e:
        raise InvalidArgument(f"cannot read the text file {path!r}: {e.strerror}") from None


def cmd_imatrix(args: argparse.Namespace) -> int:
    from .. import progress
    from ..gguf import imatrix as imatrix_file
    from ..models import load
    from ..models.imatrix import compute_imatrix, dataset_name
    from ..progress_bars import ProgressBars
    from .models import model_path
    if args.threads is not None:
        os.environ[ENV_THREADS] = str(args.threads)
    text = read_text(args.file)
    fmt = args.output_format or ("dat" if args.output.endswith(".dat") else "gguf")
    t0 = time.perf_counter()
    with ProgressBars(sys.stderr, enabled=args.progress):
        model = load(model_path(args.model, args.progress), backend=args.backend, n_ctx=args.ctx_size)
        task = f"imatrix over {os.path.basename(args.file)}"
        im = compute_imatrix(model, text, n_ctx=args.ctx_size, n_chunks=args.chunks, dataset=dataset_name(args.file),
                             process_output=args.process_output,
                             on_chunk=lambda i, n: progress.report(task, i, n, unit="chunks"))
    (imatrix_file.save_legacy if fmt == "dat" else imatrix_file.save)(args.output, im)
    print(f"{args.output}: {len(im.entries)} entries from {im.chunk_count} chunks of {im.chunk_size} tokens "
          f"({fmt}, {time.perf_counter() - t0:.1f} s)")
    return 0
