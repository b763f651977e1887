"""``prism run MODEL -p PROMPT``: generate text with a GGUF model, streaming it, then the speeds."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import resource
import sys
import time

from ..settings import ENV_THREADS, MAX_THREADS
from .args import DefaultsHelpFormatter
from .lora_args import add_lora_args, lora_list


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="generate text with a GGUF language model (a path, or gemma3-270m)",
                       formatter_class=DefaultsHelpFormatter)
    r.add_argument("model", help="a GGUF file, or a known model name: gemma3-270m")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt; an empty one is the BOS token alone, as llama.cpp")
    src.add_argument("-f", "--file", help="read the prompt from this file (UTF-8)")
    r.add_argument("-n", "--n-predict", type=_n_predict, default=64,
                   help="tokens to generate; -1: until end-of-generation, bounded by the context")
    r.add_argument("--no-display-prompt", action="store_true",
                   help="do not echo the prompt before the generated text (llama-cli echoes it)")
    r.add_argument("--backend", default=None, help="backend name (default: the best available)")
    r.add_argument("-t", "--threads", type=_threads, default=None,
                   help=f"threads per kernel, 1 to {MAX_THREADS} (default: $PRISM_NUM_THREADS, else every core)")
    r.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    r.add_argument("--top-k", type=_nonneg_int, default=40, help="keep the k most likely tokens; 0: off")
    r.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1: off")
    r.add_argument("--min-p", type=float, default=0.05, help="drop tokens below min_p times the top one's; 0: off")
    r.add_argument("--repeat-penalty", type=float, default=1.0, help="penalise the last 64 tokens; 1: off")
    r.add_argument("-s", "--seed", type=_nonneg_int, default=None, help="sampler seed (default: a random one)")
    r.add_argument("-c", "--ctx-size", type=_nonneg_int, default=None,
                   help="context length (default: min(2048, trained))")
    r.add_argument("--cache-type", default="f16", choices=("f16", "f32", "q8_0"), help="KV cache type")
    r.add_argument("--no-flash-attn", action="store_true",
                   help="attend as llama.cpp's default graph (K·q, softmax, V·p) instead of the fused FLASH_ATTN_EXT")
    add_lora_args(r)
    r.add_argument("-sp", "--special", action="store_true",
                   help="print control tokens' text (<bos>, <unused0>, ...), as llama.cpp's --special")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr while the model file is assembled and the backend compiles its "
                        "kernels, until the first token (default: only when stderr is a terminal)")
    r.set_defaults(func=cmd_run)


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {v}")
    return v


def _n_predict(s: str) -> int:
    if s.strip() == "-1":
        return -1
    return _nonneg_int(s)


def prompt_ids(model, prompt: str) -> list[int]:
    """The prompt's ids as llama.cpp's tools tokenize it: an empty prompt is the BOS token alone (nothing
    when the vocabulary adds none, which is refused: a model needs at least one token)."""
    from ..errors import InvalidArgument
    if prompt:
        return model.encode(prompt)
    ids = model.tokenizer.encode("", add_special=True, parse_special=True)
    if not ids:
        raise InvalidArgument("the prompt is empty and the vocabulary adds no BOS token to start from")
    return ids


def _threads(s: str) -> int:
    v = _nonneg_int(s)
    if not 1 <= v <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_THREADS} threads, got {v}")
    return v


def cmd_run(args: argparse.Namespace) -> int:
    from ..models import Sampler, load
    from ..progress_bars import ProgressBars
    if args.threads is not None:  # every backend reads the one setting when it is selected
        os.environ[ENV_THREADS] = str(args.threads)
    try:
        prompt = args.prompt
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    prompt = fh.read()
            except (OSError, UnicodeDecodeError) as e:
                print(f"prism run: cannot read the prompt file {args.file!r}: {e}", file=sys.stderr)
                return 1
        sampler = Sampler(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, seed=args.seed)
        model, load_s, load_compile_s, ids = None, 0.0, 0.0, []
        with ProgressBars(sys.stderr, enabled=args.progress) as bars:
            t0 = time.perf_counter()
            model = load(args.model, backend=args.backend, n_ctx=args.ctx_size, cache_type=args.cache_type,
                         flash_attn=not args.no_flash_attn, lora=lora_list(args))
            # kernels a JIT backend compiles while the model loads (numba, cold: the weights' preparation) are
            # compiling, reported with the rest of it, not load time (the process has compiled nothing before)
            elapsed = time.perf_counter() - t0
            load_compile_s = min(model.backend.compile_seconds(), elapsed)
            load_s = elapsed - load_compile_s
            p_ids = prompt_ids(model, prompt)
            n_predict = args.n_predict if args.n_predict >= 0 else max(model.cache.n_ctx - len(p_ids), 0)
            ids, pieces, first = [], [], None
            if not args.json and not args.no_display_prompt:
                sys.stdout.write(prompt)  # as llama-cli: the prompt, then its continuation
                sys.stdout.flush()
            # stdout is the pieces' bytes decoded as they come, always valid UTF-8: a character cut at the
            # end shows as U+FFFD (llama.cpp writes the raw byte, which breaks a reader decoding strictly)
            utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
            for tok in model.generate(p_ids, max_tokens=n_predict, sampler=sampler,
                                      special=args.special):
                if first is None:
                    first = time.perf_counter() - t0
                    bars.close()  # the text streams from here: no bar line between its pieces
                ids.append(tok.id)
                pieces.append(tok.bytes)
                if not args.json:
                    sys.stdout.write(utf8.decode(tok.bytes))
                    sys.stdout.flush()
            if not args.json:  # a character cut at the end (max_tokens or an end-of-generation token)
                sys.stdout.write(utf8.decode(b"", final=True))
    except KeyboardInterrupt:  # the statistics of what was done (the reference backend takes seconds a token)
        if model is None:
            raise
        print(file=sys.stdout, flush=True)
        print(f"prism run: interrupted after {len(ids)} generated tokens", file=sys.stderr)
        print(_report(model, load_s, load_compile_s), file=sys.stderr)
        return 130
    t = model.timings
    peak_mb, file_mb = _peak_and_file_mb(model)
    if args.json:
        print(json.dumps({"model": args.model, "backend": model.backend.name,
                          "threads": model.backend.threads, "prompt_ids": p_ids, "ids": ids,
                          "text": b"".join(pieces).decode("utf-8", errors="replace"), "load_s": load_s,
                          "first_token_s": first,
                          "prompt_tokens": t.n_prompt, "prompt_s": t.prompt_s, "prompt_tok_s": t.prompt_tok_s,
                          "decode_tokens": t.n_decode, "decode_s": t.decode_s, "decode_tok_s": t.decode_tok_s,
                          "compile_s": t.compile_s + load_compile_s,
                          "peak_rss_mb": peak_mb, "file_mb": file_mb}))
    else:
        print(file=sys.stdout, flush=True)  # the text's line ends before the report on stderr
        print(_report(model, load_s, load_compile_s), file=sys.stderr)
    return 0


def _peak_and_file_mb(model) -> tuple[float, float]:
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # ru_maxrss is in KiB on Linux
    return peak_mb, (model.source.file_size / 1e6 if model.source is not None else 0.0)


def _report(model, load_s: float, load_compile_s: float = 0.0) -> str:
    """The speeds line: prompt and decode speeds and load time, kernel compiling (while loading and in the steps)
    counted apart from all three; threads, memory."""
    t = model.timings
    peak_mb, file_mb = _peak_and_file_mb(model)
    compile_s = t.compile_s + load_compile_s
    compiled = f"compile {compile_s:.1f} s (not in the speeds or the load); " if compile_s >= 0.05 else ""
    return (f"[{model.backend.name}] prompt {t.n_prompt} tokens: {t.prompt_tok_s:.1f} tok/s; decode {t.n_decode} "
            f"tokens: {t.decode_tok_s:.1f} tok/s; {compiled}load {load_s:.2f} s; threads {model.backend.threads}; "
            f"peak memory {peak_mb:.0f} MB"
            + (f" ({peak_mb / file_mb:.2f}x the {file_mb:.0f} MB file)" if file_mb else ""))
