"""A model's perplexity on a text as llama.cpp's llama-perplexity measures it (``prism perplexity``).

The text is tokenized as llama.cpp's tools do (BOS first when the vocabulary adds one), cut into chunks of
``n_ctx`` tokens (each one's first token replaced by BOS), and each chunk is evaluated from an empty cache;
only the second half of each chunk is scored (every token from position n_ctx/2 + 1 on, given all before
it), so every scored token sees at least n_ctx/2 tokens of context. After each chunk the running estimate
exp(mean negative log-likelihood) is reported; the final one comes with llama.cpp's uncertainty, the
standard error of the mean log-likelihood times the perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from .imatrix import chunks_of, text_tokens

SCORE_ROWS = 64  # logits rows evaluated (and held) at once while scoring


@dataclass
class Perplexity:
    """The estimate after all chunks, its uncertainty, the tokens scored, and the running estimate after each chunk."""

    ppl: float
    uncertainty: float
    n_scored: int
    n_ctx: int
    running: list[float] = field(default_factory=list)


def _nll_rows(z: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(z)[target] per row, in float64."""
    z = z.astype(np.float64)
    m = z.max(axis=1)
    lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    return lse - z[np.arange(len(z)), targets]


def perplexity(model, text: str | Sequence[int], *, n_ctx: int = 512, n_chunks: int | None = None,
               on_chunk: Callable[[int, int, float], None] | None = None) -> Perplexity:
    """llama-perplexity's estimate of ``model`` (whose context holds ``n_ctx`` tokens) on ``text`` (a string or
    token ids). ``on_chunk(i, n, running_ppl)`` is called after each chunk."""
    ids, bos = text_tokens(model, text)
    if len(ids) < 2 * n_ctx:
        raise InvalidArgument(f"perplexity: the text has {len(ids)} tokens; llama-perplexity needs at least "
                              f"2 * ctx-size = {2 * n_ctx}")
    if n_ctx > model.cache.n_ctx:
        raise InvalidArgument(f"perplexity: ctx-size {n_ctx} exceeds the model's context of {model.cache.n_ctx}")
    chunks = chunks_of(ids, n_ctx, n_chunks, bos)
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    seq = model.default_sequence()  # the calling thread's, as model.logits
    for i, c in enumerate(chunks):
        seq.clear()
        seq.eval(c[:first])  # the unscored first half: context only
        for lo in range(first, n_ctx - 1, SCORE_ROWS):
            hi = min(n_ctx - 1, lo + SCORE_ROWS)
            z = seq.eval(c[lo:hi], all_logits=True)
            v = _nll_rows(z, np.asarray(c[lo + 1:hi + 1]))
            nll += float(v.sum())
            nll2 += float((v * v).sum())
        count += n_ctx - first - 1
        running.append(math.exp(nll / count))
        if on_chunk is not None:
            on_chunk(i + 1, len(chunks), running[-1])
    mean, mean2 = nll / count, nll2 / count
    var = mean2 - mean * mean
    ppl = math.exp(mean)
    unc = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else 0.0
    return Perplexity(ppl, unc, count, n_ctx, running)
