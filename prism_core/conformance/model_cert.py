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
reference's two logits are within twice the single-logit bound. Then the model's graph is run node by node
against the reference (:mod:`.model_nodes`, on the first failing prompt or else the first one): a node
out of its op's bounds fails the certification and the first one is named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from ..plugin.base import Backend

# Short on purpose (the reference computes a 270M model at about half a token a second in a batch), and
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
K = 2.0  # slack over the quadrature estimate u sqrt(n) (Gemma 3 270M, q8 backends: 0.5-1.4 of it; docs/conformance.md)
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
    node: str = ""  # the first node out of its op's bounds, when the sweep found one
    sweep: str = ""  # what the node sweep found
    sweep_ops: dict[str, int] | None = None  # nodes out of bounds by op (None: the sweep did not run)

    @property
    def passed(self) -> bool:
        return bool(self.prompts) and all(p.passed for p in self.prompts) and not self.sweep_ops


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
