"""LoRA adapters as files (llama.cpp's LoRA GGUF format), applied unmerged by models.load(lora=...) and
`prism run --lora`, merged by `prism export-lora`, trained by `prism finetune`; and the refusals: a file that
is not an adapter, an alpha llama.cpp would abort on, half a pair, an adapter made for another model."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from finetune_models import text, write_tiny
from test_models import reference_logits, tiny

import prism_core as pc
from prism_core.cli import main
from prism_core.finetune import new_lora
from prism_core.gguf import lora as lora_file
from prism_core.gguf.format import V
from prism_core.models import load
from prism_core.quant import quantize
from prism_core.types import GGMLType as G

IDS = [1, 4, 24, 12, 9, 4, 7, 5, 24, 4, 23, 5]
AVAILABLE = {b.name for b in pc.backends() if b.available}
FAST = "csimd" if "csimd" in AVAILABLE else "numpy"


def adapter(tmp_path, model_path, name="a.gguf", targets=("attn_q", "attn_v", "ffn_down"), rank=3, alpha=6.0,
            seed=0, b_scale=0.3):
    """An adapter on ``model_path``'s model with random A and B (so that it changes the logits)."""
    model = load(model_path, backend="numpy", n_ctx=32)
    lo = new_lora(model, targets, rank, alpha or 1.0, seed)
    lo.alpha = alpha  # 0 too: llama.cpp's "no alpha", the user's scale alone
    r = np.random.default_rng(seed + 100)
    for _, b in lo.pairs.values():
        b.set((b_scale * r.standard_normal(b.shape)).astype(np.float32))
    path = tmp_path / name
    lo.save(path, model.hparams.arch)
    return path, {n: (a.numpy(), b.numpy()) for n, (a, b) in lo.pairs.items()}


def merged_weights(model_path, pairs, scale) -> dict[str, np.ndarray]:
    f = pc.gguf.load(model_path)
    w = {k: t.numpy().astype(np.float64) for k, t in f.tensors.items()}
    for name, (a, b) in pairs.items():
        w[name] = w[name] + scale * (b.astype(np.float64) @ a.astype(np.float64))
    return w


@pytest.fixture
def tiny_llama(tmp_path):
    return write_tiny(tmp_path / "llama.gguf", "llama", seed=21)


# ---------------------------------------------------------------- the format
def test_an_adapter_has_llama_cpps_keys_types_names_and_orientation(tmp_path, tiny_llama):
    path, pairs = adapter(tmp_path, tiny_llama, rank=3, alpha=6.0)
    f = pc.gguf.load(path)
    assert f.meta["general.type"] == "adapter" and f.meta["adapter.type"] == "lora"
    assert f.meta["general.architecture"] == "llama"
    assert f.meta_types["adapter.lora.alpha"] == V.FLOAT32 and f.meta["adapter.lora.alpha"] == 6.0
    assert set(f.tensors) == {f"blk.{il}.{t}.weight.lora_{ab}" for il in (0, 1) for t in ("attn_q", "attn_v",
                                                                                            "ffn_down") for ab in "ab"}
    # PEFT's lora_A.weight (r, n_in) and lora_B.weight (n_out, r) in NumPy order: ne [n_in, r] and [r, n_out]
    assert f.tensors["blk.0.attn_q.weight.lora_a"].ne[:2] == (64, 3)
    assert f.tensors["blk.0.attn_q.weight.lora_b"].ne[:2] == (3, 128)
    assert f.tensors["blk.1.ffn_down.weight.lora_a"].ne[:2] == (96, 3)
    assert all(t.type == G.F32 for t in f.tensors.values())
    got = lora_file.read(path)
    assert got.arch == "llama" and got.alpha == 6.0 and got.scale("blk.0.attn_q.weight", 0.5) == 0.5 * 6.0 / 3
    np.testing.assert_array_equal(got.pairs["blk.1.attn_v.weight"][1].numpy(), pairs["blk.1.attn_v.weight"][1])


def _rewrite(src, dst, *, meta_edit=None, drop=()):
    f = pc.gguf.load(src)
    meta = {k: (f.meta[k], f.meta_types[k]) for k in f.meta}
    if meta_edit:
        meta_edit(meta)
    pc.gguf.save(dst, {k: t for k, t in f.tensors.items() if k not in drop}, meta)
    return dst


@pytest.mark.parametrize(("edit", "drop", "match"), [
    (lambda m: m.update({"adapter.lora.alpha": (6, V.UINT32)}), (),
     "adapter.lora.alpha must be FLOAT32 .llama.cpp aborts on anything else., has type UINT32"),
    (lambda m: m.pop("general.type"), (), "not a LoRA adapter: the metadata key 'general.type' is missing"),
    (lambda m: m.update({"general.type": ("model", V.STRING)}), (), "general.type is 'model', expected 'adapter'"),
    (lambda m: m.update({"adapter.type": ("control_vector", V.STRING)}), (), "adapter.type is 'control_vector'"),
    (None, ("blk.1.attn_v.weight.lora_b",), r"the LoRA pair of 'blk\.1\.attn_v\.weight' lacks "
                                            r"blk\.1\.attn_v\.weight\.lora_b"),
])
def test_files_llama_cpp_would_refuse_or_abort_on_are_refused(tmp_path, tiny_llama, edit, drop, match):
    path, _ = adapter(tmp_path, tiny_llama)
    bad = _rewrite(path, tmp_path / "bad.gguf", meta_edit=edit, drop=drop)
    with pytest.raises(lora_file.AdapterError, match=match):
        lora_file.read(bad)
    with pytest.raises(lora_file.AdapterError, match=match):
        load(tiny_llama, backend="numpy", n_ctx=32, lora=[(bad, 1.0)])


def test_a_model_file_is_not_an_adapter(tiny_llama):
    with pytest.raises(lora_file.AdapterError, match="general.type' is missing"):
        lora_file.read(tiny_llama)


def test_an_adapter_made_for_another_model_is_refused_on_load_naming_the_tensor(tmp_path, tiny_llama):
    gemma = write_tiny(tmp_path / "gemma.gguf", "gemma3", seed=22)
    narrow = write_tiny(tmp_path / "narrow.gguf", "llama", seed=23, head_dim=16)  # attn_q ne [64, 64]
    path, _ = adapter(tmp_path, tiny_llama)
    with pytest.raises(lora_file.AdapterError, match="the adapter is for a 'llama' model, this model is 'gemma3'"):
        load(gemma, backend="numpy", n_ctx=32, lora=[(path, 1.0)])
    with pytest.raises(pc.ShapeMismatch, match=r"blk\.\d\.attn_q\.weight: the model's matrix has ne=\[64, 64\] but "
                                                r"the adapter has lora_a ne=\[64, 3\], lora_b ne=\[3, 128\]"):
        load(narrow, backend="numpy", n_ctx=32, lora=[(path, 1.0)])
    qwen = write_tiny(tmp_path / "qwen.gguf", "qwen2", seed=24)
    bias = _rewrite(path, tmp_path / "renamed.gguf", meta_edit=lambda m: m.update(
        {"general.architecture": ("qwen2", V.STRING)}))
    f = pc.gguf.load(bias)
    tensors = dict(f.tensors)
    tensors["blk.7.attn_q.weight.lora_a"] = tensors.pop("blk.0.attn_q.weight.lora_a")
    tensors["blk.7.attn_q.weight.lora_b"] = tensors.pop("blk.0.attn_q.weight.lora_b")
    pc.gguf.save(tmp_path / "deep.gguf", tensors, f.meta)
    with pytest.raises(lora_file.AdapterError, match=r"adapts 'blk\.7\.attn_q\.weight', which this model does not "
                                                      "have"):
        load(qwen, backend="numpy", n_ctx=32, lora=[(tmp_path / "deep.gguf", 1.0)])


# ---------------------------------------------------------------- unmerged application
def test_adapters_apply_unmerged_with_llama_cpps_scale(tmp_path, tiny_llama):
    """logits with the adapter at user scale s = the float64 forward of W + s alpha/r B A; two adapters add;
    alpha 0 means the user's scale alone; set_lora swaps them without reloading."""
    path, pairs = adapter(tmp_path, tiny_llama, rank=3, alpha=6.0)
    path2, pairs2 = adapter(tmp_path, tiny_llama, "b.gguf", targets=("ffn_up",), rank=2, alpha=0.0, seed=5)
    meta, _ = tiny("llama", 21)
    model = load(tiny_llama, backend="numpy", n_ctx=32, cache_type="f32", lora=[(path, 0.5), (path2, 0.25)])
    w = merged_weights(tiny_llama, pairs, 0.5 * 6.0 / 3)
    w = {**w, **{k: v for k, v in merged_weights(tiny_llama, pairs2, 0.25).items() if k in pairs2}}
    want = reference_logits("llama", meta, w, IDS)
    got = model.logits(IDS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    base = load(tiny_llama, backend="numpy", n_ctx=32, cache_type="f32").logits(IDS)
    assert np.abs(got - base).max() > 0.1
    model.set_lora([])
    assert np.array_equal(model.logits(IDS), base)


# ---------------------------------------------------------------- merging (export-lora)
def test_export_lora_of_an_f32_model_is_the_unmerged_model(tmp_path, tiny_llama):
    path, pairs = adapter(tmp_path, tiny_llama)
    out = tmp_path / "merged.gguf"
    assert main(["export-lora", str(tiny_llama), "--lora-scaled", str(path), "0.5", "-o", str(out)]) == 0
    src, merged = pc.gguf.load(tiny_llama), pc.gguf.load(out)
    assert list(merged.tensors) == list(src.tensors)
    want = merged_weights(tiny_llama, pairs, 0.5 * 6.0 / 3)
    for name, t in merged.tensors.items():
        assert t.type == src.tensors[name].type
        if name in pairs:
            np.testing.assert_allclose(t.numpy(), want[name], rtol=1e-6, atol=1e-6)
        else:
            assert np.array_equal(t.raw(), src.tensors[name].raw())
    unmerged = load(tiny_llama, backend=FAST, n_ctx=32, cache_type="f32", lora=[(path, 0.5)]).logits(IDS)
    np.testing.assert_allclose(load(out, backend=FAST, n_ctx=32, cache_type="f32").logits(IDS), unmerged,
                               rtol=1e-5, atol=1e-5 * np.abs(unmerged).max())


def test_export_lora_requantizes_each_merged_matrix_to_its_type(tmp_path):
    """Q8_0 matrices merged in float64 from their dequantized values and quantized again with ggml's
    reference quantizer; the merged model's logits then differ from the unmerged ones by that rounding
    alone: the float64 forward of the requantized weights is the merged model's, and both lie far closer
    to each other than to the base."""
    base = write_tiny(tmp_path / "q8.gguf", "gemma3", seed=25, weight_type=G.Q8_0)
    path, pairs = adapter(tmp_path, base, targets=("attn_q", "ffn_gate"), b_scale=0.5)
    out = tmp_path / "merged.gguf"
    assert main(["export-lora", str(base), "--lora", str(path), "-o", str(out)]) == 0
    merged = pc.gguf.load(out)
    want = merged_weights(base, pairs, 6.0 / 3)
    for name in pairs:
        t = merged.tensors[name]
        assert t.type == G.Q8_0
        assert np.array_equal(t.raw().reshape(-1), quantize(want[name].astype(np.float32), G.Q8_0).reshape(-1))
    meta, _ = tiny("gemma3", 25)
    got = load(out, backend="numpy", n_ctx=32, cache_type="f32").logits(IDS)
    requantized = {k: t.numpy() for k, t in merged.tensors.items()}
    np.testing.assert_allclose(got, reference_logits("gemma3", meta, requantized, IDS), rtol=1e-4,
                               atol=1e-4 * np.abs(got).max())
    unmerged = load(base, backend="numpy", n_ctx=32, cache_type="f32", lora=[(path, 1.0)]).logits(IDS)
    plain = load(base, backend="numpy", n_ctx=32, cache_type="f32").logits(IDS)
    rounding = np.abs(got - unmerged).max()
    assert rounding < 0.05 * np.abs(unmerged - plain).max(), (rounding, np.abs(unmerged - plain).max())


def test_export_lora_outtype_f16_keeps_what_requantizing_would_round_away(tmp_path):
    """--outtype f16 (llama.cpp's export-lora type): the merged matrices in F16, the rest untouched; an adapter
    far smaller than the Q8_0 grid's step survives it, where requantizing to Q8_0 leaves the base."""
    base = write_tiny(tmp_path / "q8.gguf", "llama", seed=27, weight_type=G.Q8_0)
    path, pairs = adapter(tmp_path, base, targets=("attn_v", "ffn_down"), b_scale=2e-3)
    assert main(["export-lora", str(base), "--lora", str(path), "-o", str(tmp_path / "f16.gguf"), "--outtype",
                 "f16"]) == 0
    assert main(["export-lora", str(base), "--lora", str(path), "-o", str(tmp_path / "q8.out.gguf")]) == 0
    f16, src = pc.gguf.load(tmp_path / "f16.gguf"), pc.gguf.load(base)
    assert {n for n, t in f16.tensors.items() if t.type == G.F16} == set(pairs)
    assert all(np.array_equal(f16.tensors[n].raw(), t.raw()) for n, t in src.tensors.items() if n not in pairs)

    def logits(p, **kw):
        return load(p, backend="numpy", n_ctx=32, cache_type="f32", **kw).logits(IDS)
    unmerged, plain = logits(base, lora=[(path, 1.0)]), logits(base)
    effect = np.abs(unmerged - plain).max()
    assert np.abs(logits(tmp_path / "f16.gguf") - unmerged).max() < 0.2 * effect  # F16 products round the inputs
    assert np.abs(logits(tmp_path / "q8.out.gguf") - plain).max() < np.abs(logits(tmp_path / "q8.out.gguf")
                                                                             - unmerged).max()


def test_export_lora_refuses_bad_calls(tmp_path, tiny_llama, capsys):
    path, _ = adapter(tmp_path, tiny_llama)
    assert main(["export-lora", str(tiny_llama), "-o", str(tmp_path / "x.gguf")]) == 2
    assert "no adapter to merge" in capsys.readouterr().err
    assert main(["export-lora", str(tiny_llama), "--lora", str(path), "-o", str(tiny_llama)]) == 2
    assert "is the input model" in capsys.readouterr().err
    assert main(["export-lora", str(tiny_llama), "--lora-scaled", f"{path}:x", "-o", str(tmp_path / "y.gguf")]) == 2
    assert "is not a number" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


# ---------------------------------------------------------------- the commands
def test_prism_run_applies_adapters_with_llama_clis_flags(tmp_path, tiny_llama, capsys):
    path, _ = adapter(tmp_path, tiny_llama)
    model = load(tiny_llama, backend=FAST, n_ctx=64, lora=[(path, 0.5)])
    want = [t.id for t in model.generate("the cat", max_tokens=6, sampler=pc.models.Sampler.greedy())]
    for flags in (["--lora-scaled", str(path), "0.5"], ["--lora-scaled", f"{path}:0.5"]):
        capsys.readouterr()
        assert main(["run", str(tiny_llama), "-p", "the cat", "-n", "6", "--temp", "0", "--json", "--backend", FAST,
                     "--ctx-size", "64", *flags]) == 0
        assert json.loads(capsys.readouterr().out)["ids"] == want
    assert main(["run", str(tiny_llama), "-p", "the cat", "-n", "6", "--temp", "0", "--json", "--backend", FAST,
                 "--ctx-size", "64", "--lora", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == [
        t.id for t in load(tiny_llama, backend=FAST, n_ctx=64, lora=[(path, 1.0)]).generate(
            "the cat", max_tokens=6, sampler=pc.models.Sampler.greedy())]


def test_prism_finetune_trains_an_adapter_that_prism_run_loads(tmp_path, tiny_llama, capsys):
    (tmp_path / "t.txt").write_text(text(150))
    out = tmp_path / "ad.gguf"
    args = ["finetune", str(tiny_llama), "-f", str(tmp_path / "t.txt"), "-o", str(out), "--ctx", "16", "--epochs",
            "2", "--lr", "3e-3", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "attn_q,attn_v,ffn_up",
            "--backend", FAST, "--val-split", "0.2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "epoch 2/2: train loss" in err and "validation perplexity" in err and f"wrote {out}" in err
    f = lora_file.read(out)
    assert f.alpha == 8.0 and {f.rank(n) for n in f.pairs} == {4} and len(f.pairs) == 6
    ck = tmp_path / "ad.checkpoint.gguf"
    assert ck.exists()
    before = ck.read_bytes()
    assert main(args[:-4] + ["--epochs", "3", "--resume", "--val-split", "0.2"]) == 0  # one more epoch
    assert "epoch 3/3" in capsys.readouterr().err and ck.read_bytes() != before
    assert main(["run", str(tiny_llama), "-p", "the", "-n", "4", "--lora", str(out), "--backend", FAST]) == 0


@pytest.mark.parametrize(("extra", "code", "match"), [
    (["--lora-rank", "0"], "usage", "must be at least 1"),  # argparse's own; a refused value 2, divergence 1
    (["--lora-rank", "500"], 2, r"rank 500 exceeds the size of blk\.0\.attn_q\.weight"),
    (["--lora-targets", "attn_qkv"], 2, "has no matrix 'blk.0.attn_qkv.weight'"),
    (["--ctx", "4096"], 2, "exceeds the model's training context 512"),
    (["--full"], 2, r"q8_0: quantized weights cannot be trained in place \(dequantize the model first"),
    (["--lr", "1e30", "--optimizer", "sgd"], 1, r"loss became (nan|inf) at batch \d+ of epoch 1 \(learning rate "
                                                r"1e\+30\): lower the learning rate; no checkpoint had been written"),
])
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the diverging run's NaN, on the reference
def test_prism_finetune_refuses_bad_input_with_a_message(tmp_path, capsys, extra, code, match):
    model = write_tiny(tmp_path / "q8.gguf", "llama", seed=26, weight_type=G.Q8_0)
    (tmp_path / "t.txt").write_text(text(80))
    args = ["finetune", str(model), "-f", str(tmp_path / "t.txt"), "-o", str(tmp_path / "a.gguf"), "--ctx", "16",
            "--backend", "numpy", *extra]
    if code == "usage":
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2
    else:
        assert main(args) == code
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "a.gguf").exists()


def test_prism_finetune_refuses_a_text_shorter_than_one_window(tmp_path, tiny_llama, capsys):
    (tmp_path / "t.txt").write_text("the cat sat")
    assert main(["finetune", str(tiny_llama), "-f", str(tmp_path / "t.txt"), "--ctx", "16", "-o",
                 str(tmp_path / "a.gguf")]) == 2
    err = capsys.readouterr().err
    assert "shorter than one training window" in err and "at least 25 tokens" in err
    assert main(["finetune", str(tiny_llama), "-f", str(tmp_path / "none.txt")]) == 2
    assert "cannot read the training text" in capsys.readouterr().err
