"""A GGUF model quantized to another file type, as llama.cpp's llama-quantize writes it (``prism quantize``).

The output is what ``llama_model_quantize`` of llama.cpp 0.3.36 writes for the same input, file type and
importance matrix: the input's metadata with ``general.quantization_version`` and ``general.file_type`` set
(and the ``quantize.imatrix.*`` keys llama-quantize adds when it is given a matrix), the tensors in
llama.cpp's order (by layer, then name), each of the type :mod:`.quant_rules` gives it, its rows quantized
by ``prism_core.quant.quantize_chunk`` (ggml_quantize_chunk). Tensors stream from the mapped input to the
output a slab of rows at a time, so memory stays at about one slab of float32 rows and its blocks beyond
what the mapping holds (each tensor's pages are released once it is written).

Everything that would make llama.cpp give up part-way (a missing importance matrix, a quantized input
without ``allow_requantize``, a matrix of the wrong size) is checked before the output is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import progress
from ..errors import InvalidArgument, Unsupported
from ..gguf import imatrix as imatrix_file
from ..gguf.file import GGUFFile, load
from ..gguf.format import V
from ..gguf.writer import StreamWriter, TensorEntry
from ..quant import quantize_chunk
from ..types import BF16, F16, F32, GGMLType, f32_to_bf16, traits
from .quant_rules import ModelInfo, Options, Preset, TensorPlan, llama_order, n_dims, plan, preset, tensor_type

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
IMATRIX_FILE_KEY, IMATRIX_DATASET_KEY = "quantize.imatrix.file", "quantize.imatrix.dataset"
IMATRIX_ENTRIES_KEY, IMATRIX_CHUNKS_KEY = "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"
IMATRIX_STRING_MAX = 127  # llama-quantize copies the file name and dataset into a 128-byte override
SLAB_BYTES = 32 << 20  # float32 rows converted and quantized at a time


@dataclass
class QuantizeResult:
    """What was written: the output path, the preset, each tensor's plan, input and output tensor bytes."""

    path: str
    preset: Preset
    plans: list[TensorPlan]
    bytes_in: int = 0
    bytes_out: int = 0
    n_elements: int = 0
    imatrix_entries: int = 0
    missing_imatrix: list[str] = field(default_factory=list)  # quantized without one (llama.cpp's "did not find")

    @property
    def fallbacks(self) -> list[TensorPlan]:
        return [p for p in self.plans if p.fallback]


def _imatrix_of(source: Any) -> tuple[dict[str, np.ndarray], list[str], int, str]:
    """(importance by tensor name, datasets, chunk count, the file's name as given) from a path, an Imatrix, or
    a mapping of name -> importance array."""
    if source is None:
        return {}, [], 0, ""
    if isinstance(source, imatrix_file.Imatrix):
        im, label = source, ""
    elif isinstance(source, Mapping):
        return {k: np.ascontiguousarray(v, np.float32).reshape(-1) for k, v in source.items()}, [], 0, ""
    else:
        label = os.fspath(source)
        im = imatrix_file.load(label)
    if not im.legacy and not im.has_metadata:
        raise InvalidArgument(f"quantize: the importance matrix {label or '(given)'} has no imatrix.* metadata "
                              "(llama-quantize refuses such a file too)")
    data = im.importance()
    for name, v in data.items():
        if not np.isfinite(v).all():
            raise InvalidArgument(f"quantize: the importance matrix holds a non-finite value for {name!r} "
                                  "(llama-quantize refuses it too)")
    return data, list(im.datasets), int(im.chunk_count), label


def _out_metadata(f: GGUFFile, p: Preset, imatrix_keys: list[tuple[str, Any, V]]) -> dict[str, tuple]:
    """The input's metadata (each key's recorded type kept) with llama_model_quantize's changes, in its order:
    the two quantization keys moved to the end with their new values, the split keys dropped, then the
    overrides llama-quantize passes for an importance matrix."""
    out: dict[str, tuple] = {}
    for key in f.meta:
        t = f.meta_types[key]
        if t == V.ARRAY:  # an undecoded string array (the vocabulary) is copied as the file stores it
            value = f.meta.undecoded_strings(key) or f.meta[key]
            out[key] = (value, t, f.meta.element_types[key])
        else:
            out[key] = (f.meta[key], t)
    for key, value in (("general.quantization_version", QUANTIZATION_VERSION), ("general.file_type", p.ftype)):
        out.pop(key, None)
        out[key] = (value, V.UINT32)
    for key in SPLIT_KEYS:
        out.pop(key, None)
    for key, value, t in imatrix_keys:
        out.pop(key, None)
        out[key] = (value, t)
    return out


def _to_f32(raw: np.ndarray, t: GGMLType, n_per_row: int) -> np.ndarray:
    """Rows of a tensor's stored bytes as float32 (nrows, n_per_row), as llama.cpp converts its input."""
    if t == F32:
        return raw.view(np.float32).reshape(-1, n_per_row)
    if t == F16:
        return raw.view(np.float16).astype(np.float32).reshape(-1, n_per_row)
    if t == BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, n_per_row)
    from ..quant import dequantize
    return dequantize(raw.reshape(-1, n_per_row // traits(t).blck_size * traits(t).type_size), t)


def _from_f32(rows: np.ndarray, t: GGMLType, imatrix: np.ndarray | None, threads: int | None) -> np.ndarray:
    """float32 rows as ggml_quantize_chunk writes type t (F16/BF16 rounded to nearest even, F32 as is)."""
    if t == F32:
        return rows
    if t == F16:
        with np.errstate(over="ignore"):
            return rows.astype(np.float16)
    if t == BF16:
        with np.errstate(over="ignore"):
            return f32_to_bf16(rows)
    return quantize_chunk(rows, t, imatrix, threads=threads)


def _check(f: GGUFFile, plans: list[TensorPlan], imat: dict[str, np.ndarray], allow_requantize: bool,
           ) -> tuple[dict[str, np.ndarray | None], list[str]]:
    """Every refusal llama.cpp would reach part-way, before anything is written; the importance matrix (or None)
    each tensor gets, and the tensors quantized without one although a matrix was given."""
    per: dict[str, np.ndarray | None] = {}
    missing = []
    for pl in plans:
        if pl.target == pl.source:
            continue
        ti = f.tensor_info[pl.name]
        src, dst = traits(pl.source), traits(pl.target)
        if src.is_quantized and not allow_requantize:
            raise InvalidArgument(f"quantize: {pl.name} is already {src.name}; requantizing is disabled (pass "
                                  "--allow-requantize, as llama-quantize asks)")
        if not (src.is_quantized or pl.source in (F32, F16, BF16)):
            raise Unsupported(f"quantize: {pl.name}: cannot convert a {src.name} tensor")
        if dst.is_quantized and ti.ne[0] % dst.blck_size:
            raise InvalidArgument(f"quantize: {pl.name}: rows of {ti.ne[0]} are not a multiple of {dst.name}'s "
                                  f"block of {dst.blck_size}")
        im = None
        if imat:
            v = imat.get(pl.name)
            n_mat = ti.ne4[2]
            if v is None:
                missing.append(pl.name)
            elif v.size == ti.ne[0] * n_mat:
                im = v
            elif pl.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                raise InvalidArgument(f"quantize: the importance matrix of {pl.name} has {v.size} values, the "
                                      f"tensor {ti.ne[0] * n_mat} columns (a matrix of another model?)")
        if im is None and pl.needs_imatrix:
            what = "an importance matrix without it" if imat else "an importance matrix (--imatrix FILE)"
            raise InvalidArgument(f"quantize: {pl.name} becomes {dst.name}, which needs {what}; llama-quantize "
                                  "refuses this too (the result would be garbage)")
        per[pl.name] = im
    return per, missing


def _write_tensor(f: GGUFFile, pl: TensorPlan, w: StreamWriter, im: np.ndarray | None, threads: int | None,
                  task: str, done: int, total: int) -> int:
    """One tensor, a slab of rows at a time: copied when its type stays, else converted to float32 and
    quantized, each expert's rows (a 3-D tensor) with its slice of the importance matrix, as llama.cpp's
    chunks stop at experts. Returns the input bytes done so far."""
    ti = f.tensor_info[pl.name]
    raw = f.tensor_bytes(pl.name)
    src = traits(pl.source)
    n_per_row, rows_per_mat = ti.ne4[0], ti.ne4[1]
    row_bytes = n_per_row // src.blck_size * src.type_size
    n_rows = ti.ne4[1] * ti.ne4[2] * ti.ne4[3]
    slab = max(1, SLAB_BYTES // max(1, 4 * n_per_row))
    detail = f"{pl.name} {src.name}" + (f" -> {traits(pl.target).name}" if pl.target != pl.source else "")
    for r0 in range(0, n_rows, slab):
        r1 = min(n_rows, r0 + slab)
        part = raw[r0 * row_bytes:r1 * row_bytes]
        if pl.target == pl.source:
            w.write(part)
        else:
            rows = _to_f32(part, pl.source, n_per_row)
            r = r0
            while r < r1:
                e = r // rows_per_mat
                stop = min(r1, (e + 1) * rows_per_mat)
                w_e = None if im is None else im[e * n_per_row:(e + 1) * n_per_row]
                try:
                    w.write(_from_f32(rows[r - r0:stop - r0], pl.target, w_e, threads))
                except InvalidArgument as err:  # a block too large for its scale: which tensor, which rows
                    raise InvalidArgument(f"quantize: {pl.name} (its rows counted from {r}): {err}") from None
                r = stop
        done += len(part)
        progress.report(task, done, total, unit="B", detail=detail)
    return done


def quantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str | int, *,
                   imatrix: Any = None, threads: int | None = None, allow_requantize: bool = False,
                   leave_output_tensor: bool = False, output_tensor_type: str | GGMLType | None = None,
                   token_embedding_type: str | GGMLType | None = None, pure: bool = False,
                   on_tensor: Callable[[TensorPlan], None] | None = None) -> QuantizeResult:
    """Quantize the GGUF model ``src`` to preset ``type`` (``"Q4_K_M"``, ``"IQ4_XS"``, ... see
    :data:`quant_rules.PRESETS`) into ``dst``, as llama-quantize does with the same options. ``imatrix``: an
    importance-matrix file (GGUF or legacy .dat), an :class:`~prism_core.gguf.imatrix.Imatrix`, or a mapping
    of tensor name -> importance. ``threads``: the C quantizers' threads (default: the backend's).
    ``on_tensor`` is called with each tensor's plan as it starts. Progress is reported to
    :mod:`prism_core.progress` listeners."""
    p = preset(type)
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise InvalidArgument(f"quantize: input and output are the same file: {src}")
    out_t = tensor_type(output_tensor_type) if isinstance(output_tensor_type, str) else output_tensor_type
    emb_t = tensor_type(token_embedding_type) if isinstance(token_embedding_type, str) else token_embedding_type
    imat, datasets, chunks, label = _imatrix_of(imatrix)
    with load(src) as f:
        info = ModelInfo.from_metadata(f.meta)
        order = llama_order(list(f.tensor_info))
        opts = Options(leave_output_tensor, out_t, emb_t, pure, bool(imat))
        plans = plan([(n, f.tensor_info[n].type, f.tensor_info[n].ne4) for n in order], info, p, opts)
        per, missing = _check(f, plans, imat, allow_requantize)
        keys: list[tuple[str, Any, V]] = []
        if imat:
            keys.append((IMATRIX_FILE_KEY, label[:IMATRIX_STRING_MAX], V.STRING))
            if datasets:
                keys.append((IMATRIX_DATASET_KEY, datasets[0][:IMATRIX_STRING_MAX], V.STRING))
            keys.append((IMATRIX_ENTRIES_KEY, len(imat), V.UINT32))
            if chunks > 0:
                keys.append((IMATRIX_CHUNKS_KEY, chunks, V.UINT32))
        ne = {pl.name: f.tensor_info[pl.name].ne4 for pl in plans}
        # n_dims as ggml writes them: trailing extents of 1 dropped
        entries = [TensorEntry(pl.name, pl.target, tuple(ne[pl.name][:n_dims(ne[pl.name])])) for pl in plans]
        result = QuantizeResult(dst, p, plans, imatrix_entries=len(imat), missing_imatrix=missing)
        total = sum(f.tensor_info[pl.name].nbytes for pl in plans)
        task = f"quantizing {os.path.basename(src)} to {p.name}"
        done = 0  # input bytes through, for the progress bar
        with StreamWriter(dst, entries, _out_metadata(f, p, keys), alignment=f.alignment) as w:
            for pl, entry in zip(plans, entries):
                if on_tensor is not None:
                    on_tensor(pl)
                done = _write_tensor(f, pl, w, per.get(pl.name), threads, task, done, total)
                f.drop_pages(pl.name)
                ti = f.tensor_info[pl.name]
                result.bytes_in += ti.nbytes
                result.bytes_out += entry.nbytes
                result.n_elements += int(np.prod(ti.ne4))
        if total == 0:
            progress.report(task, 0, 0, unit="B")
    return result
