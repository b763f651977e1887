"""Importance-matrix files as llama.cpp writes and reads them: the GGUF format of current llama-imatrix and the
legacy ``.dat`` (tools/imatrix/imatrix.cpp, common/imatrix-loader.cpp of llama.cpp 0.3.36).

An importance matrix holds, for each weight matrix the text's activations went into, the sum over tokens of
each input column's squared activation (``in_sum2``, one row per expert for a MoE tensor) and how many
tokens (``counts``, per expert) went in; the importance llama-quantize uses is their quotient.

GGUF layout: ``general.type = "imatrix"``, ``imatrix.datasets`` (the texts, an array of strings),
``imatrix.chunk_count`` and ``imatrix.chunk_size`` (UINT32); per entry, in name order, the F32 tensors
``NAME.in_sum2`` [n_cols, n_mat] and ``NAME.counts`` [1, n_mat] (trailing 1-extents dropped, as ggml writes).
The legacy file: int32 entry count; per entry int32 name length, the name, int32 ``ncall``, int32 value
count, float32 values (each mean squared activation times ``ncall``); then int32 chunk count, int32 length
and the dataset's name.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument, MalformedFile
from ..types import GGMLType
from .format import MAGIC, V
from .writer import StreamWriter, TensorEntry

GENERAL_TYPE = "imatrix"
KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"
SUMS, COUNTS = ".in_sum2", ".counts"


@dataclass
class Entry:
    """One weight matrix's statistics: ``sums`` float32 [n_mat, n_cols] of squared activations, ``counts``
    int64 [n_mat] of tokens (one per expert of a MoE tensor, else one)."""

    sums: np.ndarray
    counts: np.ndarray

    def importance(self, legacy: bool = False) -> np.ndarray:
        """What llama-quantize hands its quantizers, float32 [n_mat * n_cols]: the mean squared activation
        per column (an expert that saw no token: all 1). For a legacy file, whose values are means times
        ``ncall``, divided by ncall (kept as stored when it is 0)."""
        s = np.asarray(self.sums, np.float32)
        if legacy:
            n = int(self.counts[0]) if len(self.counts) else 0
            return (s / np.float32(n) if n > 0 else s).reshape(-1).astype(np.float32)
        c = self.counts.astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(c > 0, s / np.where(c > 0, c, np.float32(1)), np.float32(1))
        return out.reshape(-1).astype(np.float32)


@dataclass
class Imatrix:
    """An importance matrix: its entries by weight name, the texts it was computed on, the chunks of
    ``chunk_size`` tokens seen. ``legacy``: read from a ``.dat`` file (values there are means times ncall)."""

    entries: dict[str, Entry] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False
    has_metadata: bool = True  # a GGUF file carrying the three imatrix.* keys (llama-quantize requires them)

    def importance(self) -> dict[str, np.ndarray]:
        """Every entry's importance as llama-quantize computes it (see :meth:`Entry.importance`)."""
        return {name: e.importance(self.legacy) for name, e in self.entries.items()}


def save(path: str | os.PathLike[str], im: Imatrix) -> None:
    """Write ``im`` in the GGUF format current llama-imatrix writes (entries in name order)."""
    meta = {"general.type": GENERAL_TYPE, KEY_DATASETS: (list(im.datasets), V.ARRAY, V.STRING),
            KEY_CHUNK_COUNT: (int(im.chunk_count), V.UINT32), KEY_CHUNK_SIZE: (int(im.chunk_size), V.UINT32)}
    specs, blobs = [], []
    for name in sorted(im.entries, key=lambda n: n.encode("utf-8")):
        e = im.entries[name]
        sums = np.ascontiguousarray(e.sums, np.float32)
        if sums.ndim != 2 or len(e.counts) != sums.shape[0] or sums.size == 0:
            raise InvalidArgument(f"imatrix save: entry {name!r}: sums must be [n_mat, n_cols] with n_mat counts, "
                                  f"got {sums.shape} and {len(e.counts)}")
        n_mat, n_cols = sums.shape
        specs.append(TensorEntry(name + SUMS, GGMLType.F32, (n_cols,) if n_mat == 1 else (n_cols, n_mat)))
        specs.append(TensorEntry(name + COUNTS, GGMLType.F32, (1,) if n_mat == 1 else (1, n_mat)))
        blobs += [sums, np.asarray(e.counts, np.float32)]
    with StreamWriter(path, specs, meta) as w:
        for b in blobs:
            w.write(b)


def save_legacy(path: str | os.PathLike[str], im: Imatrix) -> None:
    """Write ``im`` as llama-imatrix's legacy ``.dat`` (``--output-format dat``): entries with no token at all
    are left out, as llama.cpp does, and a partly seen MoE tensor stores 1 for its unseen experts."""
    chunk = max(1, int(im.chunk_size))
    out = bytearray()
    kept = [n for n in sorted(im.entries, key=lambda n: n.encode("utf-8")) if np.any(im.entries[n].counts > 0)]
    out += struct.pack("<i", len(kept))
    for name in kept:
        e = im.entries[name]
        raw = name.encode("utf-8")
        ncall = int((int(np.max(e.counts)) + chunk - 1) // chunk)
        sums = np.asarray(e.sums, np.float32)
        counts = np.repeat(e.counts.astype(np.float32), sums.shape[1]).reshape(sums.shape)
        vals = np.where(counts == 0, np.float32(1), sums) / np.where(counts == 0, np.float32(1), counts)
        vals = (vals.astype(np.float32) * np.float32(ncall)).astype("<f4")
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, vals.size) + vals.tobytes()
    ds = (im.datasets[-1] if im.datasets else "").encode("utf-8")
    out += struct.pack("<i", int(im.chunk_count)) + struct.pack("<i", len(ds)) + ds
    tmp = f"{os.fspath(path)}.partial"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Imatrix:
    """Read a GGUF importance matrix, or a legacy ``.dat`` (any file not starting with GGUF's magic)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidArgument(f"{path}: no such importance-matrix file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    return _load_gguf(path) if magic == MAGIC else _load_legacy(path)


def _load_gguf(path: str) -> Imatrix:
    from .file import load as load_gguf
    with load_gguf(path) as f:
        meta = f.meta
        datasets = [str(s) for s in meta.get(KEY_DATASETS, [])] if f.meta_types.get(KEY_DATASETS) == V.ARRAY else []
        has_meta = all(k in meta for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE))
        sums: dict[str, np.ndarray] = {}
        counts: dict[str, np.ndarray] = {}
        for name, t in f.tensors.items():
            for suffix, into in ((SUMS, sums), (COUNTS, counts)):
                if name.endswith(suffix) and len(name) > len(suffix):
                    if t.type != GGMLType.F32:
                        raise MalformedFile(f"{path}: {name} is {t.type.name}; imatrix sums and counts are F32",
                                            path, 0)
                    into[name[:-len(suffix)]] = np.array(t.numpy(), np.float32).reshape(-1)
        entries = {}
        for name in sorted(set(sums) | set(counts)):
            if name not in sums or name not in counts:
                raise MalformedFile(f"{path}: {name} has {'no counts' if name in sums else 'no sums'}: sums and "
                                    "counts come in pairs", path, 0)
            c = np.rint(counts[name]).astype(np.int64)  # llama.cpp reads them with lround
            if len(c) == 0 or sums[name].size % len(c):
                raise MalformedFile(f"{path}: {name}: {sums[name].size} sums do not split over {len(c)} counts",
                                    path, 0)
            entries[name] = Entry(sums[name].reshape(len(c), -1), c)
        if not entries:
            raise MalformedFile(f"{path}: no importance-matrix entries (no *.in_sum2 / *.counts tensors)", path, 0)
        return Imatrix(entries, datasets, int(meta.get(KEY_CHUNK_COUNT, 0)), int(meta.get(KEY_CHUNK_SIZE, 0)),
                       False, has_meta)


def _load_legacy(path: str) -> Imatrix:
    raw = memoryview(open(path, "rb").read())  # noqa: SIM115 - a small file, read whole
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(raw):
            raise MalformedFile(f"{path}: byte {pos}: truncated legacy imatrix ({what})", path, pos)
        v = struct.unpack_from(fmt, raw, pos)
        pos += size
        return v[0] if len(v) == 1 else v

    n = take("<i", "entry count")
    if n < 1:
        raise MalformedFile(f"{path}: not an importance matrix (neither GGUF nor a legacy .dat with entries)", path, 0)
    entries: dict[str, Entry] = {}
    for i in range(n):
        ln = take("<i", f"entry {i}'s name length")
        if ln < 0 or pos + ln > len(raw):
            raise MalformedFile(f"{path}: byte {pos}: entry {i}'s name of {ln} bytes runs past the file", path, pos)
        name = bytes(raw[pos:pos + ln]).decode("utf-8", "surrogateescape")
        pos += ln
        ncall, nval = take("<ii", f"entry {name!r}'s counts")
        if nval < 1 or pos + 4 * nval > len(raw):
            raise MalformedFile(f"{path}: byte {pos}: entry {name!r} claims {nval} values", path, pos)
        vals = np.frombuffer(raw, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval
        entries[name] = Entry(vals.reshape(1, -1), np.array([ncall], np.int64))
    chunk_count, datasets = 0, []
    if pos + 4 <= len(raw):  # the trailing chunk count and dataset name are optional
        chunk_count = take("<i", "chunk count")
        if pos + 4 <= len(raw):
            ln = take("<i", "dataset name length")
            if 0 < ln and pos + ln <= len(raw):
                datasets.append(bytes(raw[pos:pos + ln]).decode("utf-8", "surrogateescape"))
    return Imatrix(entries, datasets, int(chunk_count), 0, True, False)

