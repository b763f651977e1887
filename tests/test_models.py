"""Model graphs (Gemma 3, Llama, Qwen 2/3) on tiny random models, against an independent float64
NumPy forward written here from the formulas (embedding, RMS norms, RoPE NORMAL/NEOX, grouped-query
causal attention with a sliding window, SwiGLU/GeGLU), never calling Prism's graph code; plus the KV
cache (prefill in batches and decode agree with a full recompute), samplers and refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

import prism_core as pc
from prism_core.models import Model, ModelConfigError, Sampler
from prism_core.types import GGMLType as G

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def tiny(arch: str, seed: int = 0, *, weight_type: G = G.F32, n_layer: int = 2, head_dim: int = 32):
    """Metadata and NumPy weights of a tiny model: n_embd 64, 4 query heads over 2 KV heads of ``head_dim``
    (llama.cpp's qwen2 needs 4 * head_dim == n_embd: tests/data/make_llamacpp_fixtures.py uses 16)."""
    r = np.random.default_rng(seed)
    e, nh, nkv, d, f, vocab = 64, 4, 2, head_dim, 96, 50
    meta = {"general.architecture": arch, f"{arch}.embedding_length": e, f"{arch}.block_count": n_layer,
            f"{arch}.feed_forward_length": f, f"{arch}.attention.head_count": nh,
            f"{arch}.attention.head_count_kv": nkv, f"{arch}.attention.key_length": d,
            f"{arch}.attention.value_length": d, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
            f"{arch}.context_length": 512, f"{arch}.rope.freq_base": 1000.0 if arch != "gemma3" else 1e6}
    if arch == "gemma3":
        meta["gemma3.attention.sliding_window"] = 3  # tiny, so the window matters in short tests
    w = {"token_embd.weight": r.standard_normal((vocab, e)) * 0.5, "output_norm.weight": 1 + 0.1 * r.standard_normal(e)}
    if arch != "gemma3":
        w["output.weight"] = r.standard_normal((vocab, e)) * 0.2
    for il in range(n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
        w[p + "ffn_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
        for name, (rows, cols) in {"attn_q": (nh * d, e), "attn_k": (nkv * d, e), "attn_v": (nkv * d, e),
                                   "attn_output": (e, nh * d), "ffn_gate": (f, e), "ffn_up": (f, e),
                                   "ffn_down": (e, f)}.items():
            w[p + name + ".weight"] = r.standard_normal((rows, cols)) / math.sqrt(cols)
        if arch == "qwen2":
            for name, n in (("attn_q", nh * d), ("attn_k", nkv * d), ("attn_v", nkv * d)):
                w[p + name + ".bias"] = 0.1 * r.standard_normal(n)
        if arch in ("qwen3", "gemma3"):
            w[p + "attn_q_norm.weight"] = 1 + 0.1 * r.standard_normal(d)
            w[p + "attn_k_norm.weight"] = 1 + 0.1 * r.standard_normal(d)
        if arch == "gemma3":
            w[p + "post_attention_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
            w[p + "post_ffw_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
    return meta, {k: v.astype(np.float32) for k, v in w.items()}


def to_tensors(w: dict[str, np.ndarray], weight_type: G = G.F32) -> dict[str, pc.Tensor]:
    ctx = pc.Context(mem_size=1 << 34)
    out = {}
    for k, v in w.items():
        t = weight_type if v.ndim == 2 and k != "token_embd.weight" and weight_type != G.F32 else G.F32
        out[k] = ctx.from_numpy(v, type=t, name=k)
    return out


# ---------------------------------------------------------------- the independent forward
def _rms(x, wt, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * wt


def _rope(x, pos, base, neox):  # x (tokens, heads, d)
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def reference_logits(arch: str, meta, w: dict[str, np.ndarray], ids) -> np.ndarray:
    """float64 forward from the formulas (weights as given: F32 or their dequantized values)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    e, nh, nkv = meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"], \
        meta[f"{arch}.attention.head_count_kv"]
    d, eps = meta[f"{arch}.attention.key_length"], meta[f"{arch}.attention.layer_norm_rms_epsilon"]
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][ids] * (math.sqrt(e) if arch == "gemma3" else 1.0)
    window = meta.get(f"{arch}.attention.sliding_window", 0)
    for il in range(meta[f"{arch}.block_count"]):
        p = lambda name, il=il: w[f"blk.{il}.{name}"]  # noqa: E731
        local = arch == "gemma3" and il % 6 != 5
        h = _rms(x, p("attn_norm.weight"), eps)
        q, k, v = h @ p("attn_q.weight").T, h @ p("attn_k.weight").T, h @ p("attn_v.weight").T
        if arch == "qwen2":
            q, k, v = q + p("attn_q.bias"), k + p("attn_k.bias"), v + p("attn_v.bias")
        q, k, v = q.reshape(n, nh, d), k.reshape(n, nkv, d), v.reshape(n, nkv, d)
        if arch in ("qwen3", "gemma3"):
            q, k = _rms(q, p("attn_q_norm.weight"), eps), _rms(k, p("attn_k_norm.weight"), eps)
        base = 10000.0 if local else meta[f"{arch}.rope.freq_base"]
        q, k = _rope(q, pos, base, arch != "llama"), _rope(k, pos, base, arch != "llama")
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # query head h uses kv head h // rep
        s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = (j <= i) & ((i - j < window) if local else True)
        s = np.where(visible[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", s, v).reshape(n, nh * d) @ p("attn_output.weight").T
        if arch == "gemma3":
            o = _rms(o, p("post_attention_norm.weight"), eps)
        x = x + o
        h = _rms(x, p("ffn_norm.weight"), eps)
        g, u = h @ p("ffn_gate.weight").T, h @ p("ffn_up.weight").T
        act = _gelu_tanh(g) if arch == "gemma3" else g / (1 + np.exp(-g))
        f = (act * u) @ p("ffn_down.weight").T
        if arch == "gemma3":
            f = _rms(f, p("post_ffw_norm.weight"), eps)
        x = x + f
    x = _rms(x, w["output_norm.weight"], eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T


IDS = [3, 17, 5, 42, 8, 8, 1, 30, 22, 9]


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_the_float64_forward(arch):
    meta, w = tiny(arch)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, cache_type="f32")
    got = model.logits(IDS)
    want = reference_logits(arch, meta, w, IDS)
    assert got.shape == (len(IDS), 50) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("weight_type", [G.Q8_0, G.Q4_0])
def test_quantized_weights_match_the_forward_of_their_dequantized_values(arch, weight_type):
    meta, w = tiny(arch, seed=1)
    tensors = to_tensors(w, weight_type)
    deq = {k: t.numpy() for k, t in tensors.items()}
    model = Model(tensors, meta, backend="numpy", n_ctx=64, cache_type="f32")
    want = reference_logits(arch, meta, deq, IDS)
    np.testing.assert_allclose(model.logits(IDS), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("backend", ["numba", "csimd"])
def test_every_backend_gives_the_reference_logits(backend):
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    meta, w = tiny("gemma3", seed=2)
    want = reference_logits("gemma3", meta, w, IDS)
    got = Model(to_tensors(w), meta, backend=backend, n_ctx=64, cache_type="f32").logits(IDS)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


@pytest.mark.parametrize("cache_type", ["f16", "f32", "q8_0"])
def test_prefill_in_batches_then_decode_matches_one_pass(cache_type):
    meta, w = tiny("gemma3", seed=3)
    want = reference_logits("gemma3", meta, w, IDS)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, n_batch=4, cache_type=cache_type)
    first = model.logits(IDS[:7])  # batches of 4 and 3
    rest = [model.eval([t])[-1] for t in IDS[7:]]  # one-token decode steps over the cache
    got = np.concatenate([first, np.stack(rest)])
    tol = {"f32": 1e-4, "f16": 2e-3, "q8_0": 3e-2}[cache_type]  # the cache rounds keys and values
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert model.default_sequence().n_past == len(IDS)


def test_graphs_are_planned_once_per_shape_and_reused():
    meta, w = tiny("llama", seed=4)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=512)
    model.logits(IDS[:3])
    for t in IDS[3:]:
        model.eval([t])
    shapes = list(model._graphs)
    assert (1, 256, 1) in shapes and len(shapes) == 2  # one prefill graph, one decode graph for 7 steps


def test_greedy_generation_follows_the_argmax_of_the_forward():
    meta, w = tiny("qwen3", seed=5)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, tokenizer=_DigitsTokenizer())
    ids = [3, 17, 5]
    got = [t.id for t in model.generate(ids, max_tokens=5)]
    seq = list(ids)
    for _ in range(len(got)):
        seq.append(int(np.argmax(reference_logits("qwen3", meta, w, seq)[-1])))
    assert got == seq[3:3 + len(got)] and len(got) >= 1


class _DigitsTokenizer:
    def piece_bytes(self, token, special=True):
        return f" {token}".encode()


class _Script:
    """A "sampler" that emits the given ids one per step, whatever the logits."""

    def __init__(self, ids):
        self.ids, self.n = list(ids), 0

    def __call__(self, logits, history=()):
        self.n += 1
        return self.ids[self.n - 1]


def _spm_vocabulary(n_vocab: int) -> dict:
    """An SPM vocabulary (llama.cpp adds a space prefix to SPM text) with two byte tokens, a control token
    and plain pieces."""
    tokens = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "<ctl>"] + [f"\u2581t{i}" for i in range(6, n_vocab)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 6 + [-float(i) for i in range(6, n_vocab)],
            "tokenizer.ggml.token_type": [2, 3, 3, 6, 6, 3] + [1] * (n_vocab - 6),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_generated_text_is_each_tokens_piece_as_llama_cpp_streams_it():
    """llama.cpp's command line prints llama_token_to_piece of every token: the first one keeps the space
    SPM pieces start with (the text continues the prompt), control tokens print nothing unless --special,
    and a character split over byte tokens appears once whole; cut short, its bytes show as U+FFFD."""
    meta, w = tiny("llama", seed=5)
    model = Model(to_tensors(w), {**meta, **_spm_vocabulary(50)}, backend="numpy", n_ctx=64)

    def texts(script, special=False, n=None):
        toks = model.generate([1, 7], max_tokens=n or len(script), sampler=_Script(script), special=special)
        return [t.text for t in toks]

    assert texts([8, 9]) == [" t8", " t9"]
    assert texts([8, 5, 9]) == [" t8", "", " t9"]
    assert texts([8, 5, 9], special=True) == [" t8", "<ctl>", " t9"]
    assert texts([3, 4, 8]) == ["", "\u00e9", " t8"]  # <0xC3><0xA9>: UTF-8 of e-acute
    assert texts([8, 3]) == [" t8", "\ufffd"]  # the generation ends inside the character
    assert texts([4, 8]) == ["\ufffd", " t8"]  # a continuation byte starts no character
    assert texts([8, 2, 9]) == [" t8"]  # </s> ends the generation


def test_generation_ends_on_every_token_llama_cpp_ends_on():
    """Besides the eos id, llama.cpp ends generation on tokens it knows by name ("<eos>", "<|im_end|>", ...)
    and on the metadata's eot and eom ids."""
    meta, w = tiny("llama", seed=5)
    vocab = _spm_vocabulary(50)
    vocab["tokenizer.ggml.tokens"] = vocab["tokenizer.ggml.tokens"][:9] + ["<eos>", "<|im_end|>"] + \
        vocab["tokenizer.ggml.tokens"][11:]
    model = Model(to_tensors(w), {**meta, **vocab, "tokenizer.ggml.eom_token_id": 12}, backend="numpy", n_ctx=64)
    assert model.eog_ids == {2, 9, 10, 12}
    for end in (2, 9, 10, 12):
        assert [t.id for t in model.generate([1, 7], max_tokens=3, sampler=_Script([8, end, 8]))] == [8]


def test_samplers_are_reproducible_and_respect_their_filters():
    z = np.array([0.0, 5.0, 4.0, -1.0, 4.5])
    assert Sampler.greedy()(z) == 1
    draws = [Sampler(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=9)(z) for _ in range(3)]
    assert len(set(draws)) == 1 and draws[0] in (1, 4)  # one seed, one draw; only the top 2 can come out
    s = Sampler(temperature=5.0, top_k=0, top_p=1.0, min_p=0.5, seed=1)
    assert {s(z) for _ in range(200)} <= {1, 2, 4}  # min_p 0.5 of p(5.0): 4.0 (e^-1) and 4.5 stay
    s = Sampler(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=1)
    assert {s(z) for _ in range(100)} == {1}  # p(5.0) alone exceeds 0.5
    assert Sampler.greedy().__class__(temperature=0.0, repeat_penalty=10.0)(z, history=[1]) == 4  # 5/10 < 4.5
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"min_p": 1.5}, {"top_k": -2}, {"repeat_penalty": 0.0},
                {"seed": -1}, {"temperature": float("nan")}):
        with pytest.raises(pc.InvalidArgument, match="sampler: " + next(iter(bad))):
            Sampler(**bad)


def test_bad_models_and_calls_are_refused_and_the_model_stays_usable():
    meta, w = tiny("llama", seed=6)
    with pytest.raises(ModelConfigError, match=r"general.architecture 'mamba' is not supported"):
        Model(to_tensors(w), {**meta, "general.architecture": "mamba"})
    missing = dict(meta)
    del missing["llama.block_count"]
    with pytest.raises(ModelConfigError, match=r"lacks the required key 'llama.block_count'"):
        Model(to_tensors(w), missing)
    with pytest.raises(ModelConfigError, match=r"'llama.attention.head_count' must be int, got str"):
        Model(to_tensors(w), {**meta, "llama.attention.head_count": "4"})
    broken = dict(w)
    del broken["blk.1.ffn_up.weight"]
    with pytest.raises(pc.InvalidArgument, match=r"tensor 'blk.1.ffn_up.weight' is missing"):
        Model(to_tensors(broken), meta)
    with pytest.raises(pc.InvalidArgument, match=r"'blk.0.attn_q.weight' has ne=\[64, 128, 1, 1\], the metadata "
                                                  r"implies \[64, 256, 1, 1\]"):
        Model(to_tensors(w), {**meta, "llama.attention.key_length": 64, "llama.attention.value_length": 64})
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=8, cache_type="f32")
    with pytest.raises(pc.BoundExceeded, match=r"the context holds 8 tokens; 0 are used and 9 more"):
        model.logits(list(range(9)))
    with pytest.raises(pc.InvalidArgument, match=r"token id 50 is outside the vocabulary \[0, 50\)"):
        model.logits([1, 50])
    with pytest.raises(pc.InvalidArgument, match=r"non-empty"):
        model.logits([])
    with pytest.raises(pc.InvalidArgument, match=r"exceeds the model's training context 512"):
        Model(to_tensors(w), meta, n_ctx=1024)
    np.testing.assert_allclose(model.logits(IDS[:5]), reference_logits("llama", meta, w, IDS[:5]), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("backend", ["numpy", "csimd"])
def test_sliding_window_layers_keep_a_ring_that_wraps_and_match_the_forward(backend, monkeypatch):
    """With KV_PAD 4, window 3 and batches of 4, window layers keep pad(3 + 4) = 8 cells (llama.cpp's
    iSWA sizing) while the global layer keeps all 64; 30 tokens wrap the ring three times, in batches
    of 4 and in one-token steps, and every position's logits still match the float64 forward."""
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    from prism_core.models import kv_cache
    monkeypatch.setattr(kv_cache, "KV_PAD", 4)
    meta, w = tiny("gemma3", seed=6, n_layer=6)
    ids = [int(i) for i in np.random.default_rng(6).integers(0, 50, 30)]
    want = reference_logits("gemma3", meta, w, ids)
    model = Model(to_tensors(w), meta, backend=backend, n_ctx=64, n_batch=4, cache_type="f32")
    assert [k.ne[1] for k in model.cache.k] == [8] * 5 + [64]
    first = model.logits(ids[:18])
    rest = [model.eval([t])[-1] for t in ids[18:]]
    got = np.concatenate([first, np.stack(rest)])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert model.workspace.nbytes == max(g.plan.arena_bytes for g in model._graphs.values())


def test_a_long_generation_keeps_two_graphs_per_batch_shape(monkeypatch):
    from prism_core.models import kv_cache
    monkeypatch.setattr(kv_cache, "KV_PAD", 4)  # a new decode shape every 4 tokens
    meta, w = tiny("llama", seed=7)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64)
    model.logits(IDS[:3])
    for t in IDS * 2:
        model.eval([t])
    decode = [k for k in model._graphs if k[0] == 1]
    assert decode == [(1, 20, 1), (1, 24, 1)]  # the two most recent; older ones released their memory


def test_discarded_graphs_leave_the_context_and_no_graph_holds_memory_of_its_own(monkeypatch):
    """Scoring many lengths plans many shapes: each evicted graph's tensors leave the model's context
    (they once stayed, with their inputs, forever), and inputs and logits live in the shared workspace."""
    from prism_core.models import kv_cache
    monkeypatch.setattr(kv_cache, "KV_PAD", 4)
    meta, w = tiny("llama", seed=8)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, cache_type="f32")
    counts = []
    for n in range(2, 30):
        got = model.logits(IDS[:n % len(IDS) + 1])
        counts.append(len(model.ctx.tensors))
        assert np.isfinite(got).all()
    assert len(model._graphs) <= 4 and max(counts[8:]) <= max(counts[:8])  # bounded, not growing per shape
    assert model.ctx.used < 8 * max(g.plan.naive_bytes for g in model._graphs.values())
    assert all(g.plan.protected_bytes == 0 for g in model._graphs.values())
    inputs = [t for g in model._graphs.values() for t in (g.step.tokens, g.step.mask, g.logits)]
    assert all(np.shares_memory(t.storage(), model.workspace.buffer) for t in inputs)
    want = reference_logits("llama", meta, w, IDS)  # and the graphs kept still compute the right thing
    np.testing.assert_allclose(model.logits(IDS), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_masks_written_into_given_arrays_equal_the_returned_ones():
    meta, w = tiny("gemma3", seed=9, n_layer=6)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, n_batch=4)
    model.eval(IDS[:6])
    cache = model.cache
    seq = model.default_sequence().id
    slots = cache.place([seq] * 3, [6, 7, 8])
    want, want_swa = cache.masks(slots)
    out, out_swa = np.ones_like(want), np.ones_like(want_swa)
    cache.masks(slots, out, out_swa)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(out_swa, want_swa)
    assert np.isneginf(want).any() and (want == 0).any()
    with pytest.raises(pc.InvalidArgument, match="mask output must be float16"):
        cache.masks(slots, np.zeros(want.shape, np.float32), out_swa)


@pytest.mark.parametrize("n_ids", [2, 9, 10, len(IDS)])
def test_perplexity_is_the_exp_mean_nll_of_the_forward_batch_by_batch(n_ids):
    meta, w = tiny("llama", seed=10)
    ids = (IDS * 2)[:n_ids]
    z = reference_logits("llama", meta, w, ids)[:-1]
    logp = z - z.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    want = float(np.exp(-np.mean(logp[np.arange(n_ids - 1), ids[1:]])))
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, n_batch=4, cache_type="f32")
    assert model.perplexity(ids) == pytest.approx(want, rel=1e-5)
    with pytest.raises(pc.InvalidArgument, match="at least two tokens"):
        model.perplexity(ids[:1])
    with pytest.raises(pc.BoundExceeded, match="context"):
        model.perplexity(list(range(3, 50)) * 2)
    assert model.perplexity(ids) == pytest.approx(want, rel=1e-5)  # still usable after the refusal
    model.cache.clear()
    model.eval(list(range(3, 50)) + list(range(3, 13)))  # 57 of 64 cells used: perplexity starts afresh
    assert model.perplexity(ids) == pytest.approx(want, rel=1e-5)


def test_a_workspace_gives_back_what_only_a_released_plan_needed():
    meta, w = tiny("llama", seed=11)
    model = Model(to_tensors(w), meta, backend="numpy", n_ctx=64, n_batch=8, cache_type="f32")
    small = model.workspace.nbytes
    model.logits(IDS[:8])  # every position's logits: the largest arena
    assert model.workspace.nbytes > small
    for n in range(1, 5):  # other shapes push the all-logits graph out of the cache
        model.eval(IDS[:n])
        model.cache.clear()
    assert all(k[2] == 1 for k in model._graphs)
    assert model.workspace.nbytes == max(g.plan.arena_bytes for g in model._graphs.values())
