"""Malformed GGUF files: every check of ggml's reader gives a MalformedFile naming the file,
the byte offset (computed here by the independent byte builder) and the fault; fuzzed files
load or fail cleanly, in bounded memory, and a failed load leaves the caller's context alone."""

from __future__ import annotations

import random
import struct
import tracemalloc

import numpy as np
import pytest
from gguf_bytes import ARR, BOOL, F32, I32, STR, U8, U32, U64, Raw, build

import prism_core as pc
from prism_core import gguf as pg
from prism_core.errors import MalformedFile

F32T, Q4_0T, Q8_0T, I32T = 0, 2, 8, 26
ROW = np.arange(8, dtype=np.float32).tobytes()  # 8 floats = 32 bytes


def _good_kvs():
    return [("general.architecture", STR, "test"), ("test.count", U32, 7),
            ("tokenizer.ggml.tokens", ARR, (STR, ["a", "bc", "", "déf"])),
            ("tokenizer.ggml.scores", ARR, (F32, [0.5, -1.0, 2.0, 0.0])), ("flag", BOOL, 1)]


def _good_tensors():
    return [("w", (8, 1), F32T, None, ROW), ("q", (32,), Q8_0T, None, bytes(range(34))),
            ("i", (3,), I32T, None, struct.pack("<3i", 1, -2, 3))]


def _load(tmp_path, data: bytes, ctx=None, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return pg.load(p, ctx), str(p)


def test_the_builder_makes_a_file_prism_and_gguf_load_alike(tmp_path):
    import gguf
    b = build(_good_kvs(), _good_tensors())
    f, path = _load(tmp_path, b.data)
    r = gguf.GGUFReader(path)
    assert f.data_offset == b.at["data"] == r.data_offset
    assert f.meta["tokenizer.ggml.tokens"] == ["a", "bc", "", "déf"] and f.meta["flag"] is True
    np.testing.assert_array_equal(f.tensors["w"].numpy().reshape(-1), np.arange(8))
    assert [t.name for t in r.tensors] == list(f.tensors)


def _offset_cases():
    """(id, built file, field whose offset the error names, message pattern)."""
    kv, ts = _good_kvs(), _good_tensors()
    big = 1 << 62
    cases = [
        ("magic", build(kv, ts, magic=b"GGUG"), None, r"not a GGUF file: magic is b'GGUG'"),
        ("version 0", build(kv, ts, version=0), "version", "bad GGUF version 0x0"),
        ("version 1", build(kv, ts, version=1), "version", "version 1 is no longer supported"),
        ("version 4", build(kv, ts, version=4), "version", "version 4 is newer"),
        ("other endianness", build(kv, ts, version=3 << 24), "version", "other endianness"),
        ("negative tensor count", build(kv, ts, n_tensors=-1), "n_tensors", "tensor count -1"),
        ("huge tensor count", build(kv, ts, n_tensors=big), "n_tensors", f"tensor count {big} .*cannot fit"),
        ("huge kv count", build(kv, ts, n_kv=big), "n_kv", f"key count {big} .*cannot fit"),
        ("empty key", build([("", U32, 1)]), "kv:", "key 0 is empty"),
        ("duplicate key", build([("a", U32, 1), ("a", U32, 2)]), None, "duplicate key 'a'"),
        ("key not UTF-8", build([(b"\xff\xfe", U32, 1)]), "kv:" + str(b"\xff\xfe"), "key 0 is not valid UTF-8"),
        ("key with a NUL byte", build([("a\0b", U32, 1)]), "kv:a\0b", "key 0 'a.x00b' contains a NUL byte"),
        ("tensor name with a NUL byte", build(tensors=[("w\0", (8,), F32T, None, ROW)]), "tensor:w\0",
         "contains a NUL byte"),
        ("key length past the end", build([("k", U32, 1)]).with_u64("kv:k", big), "kv:k",
         "the length of key 0|key 0 .* past|over ggml's bound"),
        ("value type 13", build([("k", 13, Raw(b"\0"))]), "type:k", "invalid GGUF value type 13"),
        ("array of arrays", build([("k", ARR, Raw(struct.pack("<IQ", ARR, 0)))]), "value:k", "array of arrays"),
        ("array item type bogus", build([("k", ARR, Raw(struct.pack("<IQ", 99, 0)))]), "value:k", "value type 99"),
        ("array count over 2**30", build([("k", ARR, Raw(struct.pack("<IQ", U8, (1 << 30) + 1)))]), None,
         "claims 1073741825 items, over ggml's bound"),
        ("array count past the end", build([("k", ARR, Raw(struct.pack("<IQ", U32, 1000)))]), None,
         "array 'k' of 1000 UINT32 needs 4000 bytes"),
        ("string array count past the end", build([("k", ARR, Raw(struct.pack("<IQ", STR, 1 << 29)))]), None,
         "array 'k' of 536870912 strings"),
        ("string in array past the end", build([("k", ARR, Raw(struct.pack("<IQQ", STR, 2, 1) + b"x"
                                                     + struct.pack("<Q", 99)))]), None, "string 1 of array 'k'"),
        ("string value length huge", build([("k", STR, Raw(struct.pack("<Q", big)))]), "value:k",
         "over ggml's bound of 1073741824"),
        ("string value past the end", build([("k", STR, Raw(struct.pack("<Q", 10) + b"abc"))]), None,
         r"needs 10 bytes but the file has only 3 left"),
        ("alignment not UINT32", build([("general.alignment", U64, 32)]), "kv:general.alignment",
         "must be UINT32, is UINT64"),
        ("alignment 0", build([("general.alignment", U32, 0)]), "kv:general.alignment", "alignment 0"),
        ("alignment 48", build([("general.alignment", U32, 48)]), "kv:general.alignment", "not a power of two"),
        ("tensor name too long", build(tensors=[("n" * 64, (8,), F32T, None, ROW)]), "tensor:" + "n" * 64,
         "over ggml's 63 bytes"),
        ("duplicate tensor name", build(tensors=[("w", (8,), F32T, None, ROW), ("w", (8,), F32T, None, ROW)]),
         None, "duplicate tensor name 'w'"),
        ("5 dims", build(tensors=[("w", (8, 1, 1, 1, 1), F32T, None, ROW)]), "ndims:w", "has 5 dims"),
        ("negative extent", build(tensors=[("w", (8, -1), F32T, None, ROW)]), "ne1:w", "negative extent ne"),
        ("element count over the bound", build(tensors=[("w", (1 << 31, 1 << 31, 2), F32T, None, ROW)]), None,
         "over the bound 2..62"),
        ("unknown ggml type", build(tensors=[("w", (8,), 4, None, ROW)]), "ggmltype:w", "unknown ggml type 4"),
        ("ne0 not a block multiple", build(tensors=[("q", (16,), Q4_0T, None, bytes(18))]), "ggmltype:q",
         "ne.0. = 16, not a multiple of its block size 32"),
        ("offset misaligned", build(tensors=[("w", (8,), F32T, 4, ROW)]), "offset:w", "expected 0 .not aligned"),
        ("offset out of order", build(tensors=[("a", (8,), F32T, None, ROW), ("b", (8,), F32T, 64, ROW)]),
         "offset:b", "offset 64, expected 32"),
        ("tensor past the end", build(tensors=[("w", (9,), F32T, None, ROW)]), "offset:w",
         r"data at bytes \[\d+, \d+\), past the end"),
        ("huge tensor past the end", build(tensors=[("w", (1 << 40,), F32T, None, ROW)]), "offset:w",
         "past the end of the file"),
        ("data section past the end", build(tensors=[("w", (0,), F32T, None, b"")], data_pad=False), None,
         "data section would start"),
    ]
    return cases


CASES = _offset_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_reader_check_names_file_offset_and_fault(tmp_path, case):
    _, built, field, pattern = case
    ctx = pc.Context()
    keep = ctx.new_tensor(pc.F32, (4,), "mine")
    before = (list(ctx.tensors), ctx.used)
    with pytest.raises(MalformedFile, match=pattern) as info:
        _load(tmp_path, built.data, ctx)
    e = info.value
    assert e.path.endswith("bad.gguf") and str(e).startswith(f"{e.path}: byte {e.offset}: ")
    if field is not None:
        key = next(k for k in built.at if k == field or (field.endswith(":") and k.startswith(field)))
        assert e.offset == built.at[key], (e.offset, built.at)
    assert 0 <= e.offset <= len(built.data)
    assert (list(ctx.tensors), ctx.used) == before and keep.ctx is ctx  # the caller's context as it was


def test_a_context_too_small_for_the_tensors_is_left_as_it_was(tmp_path):
    ctx = pc.Context(mem_size=600)
    ctx.new_tensor(pc.F32, (4,), "mine")
    before = (list(ctx.tensors), ctx.used)
    with pytest.raises(pc.BoundExceeded):
        _load(tmp_path, build(_good_kvs(), _good_tensors()).data, ctx)
    assert (list(ctx.tensors), ctx.used) == before


# ---------------------------------------------------------------------------- fuzzing
MEMORY_SLACK = 256 << 10  # Python objects of a small load (context, dicts, metadata) whatever the file


def _check(tmp_path, data: bytes, seen: dict) -> None:
    """Load must succeed or raise MalformedFile; its peak Python allocation stays bounded."""
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(data)
    tracemalloc.start()
    try:
        f = pg.load(p)
        seen["ok"] += 1
        for k in f.meta:  # decoding every value must not fail either
            f.meta[k]
        f.close()
    except MalformedFile:
        seen["bad"] += 1
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= MEMORY_SLACK + 4 * len(data), (peak, len(data))


@pytest.fixture(scope="module")
def base():
    return build(_good_kvs(), _good_tensors())


def test_truncation_at_every_byte(tmp_path, base):
    seen = {"ok": 0, "bad": 0}
    for n in range(len(base.data) + 1):
        _check(tmp_path, base.data[:n], seen)
    assert seen["bad"] >= base.at["data"]  # every cut inside the header is an error
    assert seen["ok"] >= 1  # the whole file (and cuts in the last tensor's padding) load


def test_random_byte_flips(tmp_path, base):
    rng = random.Random(1234)
    seen = {"ok": 0, "bad": 0}
    for _ in range(1500):
        data = bytearray(base.data)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(base.at["data"])] = rng.randrange(256)
        _check(tmp_path, bytes(data), seen)
    assert seen["bad"] > 0 and seen["ok"] > 0


HUGE = [(1 << 64) - 1, 1 << 63, (1 << 63) - 1, 1 << 62, 1 << 40, (1 << 30) + 1, 1 << 32, 1 << 31]


def test_huge_counts_and_lengths_in_every_field(tmp_path, base):
    """Every recorded 4- or 8-byte field (counts, lengths, dims, extents, offsets, types) set to huge values."""
    seen = {"ok": 0, "bad": 0}
    for name, off in base.at.items():
        if name == "data":
            continue
        width = 4 if name.split(":")[0] in ("version", "type", "ndims", "ggmltype") else 8
        for v in HUGE:
            data = bytearray(base.data)
            data[off:off + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
            _check(tmp_path, bytes(data), seen)
    assert seen["bad"] > 0


def test_a_big_vocabulary_with_a_bogus_count_is_bounded(tmp_path):
    tokens = [f"tok{i}" for i in range(20000)]
    b = build([("tokenizer.ggml.tokens", ARR, (STR, tokens)), ("x", ARR, (I32, list(range(20000))))])
    seen = {"ok": 0, "bad": 0}
    _check(tmp_path, b.data, seen)
    for v in HUGE:  # the item count, after the item type
        _check(tmp_path, b.with_u64("value:tokenizer.ggml.tokens", v, skip=4).data, seen)
    assert seen == {"ok": 1, "bad": len(HUGE)}
