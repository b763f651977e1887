"""Model-level certification: a backend on a real GGUF model against the reference backend.

For each built-in prompt (:data:`PROMPTS`) and KV cache type, on the backend under test:

1. **prefill-then-decode**: the first half of the prompt in one batch, then the rest of it and
   ``tokens`` greedy tokens one at a time (generation as ``prism run`` does it, prompt split);
2. **one batched pass** over the same tokens (prompt and continuation) from an empty sequence;
3. the **reference**'s logits of that batched pass (cached on disk, see :mod:`.reference_cache`).

Three checks follow: **teacher-forced** (2 against 3: every row's logits), **batch invariance** (1
against 2, the same backend: how far a decoded row is from the same row computed in a batch) and
**greedy** (each generated token is the reference's argmax there, or a near tie of it).

Bounds come from the backend's declared ``activation_precision`` (:class:`Bounds`): the rounding
unit ``u`` of one product's inputs, over the ``n`` products of the model's graph (matrix products
and attentions), errors adding in quadrature along the residual stream: the logits' relative rms
error (sqrt of the NMSE against the reference's) stays within ``K u sqrt(n)``, any single logit within
``TAIL`` times that (relative to its row's rms), the batch gap within twice each (both computations are
within the bound of the exact one), and a greedy token may differ from the reference's only where the
reference's two logits are within twice the single-logit bound. When a check fails, the model's graph is
run node by node against the reference (:mod:`.model_nodes`) and the first node out of its op's
bounds is named.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument, PrismError
from ..plugin.base import Backend

# Short on purpose (the reference computes a 270M model at about one token a second in a batch), and
# varied: prose, a question, code, numbers, another language, a list, dialogue, a rare-word sentence.
PROMPTS = (
    "The capital of France is",
    "Question: why is the sky blue? Answer:",
    "def fibonacci(n):\n    if n < 2:",
    "3, 5, 7, 11, 13, 17,",
    "Le chat est assis sur",
    "Ingredients:\n- 2 eggs\n-",
    "\"Where were you last night?\" she asked.",
    "Photosynthesis converts sunlight into",
)
CACHE_TYPES = ("f16", "f32", "q8_0")
DEFAULT_PROMPTS = 3
DEFAULT_TOKENS = 4

# The relative rounding of one product's inputs per declared precision. q8: a Q8 value is off by at most
# half its step (block max / 127) plus its block's fp16 scale rounding, relative to the block's maximum
# (the same bound tests/test_ggml_mulmat_golden.py applies to ggml's products); f32/f64: a product's
# accumulation over up to 4096 terms, sqrt(4096) = 64 roundings in rms; f16/bf16: the activation's rounding.
PRECISION_UNIT = {"f64": 64 * 2.0**-53, "f32": 64 * 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8,
                  "q8": 1 / 254 + 2.0**-11}
K = 2.0  # slack over the quadrature estimate (measured on Gemma 3 270M: 0.8-0.9 of it with q8, docs/conformance.md)
TAIL = 6.0  # one logit's error over the rms error (the largest of ~10^6 near-Gaussian errors is about 5 of it)
PRODUCT_OPS = frozenset({"MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "FLASH_ATTN_EXT"})


@dataclass(frozen=True)
class Bounds:
    """The bounds of one backend on one model (see the module doc)."""

    precision: str
    n_products: int

    @property
    def unit(self) -> float:
        return PRECISION_UNIT[self.precision]

    @property
    def rms(self) -> float:
        """Bound on the logits' relative rms error against the reference (sqrt of their NMSE)."""
        return K * self.unit * math.sqrt(self.n_products)

    @property
    def element(self) -> float:
        """Bound on any one logit's error, relative to its row's rms."""
        return TAIL * self.rms

    def text(self) -> str:
        return (f"activation precision {self.precision} (u = {self.unit:.3g}), {self.n_products} products: "
                f"logits rms error <= {K:g} u sqrt(n) = {self.rms:.3g} of the reference's rms, any logit <= "
                f"{self.element:.3g} of its row's rms; batch gap <= twice each; a greedy token may differ "
                f"only where the reference's two logits are within {2 * self.element:.3g} of the row's rms")


def precision_of(backend: Backend) -> str:
    p = getattr(backend, "activation_precision", "f32")
    if p not in PRECISION_UNIT:
        raise InvalidArgument(f"backend {backend.name!r} declares activation_precision {p!r}; expected one of "
                              + ", ".join(PRECISION_UNIT))
    return p


@dataclass
class Check:
    """One check of one prompt: what was measured, against which bound, and whether it held."""

    kind: str  # "teacher-forced", "batch", "greedy"
    passed: bool
    rms: float | None = None  # relative rms error (teacher-forced, batch)
    max_rel: float | None = None  # worst logit's error over its row's rms
    max_abs: float | None = None  # worst logit's error
    exact: bool = False  # bit-equal
    agree: int = 0  # greedy: tokens equal to the reference's argmax
    total: int = 0  # greedy: tokens generated
    message: str = ""


@dataclass
class PromptResult:
    """The three checks of one prompt on one backend and cache type."""

    backend: str
    cache: str
    prompt: int
    n_tokens: int
    checks: list[Check]
    fallbacks: list[str] = field(default_factory=list)  # ops the backend left to the reference
    error: str = ""  # the model could not run: that message

    @property
    def passed(self) -> bool:
        return not self.error and all(c.passed for c in self.checks)


@dataclass
class BackendResult:
    backend: str
    bounds: Bounds | None
    prompts: list[PromptResult] = field(default_factory=list)
    node: str = ""  # the first node out of its op's bounds, when a check failed and the sweep found one
    sweep: str = ""  # what the node sweep did (ran, or why not)

    @property
    def passed(self) -> bool:
        return bool(self.prompts) and all(p.passed for p in self.prompts)


def relative_errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float, float]:
    """(rms error over the reference's rms, worst element's error over its row's rms, worst absolute
    error), for logits rows (rows, n_vocab); inf where either is not finite."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return math.inf, math.inf, math.inf
    diff = np.abs(got - ref)
    scale = float(np.sqrt(np.mean(ref**2)))
    rms = float(np.sqrt(np.mean(diff**2))) / scale if scale else (0.0 if not diff.any() else math.inf)
    row_rms = np.sqrt(np.mean(ref**2, axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        per_row = np.where(row_rms > 0, diff.max(axis=1) / np.where(row_rms > 0, row_rms, 1), 0.0)
    return rms, float(per_row.max()), float(diff.max())


def teacher_forced(got: np.ndarray, ref: np.ndarray, b: Bounds) -> Check:
    rms, rel, mx = relative_errors(got, ref)
    ok = rms <= b.rms and rel <= b.element
    why = "" if ok else (f"logits rms error {rms:.3g} (bound {b.rms:.3g})" if rms > b.rms
                         else f"a logit {rel:.3g} of its row's rms off (bound {b.element:.3g})")
    return Check("teacher-forced", ok, rms, rel, mx, bool(np.array_equal(got, ref)), message=why)


def batch_gap(decoded: np.ndarray, batched: np.ndarray, b: Bounds) -> Check:
    rms, rel, mx = relative_errors(decoded, batched)
    ok = rms <= 2 * b.rms and rel <= 2 * b.element
    why = "" if ok else f"decoded rows {rms:.3g} rms / {rel:.3g} worst off the batched ones (bound {2 * b.rms:.3g} / " \
                        f"{2 * b.element:.3g})"
    return Check("batch", ok, rms, rel, mx, bool(np.array_equal(decoded, batched)), message=why)


def greedy(tokens: Sequence[int], ref_rows: np.ndarray, b: Bounds) -> Check:
    """``tokens[j]`` was generated where the reference's row ``ref_rows[j]`` applies (same history)."""
    agree, bad = 0, []
    for j, (tok, row) in enumerate(zip(tokens, np.asarray(ref_rows, np.float64))):
        best = int(np.argmax(row))
        if tok == best:
            agree += 1
            continue
        margin = float(row[best] - row[tok])
        scale = float(np.sqrt(np.mean(row**2)))
        if not (scale and margin <= 2 * b.element * scale):
            bad.append(f"token {j}: {tok} where the reference's {best} leads by {margin:.3g} "
                       f"({margin / scale if scale else math.inf:.3g} of the row's rms; near-tie bound "
                       f"{2 * b.element:.3g})")
    return Check("greedy", not bad, agree=agree, total=len(tokens), message="; ".join(bad))


# ------------------------------------------------------------------ running a backend
@dataclass
class Setup:
    """What a certification run is: the model file, prompts, cache types, generated tokens."""

    path: str
    prompts: tuple[str, ...]
    cache_types: tuple[str, ...] = CACHE_TYPES
    tokens: int = DEFAULT_TOKENS
    reference_dir: Path | None = None  # where reference logits are cached (None: not cached)

    @property
    def n_ctx(self) -> int:
        return 256


def setup(model: str, *, prompts: int = DEFAULT_PROMPTS, cache_types: Sequence[str] = CACHE_TYPES,
          tokens: int = DEFAULT_TOKENS, reference_dir: str | Path | None = None) -> Setup:
    """Check the arguments and resolve ``model`` (a GGUF path or a catalog name) before any work."""
    from ..models.catalog import resolve
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
    from ..errors import PrismWarning
    from ..models import load
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
        from .reference_cache import ReferenceLogits
        self.setup = s
        self.reference = reference
        self.refs = ReferenceLogits(s.path, reference, s.reference_dir, lambda cache: _load(s, reference, cache))
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

    def locate(self, backend: Backend, cache: str, index: int) -> str:
        """The first node of the model's graph whose result leaves its op's bounds when it is computed on
        ``backend`` from the reference's values of its sources ("" when none does)."""
        from .model_nodes import sweep
        m = self._model(backend, cache)
        ids = self.prompt_ids()[index]
        findings = sweep(m, ids, self.reference)
        if not findings:
            return ""
        first = findings[0]
        from collections import Counter
        ops = Counter(f.op for f in findings[1:])
        more = f" (after it, out of bound too: {', '.join(f'{op} x{n}' for op, n in ops.items())})" if ops else ""
        return f"{first}{more}"

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
            on_prompt: Callable[[PromptResult], None] | None = None, sweep: bool = False) -> BackendResult:
    """Every prompt and cache type of ``s`` on ``backend``; on a failure (or with ``sweep``, on the first
    prompt anyway), the node sweep names the first node out of its op's bounds."""
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
    if failed is None and sweep and out.prompts and not out.prompts[0].error:
        failed = out.prompts[0]
    if failed is not None:
        try:
            out.node = c.locate(backend, failed.cache, failed.prompt)
            out.sweep = (f"node sweep on prompt {failed.prompt + 1}, cache {failed.cache}: "
                         + ("first node out of its op's bounds: " + out.node if out.node
                            else "every node within its op's bounds (the error builds up over the graph)"))
        except PrismError as e:
            out.sweep = f"node sweep failed: {type(e).__name__}: {e}"
    if certifier is None:
        c.close()
    return out
