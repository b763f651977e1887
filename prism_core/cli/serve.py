"""``prism serve MODEL``: an OpenAI-compatible HTTP server (docs/serve.md)."""

from __future__ import annotations

import argparse
import os
import sys

from ..settings import ENV_THREADS
from .args import DefaultsHelpFormatter, int_at_least
from .run import _threads


def add_parser(sub) -> None:
    r = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over a GGUF model (docs/serve.md)",
                       formatter_class=DefaultsHelpFormatter)
    r.add_argument("model", help="a GGUF file, or a known model name: gemma3-270m")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on")
    r.add_argument("--port", type=int_at_least(0), default=8080, help="port (0: any free one)")
    r.add_argument("-np", "--parallel", type=int_at_least(1), default=1, help="requests computed at once, batched "
                   "(slots)")
    r.add_argument("--queue", type=int_at_least(0), default=16,
                   help="requests waiting for a slot; beyond, 503 with Retry-After")
    r.add_argument("-c", "--ctx-size", type=int_at_least(1), default=None,
                   help="context length (default: min(2048, trained))")
    r.add_argument("--backend", default=None, help="backend name (default: the best available)")
    r.add_argument("-t", "--threads", type=_threads, default=None, help="threads per kernel "
                   "(default: $PRISM_NUM_THREADS, else every core)")
    r.add_argument("--chat-template", default=None,
                   help="a built-in chat template (chatml, gemma, llama3) instead of the file's "
                        "(default: the file's tokenizer.chat_template)")
    r.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        print("prism serve: needs the serve extra: pip install 'prism[serve]' (starlette, uvicorn, jinja2)",
              file=sys.stderr)
        return 1
    from ..errors import PrismError
    from ..models import load
    from ..models.engine import Engine
    from ..serve.app import Server, create_app
    from ..serve.templates import for_model
    if args.threads is not None:
        os.environ[ENV_THREADS] = str(args.threads)
    try:
        model = load(args.model, backend=args.backend, n_ctx=args.ctx_size, n_seq=args.parallel)
        template = for_model(model, args.chat_template)
    except PrismError as e:
        print(f"prism serve: {e}", file=sys.stderr)
        return 1
    name = os.path.basename(args.model)
    engine = Engine(model, n_parallel=args.parallel)
    server = Server(model, engine, name=name, n_parallel=args.parallel, n_queue=args.queue, template=template)
    print(f"prism serve: {name} on http://{args.host}:{args.port} ({model.backend.name}, {args.parallel} slots, "
          f"queue {args.queue}, context {model.cache.n_ctx})", file=sys.stderr, flush=True)
    with engine:
        uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    return 0
