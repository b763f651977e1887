"""Prism's GGUF reader and writer against ggml's own C reader (src/gguf.cpp, through ctypes).

Needs a libggml-base built from ggml's sources, named by PRISM_GGML_BASE_LIB, e.g.
``cmake -B build -DGGML_CPU=OFF && cmake --build build --target ggml-base`` in a ggml checkout,
then ``PRISM_GGML_BASE_LIB=build/src/libggml-base.so``. Skipped otherwise.

- Files Prism writes load in ggml's reader with the same keys, value types, values, tensors.
- Every fuzzed file ggml's reader rejects, Prism rejects too; where both accept they agree on
  the layout. Prism may be stricter (it also checks that tensor data lies inside the file,
  which ggml leaves to llama.cpp's loader, and that keys and names are UTF-8 without NUL bytes).
"""

from __future__ import annotations

import ctypes
import os
import random

import numpy as np
import pytest
from gguf_bytes import build
from test_gguf_hostile import HUGE, _good_kvs, _good_tensors

import prism_core as pc
from prism_core import gguf as pg
from prism_core.errors import MalformedFile

LIB = os.environ.get("PRISM_GGML_BASE_LIB")
if not LIB:
    pytest.skip("set PRISM_GGML_BASE_LIB to a libggml-base.so built from ggml's sources to compare with "
                "ggml's own GGUF reader", allow_module_level=True)


class _Params(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


_LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_quiet = _LOG(lambda level, text, user: None)  # ggml logs every refusal to stderr otherwise


def _lib():
    lib = ctypes.CDLL(LIB)
    lib.ggml_log_set.argtypes = [_LOG, ctypes.c_void_p]
    lib.ggml_log_set(_quiet, None)
    lib.gguf_init_from_buffer.restype = ctypes.c_void_p
    lib.gguf_init_from_buffer.argtypes = [ctypes.c_char_p, ctypes.c_size_t, _Params]
    for name, res in (("gguf_get_n_kv", ctypes.c_int64), ("gguf_get_n_tensors", ctypes.c_int64),
                      ("gguf_get_data_offset", ctypes.c_size_t), ("gguf_get_alignment", ctypes.c_size_t),
                      ("gguf_get_version", ctypes.c_uint32)):
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    for name, res in (("gguf_get_key", ctypes.c_char_p), ("gguf_get_kv_type", ctypes.c_int),
                      ("gguf_get_arr_type", ctypes.c_int), ("gguf_get_arr_n", ctypes.c_size_t),
                      ("gguf_get_val_u32", ctypes.c_uint32), ("gguf_get_val_i64", ctypes.c_int64),
                      ("gguf_get_val_f64", ctypes.c_double), ("gguf_get_val_str", ctypes.c_char_p),
                      ("gguf_get_tensor_offset", ctypes.c_size_t), ("gguf_get_tensor_name", ctypes.c_char_p),
                      ("gguf_get_tensor_type", ctypes.c_int), ("gguf_get_tensor_size", ctypes.c_size_t),
                      ("gguf_get_tensor_ne", ctypes.POINTER(ctypes.c_int64))):
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _Params]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    return lib


@pytest.fixture(scope="module")
def ggml():
    return _lib()


def _ggml_layout(lib, data: bytes | None = None, path: str | None = None):
    """ggml's view of a file, given as bytes or a path (None when its reader rejects it)."""
    g = (lib.gguf_init_from_buffer(data, len(data), _Params(True, None)) if path is None
         else lib.gguf_init_from_file(os.fsencode(path), _Params(True, None)))
    if not g:
        return None
    try:
        n_t = lib.gguf_get_n_tensors(g)
        return {"n_kv": lib.gguf_get_n_kv(g), "data_offset": lib.gguf_get_data_offset(g),
                "alignment": lib.gguf_get_alignment(g),
                "keys": [(lib.gguf_get_key(g, i).decode("utf-8", "surrogateescape"), lib.gguf_get_kv_type(g, i))
                         for i in range(lib.gguf_get_n_kv(g))],
                "tensors": [(lib.gguf_get_tensor_name(g, i).decode("utf-8", "surrogateescape"),
                             lib.gguf_get_tensor_type(g, i), lib.gguf_get_tensor_offset(g, i),
                             lib.gguf_get_tensor_size(g, i), tuple(lib.gguf_get_tensor_ne(g, i)[:4]))
                            for i in range(n_t)]}
    finally:
        lib.gguf_free(g)


def _prism_layout(f: pg.GGUFFile):
    return {"n_kv": len(f.meta), "data_offset": f.data_offset, "alignment": f.alignment,
            "keys": [(k, int(t)) for k, t in f.meta_types.items()],
            "tensors": [(i.name, int(i.type), i.offset, i.nbytes, i.ne4) for i in f.tensor_info.values()]}


def test_prism_files_load_in_ggmls_reader(ggml, tmp_path):
    ctx = pc.Context()
    rng = np.random.default_rng(3)
    tensors = {"a": ctx.from_numpy(rng.standard_normal((3, 32)).astype(np.float32)),
               "b": ctx.from_numpy(rng.standard_normal(5).astype(np.float16)), "q": ctx.new_tensor("q6_K", (256, 2)),
               "i": ctx.from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))}
    meta = {"general.architecture": "x", "u32": 7, "i32": -7, "i64": -2**40, "u64": 2**63, "f32": 0.5,
            "f64": (0.1, pg.GGUFValueType.FLOAT64), "b": True, "s": "ünï", "toks": ["a", "", "c"],
            "ints": np.array([1, -2], np.int16), "empty": ([], pg.GGUFValueType.ARRAY, pg.GGUFValueType.UINT8)}
    for alignment in (32, 8, 256):
        path = tmp_path / f"p{alignment}.gguf"
        pg.save(path, tensors, meta, alignment=alignment)
        data = path.read_bytes()
        got = _ggml_layout(ggml, data)
        assert got is not None, "ggml's reader refused a file Prism wrote"
        with pg.load(path) as f:
            assert got == _prism_layout(f)
        g = ggml.gguf_init_from_buffer(data, len(data), _Params(True, None))
        try:
            keys = {ggml.gguf_get_key(g, i).decode(): i for i in range(ggml.gguf_get_n_kv(g))}
            assert ggml.gguf_get_val_u32(g, keys["u32"]) == 7 and ggml.gguf_get_val_i64(g, keys["i64"]) == -2**40
            assert ggml.gguf_get_val_f64(g, keys["f64"]) == 0.1
            assert ggml.gguf_get_val_str(g, keys["s"]).decode() == "ünï"
            assert ggml.gguf_get_arr_n(g, keys["toks"]) == 3 and ggml.gguf_get_arr_n(g, keys["empty"]) == 0
        finally:
            ggml.gguf_free(g)


def _mutations():
    base = build(_good_kvs(), _good_tensors())
    yield from (base.data[:n] for n in range(len(base.data) + 1))
    rng = random.Random(99)
    for _ in range(1500):
        data = bytearray(base.data)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(base.at["data"])] = rng.randrange(256)
        yield bytes(data)
    for name, off in base.at.items():
        if name != "data":
            width = 4 if name.split(":")[0] in ("version", "type", "ndims", "ggmltype") else 8
            for v in HUGE:
                data = bytearray(base.data)
                data[off:off + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
                yield bytes(data)


def test_what_ggml_rejects_prism_rejects_and_accepted_files_agree(ggml, tmp_path):
    path = tmp_path / "m.gguf"
    counts = {"both reject": 0, "both accept": 0}
    for data in _mutations():
        theirs = _ggml_layout(ggml, data)
        path.write_bytes(data)
        try:
            with pg.load(path) as f:
                ours = _prism_layout(f)
        except MalformedFile as e:
            if theirs is None:
                counts["both reject"] += 1
            else:  # Prism is stricter only where it checks more than ggml's reader
                why = next((w for w in ("past the end of the file", "UTF-8", "NUL byte") if w in str(e)), None)
                assert why is not None, str(e)
                counts[f"only prism rejects: {why}"] = counts.get(f"only prism rejects: {why}", 0) + 1
            continue
        assert theirs is not None, "Prism accepted a file ggml's reader rejects"
        assert ours == theirs
        counts["both accept"] += 1
    print(counts)
    assert counts["both reject"] > 0 and counts["both accept"] > 0


def test_gemma3_270m_layout_agrees_with_ggml(ggml):
    from test_gguf import _gemma_path
    path = _gemma_path()
    with pg.load(path) as f:
        assert _ggml_layout(ggml, path=path) == _prism_layout(f)
