"""Certifying a backend on a model (``prism conformance --model``): runs the model on the backend and the
reference and applies :mod:`prism_core.conformance.model_cert`'s checks and bounds (the module doc there
says what is checked and how the bounds follow from the backend's declared activation precision).

It lives with the models because it loads them; the conformance package, below, measures and judges.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..conformance.model_cert import (
    CACHE_TYPES,
    DEFAULT_PROMPTS,
    DEFAULT_TOKENS,
    PRODUCT_OPS,
    PROMPTS,
    BackendResult,
    Bounds,
    PromptResult,
    batch_gap,
    greedy,
    precision_of,
    teacher_forced,
)
from ..conformance.model_nodes import sweep
from ..conformance.reference_cache import ReferenceLogits
from ..errors import InvalidArgument, PrismError, PrismWarning
from ..plugin.base import Backend
from . import load
from .catalog import resolve


@dataclass
class Setup:
    """What a certification run is: the model file, prompts, cache types, generated tokens."""

    path: str
    prompts: tuple[str, ...]
    cache_types: tuple[str, ...] = CACHE_TYPES
    tokens: int = DEFAULT_TOKENS
    reference_dir: Path | None = None  # where reference logits are cached (None: not cached)
    n_ctx: int = 256  # the prompts and their greedy tokens fit well within it; part of the reference's key


def setup(model: str, *, prompts: int = DEFAULT_PROMPTS, cache_types: Sequence[str] = CACHE_TYPES,
          tokens: int = DEFAULT_TOKENS, reference_dir: str | Path | None = None) -> Setup:
    """Check the arguments and resolve ``model`` (a GGUF path or a catalog name) before any work."""
    if isinstance(prompts, bool) or not isinstance(prompts, int) or not 1 <= prompts <= len(PROMPTS):
        raise InvalidArgument(f"prompts must be an int in [1, {len(PROMPTS)}] (the built-in prompts), got {prompts!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 64:
        raise InvalidArgument(f"tokens must be an int in [1, 64], got {tokens!r}")
    cts = tuple(dict.fromkeys(str(c).lower() for c in cache_types))
    unknown = [c for c in cts if c not in CACHE_TYPES]
    if unknown or not cts:
        raise InvalidArgument(f"cache types must be among {', '.join(CACHE_TYPES)}, got {', '.join(cts) or 'none'}")
    return Setup(resolve(model), PROMPTS[:prompts], cts, tokens,
                 Path(reference_dir) if reference_dir is not None else None)


def _load(s: Setup, backend: Backend, cache: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrismWarning)  # the reference's "slow" warning: we know
        return load(s.path, backend=backend, n_ctx=s.n_ctx, cache_type=cache)


def n_products(model) -> int:
    """Products in the model's one-token graph (matrix products and attentions): the ``n`` of the bounds."""
    g = model.plans()[0].graph  # every graph of the model holds the same products
    return sum(1 for node in g.nodes if node.opdef is not None and node.opdef.key in PRODUCT_OPS)


def _fallback_ops(model) -> list[str]:
    return sorted({f.node.opdef.key for p in model.plans() for f in p.fallbacks})


class Certifier:
    """Runs the certification of backends on one :class:`Setup`; the reference's logits are computed
    once per (cache type, token sequence) and kept on disk when the setup names a directory."""

    def __init__(self, s: Setup, reference: Backend) -> None:
        self.setup = s
        self.reference = reference
        self.refs = ReferenceLogits(s.path, reference, s.reference_dir, lambda cache: _load(s, reference, cache),
                                    s.n_ctx)
        self._models: dict[tuple[str, str], object] = {}
        self._ids: list[list[int]] | None = None

    def prompt_ids(self) -> list[list[int]]:
        if self._ids is None:
            m = self._model(self.reference, self.setup.cache_types[0]) if not self._models else \
                next(iter(self._models.values()))
            self._ids = [_encode(m, p) for p in self.setup.prompts]
        return self._ids

    def _model(self, backend: Backend, cache: str):
        key = (backend.name, cache)
        if key not in self._models:
            for k in [k for k in self._models if k[0] != backend.name]:  # one backend's models at a time
                self._models.pop(k)
            self._models[key] = _load(self.setup, backend, cache)
        return self._models[key]

    def bounds(self, backend: Backend) -> Bounds:
        return Bounds(precision_of(backend), n_products(self._model(backend, self.setup.cache_types[0])))

    def prompt(self, backend: Backend, cache: str, index: int) -> PromptResult:
        """The three checks of prompt ``index`` on ``backend`` with KV cache ``cache``."""
        b = self.bounds(backend)
        ids = self.prompt_ids()[index]
        try:
            m = self._model(backend, cache)
            decoded, cont = _decode(m, ids, self.setup.tokens)
            fed = ids + cont[:-1]
            with m.new_sequence("certification: batched pass") as seq:
                batched = seq.logits(fed)
        except PrismError as e:
            return PromptResult(backend.name, cache, index, len(ids), [], error=f"{type(e).__name__}: {e}")
        ref = self.refs.logits(cache, fed)
        first = len(batched) - len(decoded)  # the position of the first decoded row
        checks = [teacher_forced(batched, ref, b), batch_gap(decoded, batched[first:], b),
                  greedy(cont, ref[len(ids) - 1:], b)]
        return PromptResult(backend.name, cache, index, len(ids), checks, _fallback_ops(m))

    def locate(self, backend: Backend, cache: str, index: int) -> list:
        """The nodes of the model's graphs whose results leave their op's bounds when computed on ``backend``
        from the reference's values of their sources, in graph order: a batched pass of the prompt, then its
        last token's decode step (:mod:`..conformance.model_nodes`)."""
        m, ids = self._model(backend, cache), self.prompt_ids()[index]
        return sweep(m, ids, self.reference) + sweep(m, ids, self.reference, decode=True)

    def close(self) -> None:
        self._models.clear()


def _encode(m, prompt: str) -> list[int]:
    """The prompt's tokens; for a model whose vocabulary cannot encode it (no tokenizer in the file, no byte
    fallback), its UTF-8 bytes modulo the vocabulary size after BOS: the numerics are certified either way."""
    try:
        return m.encode(prompt)
    except PrismError:
        bos = m.meta.get("tokenizer.ggml.bos_token_id")
        return ([int(bos)] if bos is not None else []) + [b % m.hparams.n_vocab for b in prompt.encode()]


def _decode(m, ids: list[int], tokens: int) -> tuple[np.ndarray, list[int]]:
    """Prefill the first half of ``ids``, feed the rest one token at a time, then generate ``tokens``
    greedily: the logits rows of every position from the prefill's last one on, and the tokens."""
    k = max(1, len(ids) // 2)
    rows, cont = [], []
    with m.new_sequence("certification: prefill then decode") as seq:
        rows.append(seq.eval(ids[:k])[-1:])
        for t in ids[k:]:
            rows.append(seq.eval([t]))
        for j in range(tokens):
            cont.append(int(np.argmax(rows[-1][0])))
            if j < tokens - 1:
                rows.append(seq.eval([cont[-1]]))
    return np.concatenate(rows), cont


def certify(s: Setup, backend: Backend, reference: Backend, *, certifier: Certifier | None = None,
            on_prompt: Callable[[PromptResult], None] | None = None, sweep: bool = True) -> BackendResult:
    """Every prompt and cache type of ``s`` on ``backend``, then the node sweep (on the first failing prompt,
    else with ``sweep`` on the first prompt): a node out of its op's bounds fails the certification and is
    named."""
    c = certifier or Certifier(s, reference)
    try:
        out = BackendResult(backend.name, c.bounds(backend))
    except PrismError as e:
        out = BackendResult(backend.name, None)
        out.prompts.append(PromptResult(backend.name, s.cache_types[0], 0, 0, [], error=f"{type(e).__name__}: {e}"))
        return out
    for cache in s.cache_types:
        for i in range(len(s.prompts)):
            r = c.prompt(backend, cache, i)
            out.prompts.append(r)
            if on_prompt is not None:
                on_prompt(r)
    failed = next((p for p in out.prompts if not p.passed and not p.error), None)
    target = failed or (out.prompts[0] if sweep and not out.prompts[0].error else None)
    if target is not None:
        where = f"node sweep on prompt {target.prompt + 1}, cache {target.cache}: "
        try:
            findings = c.locate(backend, target.cache, target.prompt)
        except PrismError as e:
            out.sweep, out.sweep_ops = where + f"failed: {type(e).__name__}: {e}", {"(sweep failed)": 1}
        else:
            out.sweep_ops = dict(Counter(f.op for f in findings))
            if findings:
                out.node = str(findings[0])
                more = Counter(f.op for f in findings[1:])
                out.sweep = where + "first node out of its op's bounds: " + out.node + (
                    f" (after it, out of bound too: {', '.join(f'{op} x{n}' for op, n in more.items())})"
                    if more else "")
            else:
                out.sweep = where + "every node within its op's bounds" + (
                    " (the error builds up over the graph)" if failed else "")
    if certifier is None:
        c.close()
    return out
