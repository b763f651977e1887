"""Fine-tuning (#27) on tiny random models of every architecture: the training forward against an independent
float64 forward (tests/test_models.py's reference_logits), fresh adapters reproducing the base logits bit for
bit, LoRA gradients against float64 finite differences of that forward (also through quantized weights on
every backend), gradient accumulation, the token windows, checkpoints and bit-exact resume, full
fine-tuning, and the refusals of bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from finetune_models import text, write_tiny
from helpers import slow_on_numba
from test_models import ARCHS, reference_logits, tiny, to_tensors

import prism_core as pc
from prism_core.autodiff import reset
from prism_core.finetune import (
    FinetuneConfig,
    TokenWindows,
    TrainingDiverged,
    build_forward,
    finetune,
    new_lora,
    window_count,
)
from prism_core.finetune.checkpoint import CheckpointMismatch
from prism_core.models import Model
from prism_core.ops import build as B
from prism_core.types import GGMLType as G

N_CTX, N_WIN = 12, 2  # windows longer than the Gemma fixture's sliding window of 3
AVAILABLE = {b.name for b in pc.backends() if b.available}


def model_of(arch: str, seed: int = 0, backend: str = "numpy", weight_type: G = G.F32) -> tuple[Model, dict, dict]:
    meta, w = tiny(arch, seed)
    tensors = to_tensors(w, weight_type)
    return Model(tensors, meta, backend=backend, n_ctx=64, cache_type="f32"), meta, {
        k: t.numpy() for k, t in tensors.items()}


def windows(seed: int = 1, n: int = N_WIN) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of N_CTX ids and their next tokens."""
    r = np.random.default_rng(seed)
    ids = r.integers(3, 50, (n, N_CTX + 1))
    return ids[:, :-1].astype(np.int32), ids[:, 1:].astype(np.int32)


def effective(w: dict, lora, scale: float) -> dict:
    """The float64 weights with each adapter merged: W + scale * B A (NumPy shapes)."""
    out = dict(w)
    for name, (a, b) in lora.pairs.items():
        out[name] = w[name].astype(np.float64) + scale * (b.numpy().astype(np.float64) @ a.numpy().astype(np.float64))
    return out


def reference_loss(arch: str, meta: dict, w: dict, ids: np.ndarray, nxt: np.ndarray) -> float:
    """Mean next-token cross-entropy of the float64 forward over every position of every window."""
    total = 0.0
    for row, labels in zip(ids, nxt):
        z = reference_logits(arch, meta, w, list(row))
        m = z.max(axis=1)
        lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        total += float((lse - z[np.arange(len(labels)), labels]).sum())
    return total / ids.size


def forward_logits(model: Model, ids: np.ndarray, adapters=None, backend=None) -> np.ndarray:
    fw = build_forward(model, ids.shape[1], ids.shape[0], adapters)
    fw.tokens.set(ids)
    pc.plan(fw.logits, backend or model.backend).compute()
    return fw.logits.numpy().reshape(ids.shape[0], ids.shape[1], -1)


def loss_and_grads(model: Model, params: list, ids: np.ndarray, nxt: np.ndarray, adapters=None, weights=None,
                   backend=None) -> tuple[float, dict[str, np.ndarray]]:
    """The training graph's loss (ggml-opt's cross-entropy over one-hot next tokens) and the gradients of
    ``params`` from build_backward."""
    fw = build_forward(model, ids.shape[1], ids.shape[0], adapters, weights)
    fw.tokens.set(ids)
    onehot = np.zeros((nxt.size, model.hparams.n_vocab), np.float32)
    onehot[np.arange(nxt.size), nxt.reshape(-1)] = 1.0
    labels = model.ctx.from_numpy(onehot)
    loss = B.cross_entropy_loss(fw.logits, labels).set_loss()
    graph = pc.Graph(capacity=1 << 14).expand(loss)
    pc.build_backward(graph)
    reset(graph)  # the loss's gradient to 1
    pc.plan(graph, backend or model.backend).compute()
    return float(loss.numpy()[0]), {p.name: graph.grad(p).numpy() for p in params}


def randomize_b(lora, seed: int = 7, scale: float = 0.3) -> None:
    """B away from zero, so that A's gradient is not zero and the adapters change the logits."""
    r = np.random.default_rng(seed)
    for _, b in lora.pairs.values():
        b.set((scale * r.standard_normal(b.shape)).astype(np.float32))


# ---------------------------------------------------------------- the training forward
@pytest.mark.parametrize("arch", ARCHS)
def test_the_training_forward_is_the_float64_forward_of_each_window(arch):
    model, meta, w = model_of(arch)
    ids, _ = windows()
    got = forward_logits(model, ids)
    for i in range(len(ids)):
        want = reference_logits(arch, meta, w, list(ids[i]))
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_adapters_reproduce_the_base_logits_bit_for_bit(arch, tmp_path):
    """B starts at zero: every adapter product adds exactly 0, in the training forward and in inference."""
    model, meta, w = model_of(arch, backend="csimd" if "csimd" in AVAILABLE else "numpy")
    ids, _ = windows()
    lora = new_lora(model, ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"], 4,
                    8.0, seed=3)
    assert np.array_equal(forward_logits(model, ids, lora.products()), forward_logits(model, ids))
    path = tmp_path / "fresh.gguf"
    lora.save(path, arch)
    adapted = Model(model.weights.tensors, meta, backend=model.backend, n_ctx=64, cache_type="f32",
                    lora=pc.models.lora.open_adapters([(path, 1.0)], model.ctx))
    assert np.array_equal(adapted.logits(list(ids[0])), model.logits(list(ids[0])))


def test_the_adapted_training_forward_is_the_float64_forward_of_the_merged_weights():
    model, meta, w = model_of("qwen2", seed=4)
    lora = new_lora(model, ["attn_q", "attn_v", "ffn_down"], 3, 6.0, seed=5)
    randomize_b(lora)
    ids, _ = windows(2)
    got = forward_logits(model, ids, lora.products())
    want = reference_logits("qwen2", meta, effective(w, lora, 2.0), list(ids[1]))
    np.testing.assert_allclose(got[1], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert np.abs(want - reference_logits("qwen2", meta, w, list(ids[1]))).max() > 0.1  # the adapters matter


# ---------------------------------------------------------------- gradients
def directional_check(loss_at, grads: dict[str, np.ndarray], shapes: dict[str, tuple], seed: int,
                      n_dirs: int = 3, h: float = 1e-3) -> list[tuple[float, float, float]]:
    """(analytic, float64 central difference, the gradient's norm) of the loss along random unit directions
    of all parameters at once: |analytic - numeric| / norm is the error relative to the gradient's size."""
    r = np.random.default_rng(seed)
    norm_g = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    out = []
    for _ in range(n_dirs):
        d = {k: r.standard_normal(s) for k, s in shapes.items()}
        norm = math.sqrt(sum(float((v * v).sum()) for v in d.values()))
        d = {k: v / norm for k, v in d.items()}
        analytic = sum(float((grads[k].astype(np.float64) * d[k]).sum()) for k in d)
        numeric = (loss_at(d, h) - loss_at(d, -h)) / (2 * h)
        out.append((analytic, numeric, norm_g))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_gradients_match_float64_finite_differences(arch):
    """The gradients build_backward gives A and B (numpy backend) against central differences of the
    independent float64 forward with the adapters merged, along random directions of all A and B at once."""
    model, meta, w = model_of(arch, seed=2)
    lora = new_lora(model, ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"], 2,
                    4.0, seed=6)
    randomize_b(lora, scale=0.2)
    ids, nxt = windows(3)
    params = lora.params
    loss, grads = loss_and_grads(model, params, ids, nxt, lora.products())
    base = {p.name: p.numpy().astype(np.float64) for p in params}
    assert math.isclose(loss, reference_loss(arch, meta, effective(w, lora, lora.scale), ids, nxt), rel_tol=2e-4)

    def loss_at(d, h):
        moved = dict(w)
        for name, (a, b) in lora.pairs.items():
            av, bv = base[a.name] + h * d[a.name], base[b.name] + h * d[b.name]
            moved[name] = w[name].astype(np.float64) + lora.scale * (bv @ av)
        return reference_loss(arch, meta, moved, ids, nxt)

    for analytic, numeric, norm in directional_check(loss_at, grads, {k: v.shape for k, v in base.items()}, seed=8):
        assert abs(analytic - numeric) <= 1e-3 * norm, (analytic, numeric, norm)
    assert all(np.abs(g).max() > 0 for g in grads.values())  # A's gradients too, B being non-zero


@pytest.mark.parametrize("backend", slow_on_numba(["numpy", "numba", "csimd"]))
def test_gradients_pass_through_quantized_weights_on_every_backend(backend):
    """Q8_0 matrices stay quantized and frozen; the gradient to the activations goes through them
    (OUT_PROD with a block-type a), on each backend that claims it, against the float64 forward of the
    dequantized weights. csimd quantizes the activations of its products to Q8_0 as ggml's CPU does,
    which moves its loss and gradients by about 1e-3."""
    if backend not in AVAILABLE:
        pytest.skip(f"{backend} is not available here")
    model, meta, w = model_of("gemma3", seed=9, backend=backend, weight_type=G.Q8_0)
    assert model.weights.tensors["blk.0.ffn_down.weight"].type == G.Q8_0
    lora = new_lora(model, ["attn_q", "attn_v", "ffn_up"], 2, 2.0, seed=10)
    randomize_b(lora, scale=0.2)
    ids, nxt = windows(4)
    loss, grads = loss_and_grads(model, lora.params, ids, nxt, lora.products())
    tol = 1e-2 if backend == "csimd" else 1e-3
    assert math.isclose(loss, reference_loss("gemma3", meta, effective(w, lora, lora.scale), ids, nxt), rel_tol=tol)
    base = {p.name: p.numpy().astype(np.float64) for p in lora.params}

    def loss_at(d, h):
        moved = dict(w)
        for name, (a, b) in lora.pairs.items():
            moved[name] = w[name].astype(np.float64) + lora.scale * (
                (base[b.name] + h * d[b.name]) @ (base[a.name] + h * d[a.name]))
        return reference_loss("gemma3", meta, moved, ids, nxt)

    for analytic, numeric, norm in directional_check(loss_at, grads, {k: v.shape for k, v in base.items()}, seed=11):
        assert abs(analytic - numeric) <= tol * norm, (analytic, numeric, norm)


def test_accumulating_gradients_over_physical_batches_is_one_larger_batch():
    """batch 4 in graphs of 2 windows (two physical batches accumulated per AdamW step) against graphs of 4:
    the same steps, to float32 summation order."""
    results = []
    for ubatch in (2, 4):
        model, _, _ = model_of("llama", seed=12)
        cfg = FinetuneConfig(rank=2, n_ctx=8, batch=4, ubatch=ubatch, epochs=2, lr=1e-2, val_split=0.25)
        res = finetune(model, np.random.default_rng(5).integers(3, 50, 160), cfg, silent=True)
        results.append((res.history, [p.numpy() for p in res.lora.params]))
    (h2, p2), (h4, p4) = results
    for a, b in zip(p2, p4):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert h2[-1].train_loss[0] == pytest.approx(h4[-1].train_loss[0], rel=1e-5)
    assert np.abs(p2[1]).max() > 1e-3  # B moved: the steps did something


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_sparse_labels_are_the_one_hot_labels(backend):
    """An optimizer context with sparse labels (I32 next tokens) trains as ggml-opt's F32 one-hot labels do:
    the same losses, accuracies and steps, on every backend (its cross-entropy kernels take class indices)."""
    if backend not in AVAILABLE:
        pytest.skip(f"{backend} is not available here")
    from prism_core.train.optimizer import AdamWParams, OptContext, OptimizerParams
    runs = []
    for sparse in (False, True):
        model, _, _ = model_of("qwen3", seed=19, backend=backend)
        lora = new_lora(model, ["attn_q", "ffn_up"], 2, 4.0, seed=20)
        data = TokenWindows(np.random.default_rng(21).integers(3, 50, 100), N_CTX, 50, stride=N_CTX)
        fw = build_forward(model, N_CTX, 2, lora.products())
        oc = OptContext(model.ctx, fw.tokens, fw.logits, "cross_entropy", "adamw", 1, backend=backend,
                        get_opt_pars=OptimizerParams(adamw=AdamWParams(alpha=1e-2)), sparse_labels=sparse)
        assert oc.labels.type == (G.I32 if sparse else G.F32)
        result = pc.train.Result()
        for i in range(3):
            oc.alloc(True)
            data.get_batch(oc.inputs, oc.labels, i)
            oc.eval(result)
        runs.append((result.losses, result.ncorrect, [p.numpy() for p in lora.params]))
    (l0, c0, p0), (l1, c1, p1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    assert c1 == c0
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_class_index_outside_the_vocabulary_is_refused_on_every_backend():
    for backend in sorted(AVAILABLE):
        ctx = pc.Context()
        logits = ctx.from_numpy(np.zeros((4, 10), np.float32))
        loss = B.cross_entropy_loss(logits, ctx.from_numpy(np.array([1, 2, 10, 3], np.int32)))
        with pytest.raises(pc.InvalidArgument, match=r"class index .*outside \[0, 10\)"):
            pc.plan(loss, backend).compute()


# ---------------------------------------------------------------- the data
def test_token_windows_are_llama_cpps():
    ids = np.arange(3, 40) % 50
    ds = TokenWindows(ids, n_ctx=8, n_vocab=50)
    assert ds.stride == 4 and ds.ndata == window_count(37, 8, 4) == (37 - 8 - 1) // 4 == 7
    assert np.array_equal(ds.data.numpy()[2], ids[8:16]) and np.array_equal(ds.labels.numpy()[2], ids[9:17])
    ctx = pc.Context()
    data, labels = ctx.new_tensor(G.I32, (8, 2)), ctx.new_tensor(G.F32, (50, 16))
    ds.permutation[:] = [3, 0, 1, 2, 4, 5, 6]
    ds.get_batch(data, labels, 0)
    assert np.array_equal(data.numpy()[0], ids[12:20]) and np.array_equal(data.numpy()[1], ids[0:8])
    onehot = labels.numpy()
    assert np.array_equal(onehot.sum(axis=1), np.ones(16)) and np.array_equal(onehot.argmax(axis=1),
                                                                              np.concatenate([ids[13:21], ids[1:9]]))


def test_a_text_shorter_than_one_window_is_refused_with_the_count_it_needs():
    with pytest.raises(pc.InvalidArgument, match=r"20 tokens long, shorter than one training window.*at least 25"):
        TokenWindows(np.arange(20), n_ctx=16, n_vocab=50)
    with pytest.raises(pc.InvalidArgument, match="outside the vocabulary"):
        TokenWindows(np.arange(100), n_ctx=16, n_vocab=50)
    with pytest.raises(pc.InvalidArgument, match="fewer than one batch of 8"):
        TokenWindows(np.arange(40) % 50, n_ctx=8, n_vocab=50, multiple=8)


# ---------------------------------------------------------------- runs, checkpoints, resume
def _run(tmp_path, epochs, *, resume=False, name="ck.gguf", backend="csimd", lr=5e-3, callback=None, seed=0,
         optimizer="adamw"):
    model, _, _ = model_of("gemma3", seed=13, backend=backend if backend in AVAILABLE else "numpy")
    cfg = FinetuneConfig(rank=4, alpha=8.0, n_ctx=8, batch=2, epochs=epochs, lr=lr, val_split=0.2, seed=seed,
                         targets=["attn_q", "attn_v", "ffn_down"], optimizer=optimizer)
    ids = np.random.default_rng(14).integers(3, 50, 120)
    return finetune(model, ids, cfg, checkpoint=tmp_path / name, resume=resume, silent=True, callback=callback)


@pytest.mark.parametrize("backend", ["numpy", "csimd"])
def test_resume_continues_bit_for_bit(tmp_path, backend):
    straight = _run(tmp_path, 3, name="a.gguf", backend=backend)
    _run(tmp_path, 1, name="b.gguf", backend=backend)
    resumed = _run(tmp_path, 3, name="b.gguf", backend=backend, resume=True)
    assert resumed.resumed_from == 1 and resumed.history == straight.history
    for p, q in zip(straight.lora.params, resumed.lora.params):
        assert p.name == q.name and np.array_equal(p.numpy(), q.numpy()), p.name
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_an_interrupted_run_leaves_the_last_checkpoint_intact_and_resumable(tmp_path):
    _run(tmp_path, 1, name="ck.gguf")
    before = (tmp_path / "ck.gguf").read_bytes()
    calls = []

    def interrupt(*args):
        calls.append(1)
        if len(calls) == 3:  # in the middle of epoch 2
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, 3, name="ck.gguf", resume=True, callback=interrupt)
    assert (tmp_path / "ck.gguf").read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))
    straight = _run(tmp_path, 2, name="other.gguf")
    assert _run(tmp_path, 2, name="ck.gguf", resume=True).history == straight.history


def test_a_diverging_learning_rate_stops_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path):
    _run(tmp_path, 1, name="ck.gguf", optimizer="sgd")
    before = (tmp_path / "ck.gguf").read_bytes()
    with pytest.raises(TrainingDiverged, match=r"loss became (nan|inf).*lower the learning rate.*ck\.gguf "
                                               r"\(after epoch 1\), is kept"):
        _run(tmp_path, 3, name="ck.gguf", resume=True, lr=1e30, optimizer="sgd")
    assert (tmp_path / "ck.gguf").read_bytes() == before


def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(tmp_path):
    _run(tmp_path, 1, name="ck.gguf")
    model, _, _ = model_of("gemma3", seed=13)
    ids = np.random.default_rng(14).integers(3, 50, 120)
    other = FinetuneConfig(rank=2, alpha=8.0, n_ctx=8, batch=2, epochs=2, lr=5e-3, val_split=0.2, seed=0,
                           targets=["attn_q", "attn_v", "ffn_down"])
    with pytest.raises(CheckpointMismatch, match="setting rank is 4, this run's is 2"):
        finetune(model, ids, other, checkpoint=tmp_path / "ck.gguf", resume=True, silent=True)
    with pytest.raises(CheckpointMismatch, match="data tokens_sha256"):
        finetune(model, ids[::-1].copy(), FinetuneConfig(**{**other.__dict__, "rank": 4}),
                 checkpoint=tmp_path / "ck.gguf", resume=True, silent=True)


def test_training_lowers_the_validation_loss_and_reports_perplexity(tmp_path):
    path = write_tiny(tmp_path / "m.gguf", "llama", seed=15)
    model = pc.models.load(path, backend="csimd" if "csimd" in AVAILABLE else "numpy", n_ctx=32)
    lines = []

    class Out:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    res = finetune(model, text(200), FinetuneConfig(rank=4, n_ctx=16, epochs=2, lr=3e-3, val_split=0.2),
                   stream=Out())
    first, last = res.history[0].val_loss[0], res.history[-1].val_loss[0]
    assert last < first and res.val_perplexity == pytest.approx(math.exp(last))
    assert "epoch 2/2: train loss" in "".join(lines) and "validation loss" in "".join(lines)
    assert f"perplexity {math.exp(last):.4g}" in "".join(lines)


# ---------------------------------------------------------------- full fine-tuning
def test_full_fine_tuning_gradients_match_float64_finite_differences():
    model, meta, w = model_of("gemma3", seed=16)
    from prism_core.finetune.session import trainable_copies
    params = trainable_copies(model)
    assert "token_embd.weight" not in params and "blk.1.post_ffw_norm.weight" in params
    ids, nxt = windows(5)
    _, grads = loss_and_grads(model, list(params.values()), ids, nxt, weights=params)
    base = {k: w[k].astype(np.float64) for k in params}

    def loss_at(d, h):
        return reference_loss("gemma3", meta, {**w, **{k: base[k] + h * d[k] for k in base}}, ids, nxt)

    for analytic, numeric, norm in directional_check(loss_at, grads, {k: v.shape for k, v in base.items()}, seed=17,
                                                     n_dirs=2):
        assert abs(analytic - numeric) <= 1e-3 * norm, (analytic, numeric, norm)


def test_full_fine_tuning_writes_a_complete_model_in_the_original_types(tmp_path):
    from prism_core.finetune.export import save_full
    path = write_tiny(tmp_path / "m.gguf", "qwen3", seed=18, weight_type=G.F16)
    model = pc.models.load(path, backend="csimd" if "csimd" in AVAILABLE else "numpy", n_ctx=32)
    res = finetune(model, text(120), FinetuneConfig(full=True, n_ctx=16, epochs=2, lr=1e-3, val_split=0.2),
                   silent=True)
    assert res.history[-1].train_loss[0] < res.history[0].train_loss[0]
    save_full(model.meta, model.weights.tensors, res.full, tmp_path / "out.gguf")
    src, out = pc.gguf.load(path), pc.gguf.load(tmp_path / "out.gguf")
    assert list(out.tensors) == list(src.tensors) and dict(out.meta_types) == dict(src.meta_types)
    assert all(np.array_equal(out.meta[k], src.meta[k]) for k in src.meta)
    for name, t in src.tensors.items():
        o = out.tensors[name]
        assert o.type == t.type and o.ne == t.ne
        same = np.array_equal(o.raw(), t.raw())
        assert same == (name not in res.full), name  # every trained tensor moved, every other one is the file's
    np.testing.assert_array_equal(out.tensors["blk.0.attn_q.weight"].numpy(),
                                  res.full["blk.0.attn_q.weight"].numpy().astype(np.float16).astype(np.float32))
    trained = pc.models.load(tmp_path / "out.gguf", backend="numpy", n_ctx=32)
    assert trained.perplexity(text(1, seed=9)) < model.perplexity(text(1, seed=9))


def test_a_full_fine_tune_of_a_quantized_model_is_refused_with_the_reason():
    model, _, _ = model_of("llama", weight_type=G.Q8_0)
    mark = model.ctx.mark()
    with pytest.raises(pc.TypeMismatch, match=r"\S+\.weight is q8_0.*dequantize the model first.*LoRA"):
        finetune(model, np.arange(200) % 50, FinetuneConfig(full=True, n_ctx=8), silent=True)
    assert model.ctx.mark() == mark  # nothing half-built stays


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("kw", "match"), [
    ({"rank": 0}, "rank must be a positive int, got 0"),
    ({"rank": 65}, r"rank 65 exceeds the size of blk\.0\.attn_q\.weight \(ne=\[64, 128\]\).*at most 64"),
    ({"targets": ["attn_qkv"]}, r"no matrix 'blk\.0\.attn_qkv\.weight'; its layers' matrices are attn_q, "),
    ({"targets": "attn_q,"}, "targets must be a non-empty list"),
    ({"n_ctx": 1000}, "exceeds the model's training context 512"),
    ({"lr": -1.0}, "learning rate must be > 0"),
    ({"val_split": 1.0}, r"val_split must be in \[0, 1\)"),
    ({"batch": 4, "ubatch": 3}, "ubatch must be a positive divisor of batch=4"),
    ({"optimizer": "lbfgs"}, "unknown optimizer 'lbfgs'"),
])
def test_bad_settings_are_refused_naming_the_setting(kw, match):
    model, _, _ = model_of("llama")
    mark = model.ctx.mark()
    with pytest.raises(pc.InvalidArgument, match=match):
        finetune(model, np.arange(3000) % 47 + 3, FinetuneConfig(**{"n_ctx": 8, **kw}), silent=True)
    assert model.ctx.mark() == mark
