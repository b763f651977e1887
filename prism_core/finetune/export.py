"""Writing what training made: adapters merged into a model file (llama.cpp's export-lora, but keeping each
merged matrix in its original type, requantized) and a fully fine-tuned model as a complete GGUF.

Merging: for each adapted matrix W (ne [n_in, n_out], NumPy (n_out, n_in)) and each adapter with lora_a
(NumPy (r, n_in)), lora_b ((n_out, r)) and scale s = user_scale * alpha / r (alpha 0: user_scale),
W' = W + sum s * lora_b @ lora_a, computed in float64 from W's dequantized values and rounded once to W's
type (a block type with ggml's reference quantizer). Every other tensor and all metadata are copied as
they are, bytes unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..context import Context
from ..errors import InvalidArgument, Unsupported
from ..gguf import load, save
from ..gguf.lora import AdapterError, LoraFile
from ..models.lora import open_adapters, products
from ..progress import report
from ..quant import can_quantize
from ..tensor import Tensor
from ..types import F16, F32, GGMLType, as_type, traits


def merge(model_path: str | os.PathLike[str], adapters: Sequence[tuple[str | os.PathLike[str] | LoraFile, float]],
          out_path: str | os.PathLike[str], out_type: GGMLType | str | None = None) -> list[str]:
    """Write ``model_path`` with ``adapters`` ((path, scale) pairs) merged into its matrices to
    ``out_path`` (atomically); returns the names of the merged matrices. ``out_type`` None keeps each
    merged matrix's type; F16 or F32 stores the merged matrices so (llama.cpp's export-lora writes F16),
    keeping an adapter's small change that a 4-bit type's rounding would mostly lose."""
    if out_type is not None:
        out_type = as_type(out_type)
        if out_type not in (F16, F32):
            raise InvalidArgument(f"export-lora: the merged matrices' type must be the original's, F16 or F32, got "
                                  f"{traits(out_type).name}")
    if os.path.abspath(os.fspath(out_path)) == os.path.abspath(os.fspath(model_path)):
        raise InvalidArgument(f"export-lora: the output {out_path} is the input model; write another file")
    if not adapters:
        raise InvalidArgument("export-lora: no adapter to merge (give --lora or --lora-scaled)")
    ctx = Context(1 << 40)
    base = load(model_path, ctx)
    opened: list[tuple[LoraFile, float]] = []
    try:
        arch = base.meta.get("general.architecture")
        if not isinstance(arch, str):
            raise InvalidArgument(f"{base.path}: the model has no general.architecture")
        opened = open_adapters(list(adapters), ctx)
        by_name = products(opened, base.tensors, arch)  # refuses other models' adapters, naming the tensor
        for name in by_name:
            t = base.tensors[name].type
            if out_type is None and traits(t).is_quantized and not can_quantize(t):
                raise Unsupported(f"export-lora: {name} is {traits(t).name}, which Prism cannot quantize again "
                                  "without an importance matrix; write the merged matrices as F16 (--outtype f16)")
        scratch = Context(1 << 40)
        tensors: dict[str, Tensor] = dict(base.tensors)
        for i, (name, prods) in enumerate(by_name.items()):
            report("merging adapters", i, len(by_name))
            w = base.tensors[name]
            merged = w.numpy().astype(np.float64)
            for p in prods:
                merged += p.scale * (p.b.numpy().astype(np.float64) @ p.a.numpy().astype(np.float64))
            out = scratch.new_tensor(w.type if out_type is None else out_type, w.ne, name)
            out.set(merged.astype(np.float32))
            tensors[name] = out
        report("merging adapters", len(by_name), len(by_name))
        save(out_path, tensors, base.meta)
        return list(by_name)
    finally:
        for f, _ in opened:
            f.close()
        base.close()


def save_full(source_meta: Mapping[str, Any], tensors: Mapping[str, Tensor], trained: Mapping[str, Tensor],
              out_path: str | os.PathLike[str]) -> None:
    """A complete GGUF of a fully fine-tuned model: ``tensors`` (the loaded file's, in its order) with each
    ``trained`` F32 parameter in its place, stored in the original tensor's type (F32 or F16)."""
    scratch = Context(1 << 40)
    out: dict[str, Tensor] = {}
    for name, t in tensors.items():
        p = trained.get(name)
        if p is None:
            out[name] = t
            continue
        if t.type not in (F32, F16):
            raise AdapterError(f"save_full: {name} is {t.traits.name}; full fine-tuning writes F32/F16 tensors")
        copy = scratch.new_tensor(t.type, t.ne, name)
        copy.set(p.numpy())
        out[name] = copy
    missing = sorted(set(trained) - set(tensors))
    if missing:
        raise InvalidArgument(f"save_full: trained tensor {missing[0]!r} is not in the model")
    save(out_path, out, source_meta)


__all__ = ["merge", "save_full"]
