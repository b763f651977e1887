"""``prism chat MODEL``: an interactive chat on the terminal with the model's chat template (llama-cli's
``-cnv``). The conversation stays in the KV cache between turns: a turn computes only the tokens after the
longest cached prefix (the whole conversation again only when the template re-tokenizes a past turn
differently)."""

from __future__ import annotations

import argparse
import codecs
import os
import sys

from ..settings import ENV_THREADS
from .args import DefaultsHelpFormatter
from .run import _n_predict, _nonneg_int, _threads


def add_parser(sub) -> None:
    r = sub.add_parser("chat", help="an interactive chat with a GGUF model, using its chat template",
                       formatter_class=DefaultsHelpFormatter)
    r.add_argument("model", help="a GGUF file, or a known model name: gemma3-270m")
    r.add_argument("-sys", "--system-prompt", default=None, help="a system message opening the conversation")
    r.add_argument("-n", "--n-predict", type=_n_predict, default=-1,
                   help="tokens per answer at most; -1: until end-of-generation, bounded by the context")
    r.add_argument("--chat-template", default=None,
                   help="a built-in template (chatml, gemma, llama3) (default: the file's tokenizer.chat_template)")
    r.add_argument("--backend", default=None, help="backend name (default: the best available)")
    r.add_argument("-t", "--threads", type=_threads, default=None, help="threads per kernel (default: every core)")
    r.add_argument("-c", "--ctx-size", type=_nonneg_int, default=None,
                   help="context length (default: min(2048, trained))")
    r.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    r.add_argument("--top-k", type=_nonneg_int, default=40, help="0: off")
    r.add_argument("--top-p", type=float, default=0.95, help="1: off")
    r.add_argument("--min-p", type=float, default=0.05, help="0: off")
    r.add_argument("--repeat-penalty", type=float, default=1.0, help="1: off")
    r.add_argument("-s", "--seed", type=_nonneg_int, default=None, help="sampler seed (default: a random one)")
    r.set_defaults(func=cmd_chat)


class Conversation:
    """The messages so far and the ids in the model's KV cache; :meth:`reply` computes only the new part."""

    def __init__(self, model, template, sampler, n_predict: int) -> None:
        self.model, self.template, self.sampler, self.n_predict = model, template, sampler, n_predict
        self.messages: list[dict[str, str]] = []
        self.cached: list[int] = []  # the ids whose keys and values the cache holds, in order
        self.n_new = 0  # the last turn's computed prompt tokens

    def _ids(self) -> list[int]:
        text = self.template.render(self.messages, add_generation_prompt=True)
        bos = self.template.bos_token
        return self.model.tokenizer.encode(text, add_special=not (bos and text.startswith(bos)), parse_special=True)

    def reply(self, user: str, out=None):
        from ..errors import BoundExceeded
        model = self.model
        self.messages.append({"role": "user", "content": user})
        ids = self._ids()
        n_ctx = model.cache.n_ctx
        if len(ids) >= n_ctx:
            self.messages.pop()
            raise BoundExceeded(f"the conversation ({len(ids)} tokens) fills the context of {n_ctx} tokens")
        if ids[:len(self.cached)] != self.cached or len(self.cached) >= len(ids):  # a past turn re-tokenized
            model.cache.clear()
            self.cached = []
        new = ids[len(self.cached):]
        self.n_new = len(new)
        logits = model.eval(new)[-1]
        self.cached = list(ids)
        budget = n_ctx - len(ids) if self.n_predict < 0 else min(self.n_predict, n_ctx - len(ids))
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[str] = []
        for i in range(budget):
            tok = self.sampler(logits, self.cached)
            if tok in model.eog_ids:
                break
            piece = utf8.decode(model.tokenizer.piece_bytes(tok, False), final=i == budget - 1)
            pieces.append(piece)
            if out is not None:
                out.write(piece)
                out.flush()
            if i + 1 < budget:
                logits = model.eval([tok])[-1]
                self.cached.append(tok)
        text = "".join(pieces)
        self.messages.append({"role": "assistant", "content": text})
        return text


def cmd_chat(args: argparse.Namespace) -> int:
    from ..errors import PrismError
    from ..models import Sampler, load
    from ..serve.templates import TEMPLATE_KEY, for_model
    if args.threads is not None:
        os.environ[ENV_THREADS] = str(args.threads)
    try:
        sampler = Sampler(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, seed=args.seed)
        model = load(args.model, backend=args.backend, n_ctx=args.ctx_size)
        template = for_model(model, args.chat_template)
        if template is None:
            print(f"prism chat: the model file has no chat template (metadata key {TEMPLATE_KEY!r}); pick a "
                  "built-in one with --chat-template chatml|gemma|llama3", file=sys.stderr)
            return 1
    except PrismError as e:
        print(f"prism chat: {e}", file=sys.stderr)
        return 1
    conv = Conversation(model, template, sampler, args.n_predict)
    if args.system_prompt:
        conv.messages.append({"role": "system", "content": args.system_prompt})
    tty = sys.stdin.isatty()
    if tty:
        print("prism chat: type a message; an empty line or Ctrl-D ends", file=sys.stderr)
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or (tty and not line.strip()):
            break
        line = line.rstrip("\n")
        if not line.strip():
            continue
        try:
            conv.reply(line, sys.stdout)
        except PrismError as e:
            print(f"\nprism chat: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(file=sys.stdout)
            continue
        print(file=sys.stdout, flush=True)
        print(f"[{conv.n_new} prompt tokens computed, {len(conv.cached)} in the cache]", file=sys.stderr)
    return 0
