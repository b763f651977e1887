"""Request bodies, checked field by field: a bad one is a :class:`BadRequest` naming the field (the server
answers 400 with an OpenAI-style error body). llama-server's sampling fields map onto :class:`Sampler`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from ..models import Sampler


class BadRequest(InvalidArgument):
    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def _num(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise BadRequest(name, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {v!r:.60}")
    return float(v)


def _int(body: dict, name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise BadRequest(name, f"'{name}' must be an integer {rng}, got {v!r:.60}")
    return v


@dataclass
class Completion:
    prompt: str | list[int] | list[dict[str, Any]]
    chat: bool
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampler: Sampler | None = None


def parse(body: Any, *, chat: bool, model_names: tuple[str, ...]) -> Completion:
    if not isinstance(body, dict):
        raise BadRequest(None, f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model not in model_names):
        raise BadRequest("model", f"unknown model {model!r:.80}; this server serves {', '.join(model_names)}")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages", "'messages' must be a non-empty array of {role, content} objects")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise BadRequest(f"messages[{i}]", f"messages[{i}] must be an object with string 'role' and "
                                                   f"'content', got {m!r:.80}")
        prompt: Any = msgs
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ok = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt))
        if not ok:
            raise BadRequest("prompt", "'prompt' must be a string or a non-empty array of token ids")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream", f"'stream' must be a boolean, got {stream!r:.60}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise BadRequest("stream_options", "'stream_options' must be an object with a boolean 'include_usage'")
    n = _int(body, "n", 1, 1, 1)
    del n
    max_tokens = _int(body, "max_tokens", None, 0)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _int(body, "max_completion_tokens", None, 0)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise BadRequest("stop", "'stop' must be a non-empty string or an array of up to 16 of them")
    seed = _int(body, "seed", None, -1, 2**63 - 1)
    sampler = Sampler(temperature=_num(body, "temperature", 0.8, 0.0, 1e6),
                      top_k=_int(body, "top_k", 40, 0), top_p=_num(body, "top_p", 0.95, 1e-9, 1.0),
                      min_p=_num(body, "min_p", 0.05, 0.0, 1.0),
                      repeat_penalty=_num(body, "repeat_penalty", 1.0, 1e-9, 1e6),
                      repeat_last_n=_int(body, "repeat_last_n", 64, 0),
                      seed=None if seed is None or seed < 0 else seed)
    return Completion(prompt, chat, stream, bool(opts.get("include_usage", False)), max_tokens, stop, sampler)


class StopMatcher:
    """Stop strings across token boundaries: text that could begin a stop string is held back until it
    cannot; at a match the text before it is the last to go out."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.pending, self.stopped = stops, "", False

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[:min(hits)], "", True
            return out
        keep = 0  # the longest tail that is a prefix of some stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        out = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
