"""Sharded datasets (ggml_opt_dataset_*).

A dataset holds ``ndata`` fixed-width datapoints in a tensor ``data`` with ggml extents
``[ne_datapoint, ndata]`` (NumPy shape ``(ndata, ne_datapoint)``) and, optionally, labels
``[ne_label, ndata]``. Datapoints are grouped in shards of ``ndata_shard`` consecutive
points; ``permutation`` orders the shards. A batch is filled with whole shards taken in
permutation order (a raw byte copy, as ggml does), and shuffling permutes shards.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..context import TENSOR_OVERHEAD, Context
from ..errors import InvalidArgument, PrismWarning, ShapeMismatch, TypeMismatch
from ..tensor import Tensor
from ..types import BF16, F16, F32, F64, GGMLType, as_type, traits
from .mt19937 import MT19937, shuffle


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"Dataset: {name} must be an int, got {value!r}")
    if value < minimum:
        raise InvalidArgument(f"Dataset: {name} must be >= {minimum}, got {value}")
    return int(value)


FLOAT_TYPES = frozenset({F32, F16, BF16, F64})


class Dataset:
    """``ggml_opt_dataset_init(type_data, type_label, ne_datapoint, ne_label, ndata, ndata_shard)``.

    The data and label tensors start zero-filled; write them with ``ds.data.set(array)``
    (NumPy order) or build the dataset with :meth:`from_numpy`. When ``ndata`` is not a
    multiple of ``ndata_shard``, the trailing partial shard is never used, as in ggml (whose
    ported tests build such datasets); a :class:`PrismWarning` names the unused datapoints.
    """

    def __init__(self, ne_datapoint: int, ne_label: int, ndata: int, ndata_shard: int = 1, *,
                 type_data: GGMLType | int | str = F32, type_label: GGMLType | int | str = F32) -> None:
        self.ne_datapoint = _int("ne_datapoint", ne_datapoint, 1)
        self.ne_label = _int("ne_label", ne_label, 0)
        self.ndata = _int("ndata", ndata, 1)
        self.ndata_shard = _int("ndata_shard", ndata_shard, 1)
        unused = self.ndata % self.ndata_shard
        if unused:
            first = self.ndata - unused
            warnings.warn(f"Dataset: ndata={self.ndata} is not a multiple of ndata_shard={self.ndata_shard}: "
                          f"datapoint{'s' if unused > 1 else ''} {first}"
                          + (f"..{self.ndata - 1}" if unused > 1 else "")
                          + f" ({unused} of them) form a partial shard that no batch uses, as in ggml",
                          PrismWarning, stacklevel=2)
        td, tl = as_type(type_data), as_type(type_label)
        for what, t, ne0 in (("type_data", td, self.ne_datapoint), ("type_label", tl, self.ne_label or 1)):
            if ne0 % traits(t).blck_size:
                raise InvalidArgument(f"Dataset: {what} {traits(t).name} needs rows that are a multiple of "
                                      f"{traits(t).blck_size} elements, got {ne0}")
        need = 2 * TENSOR_OVERHEAD + 64
        need += traits(td).type_size * self.ne_datapoint // traits(td).blck_size * self.ndata
        need += traits(tl).type_size * self.ne_label // traits(tl).blck_size * self.ndata
        self.ctx = Context(mem_size=need)
        self.data: Tensor = self.ctx.new_tensor(td, (self.ne_datapoint, self.ndata), "data")
        self.labels: Tensor | None = (self.ctx.new_tensor(tl, (self.ne_label, self.ndata), "labels")
                                      if self.ne_label > 0 else None)
        nshards = self.ndata // self.ndata_shard
        self.nbs_data = self.data.nbytes * self.ndata_shard // self.ndata  # bytes per shard (ggml's formula)
        self.nbs_labels = self.labels.nbytes * self.ndata_shard // self.ndata if self.labels is not None else 0
        self.permutation = np.arange(nshards, dtype=np.int64)

    @classmethod
    def from_numpy(cls, data: Any, labels: Any = None, ndata_shard: int = 1, *,
                   type_data: GGMLType | int | str = F32, type_label: GGMLType | int | str = F32) -> Dataset:
        """A dataset holding ``data`` (NumPy shape ``(ndata, ne_datapoint)``) and optional
        ``labels`` (``(ndata, ne_label)``), converted to the given types."""
        d = np.asarray(data)
        if d.ndim != 2:
            raise ShapeMismatch(f"Dataset.from_numpy: data must be 2-dim (ndata, ne_datapoint), got shape {d.shape}")
        lab = None if labels is None else np.asarray(labels)
        if lab is not None:
            if lab.ndim != 2:
                raise ShapeMismatch(f"Dataset.from_numpy: labels must be 2-dim (ndata, ne_label), got shape "
                                    f"{lab.shape}")
            if lab.shape[0] != d.shape[0]:
                raise ShapeMismatch(f"Dataset.from_numpy: data has {d.shape[0]} rows but labels have {lab.shape[0]}")
        ds = cls(d.shape[1], 0 if lab is None else lab.shape[1], d.shape[0], ndata_shard,
                 type_data=type_data, type_label=type_label)
        ds.data.set(d.reshape(ds.data.shape))
        if lab is not None and ds.labels is not None:
            ds.labels.set(lab.reshape(ds.labels.shape))
        return ds

    @property
    def nshards(self) -> int:
        return len(self.permutation)

    # ------------------------------------------------------------ shuffling
    def shuffle(self, rng: Any, idata: int = -1) -> None:
        """``ggml_opt_dataset_shuffle``: permute all shards (``idata < 0``) or only the
        first ``idata / ndata_shard`` of them. ``rng`` is an :class:`MT19937` or an
        optimizer context (its persistent generator is used and advanced)."""
        gen = getattr(rng, "rng", rng)
        if not isinstance(gen, MT19937):
            raise InvalidArgument(f"Dataset.shuffle: rng must be an MT19937 or an optimizer context, "
                                  f"got {type(rng).__name__}")
        if isinstance(idata, bool) or not isinstance(idata, (int, np.integer)):
            raise InvalidArgument(f"Dataset.shuffle: idata must be an int, got {idata!r}")
        if idata < 0:
            shuffle(self.permutation, gen)
            return
        if idata > self.ndata:
            raise InvalidArgument(f"Dataset.shuffle: idata={idata} exceeds ndata={self.ndata}")
        if idata % self.ndata_shard:
            raise InvalidArgument(f"Dataset.shuffle: idata={idata} is not a multiple of ndata_shard="
                                  f"{self.ndata_shard}")
        shuffle(self.permutation, gen, 0, idata // self.ndata_shard)

    # ------------------------------------------------------------- batches
    def _shards_per_batch(self, nb_data: int, nb_labels: int | None, ibatch: int) -> int:
        if isinstance(ibatch, bool) or not isinstance(ibatch, (int, np.integer)) or ibatch < 0:
            raise InvalidArgument(f"Dataset.get_batch: ibatch must be an int >= 0, got {ibatch!r}")
        if nb_data == 0 or nb_data % self.nbs_data:
            raise ShapeMismatch(f"Dataset.get_batch: the data batch has {nb_data} bytes, not a positive multiple of "
                                f"the {self.nbs_data} bytes of one shard ({self.ndata_shard} datapoints of "
                                f"{self.ne_datapoint} {traits(self.data.type).name}); batches hold whole shards")
        spb = nb_data // self.nbs_data
        if nb_labels is not None and nb_labels != spb * self.nbs_labels:
            raise ShapeMismatch(f"Dataset.get_batch: the labels batch has {nb_labels} bytes, the data batch holds "
                                f"{spb} shards whose labels need {spb * self.nbs_labels} bytes")
        if (ibatch + 1) * spb > self.nshards:
            nbatches = self.nshards // spb
            raise InvalidArgument(f"Dataset.get_batch: batch {ibatch} of {spb * self.ndata_shard} datapoints is past "
                                  f"the end ({self.ndata} datapoints make {nbatches} such batches)")
        return spb

    def _copy(self, src: Tensor, dst: np.ndarray, nbs: int, spb: int, ibatch: int) -> None:
        shards = self.permutation[ibatch * spb:(ibatch + 1) * spb]
        rows = src.storage()[src.view_offs:src.view_offs + self.nshards * nbs].reshape(self.nshards, nbs)
        dst.reshape(spb, nbs)[...] = rows[shards]

    def get_batch(self, data_batch: Tensor, labels_batch: Tensor | None, ibatch: int) -> None:
        """``ggml_opt_dataset_get_batch``: fill ``data_batch`` (and ``labels_batch``) with
        the shards of batch ``ibatch`` in permutation order. The batch tensors must be
        contiguous and of the dataset's types; their byte sizes fix the batch size."""
        if not isinstance(data_batch, Tensor):
            raise InvalidArgument(f"Dataset.get_batch: data_batch must be a Tensor, got {type(data_batch).__name__}")
        if labels_batch is not None and not isinstance(labels_batch, Tensor):
            raise InvalidArgument("Dataset.get_batch: labels_batch must be a Tensor or None, "
                                  f"got {type(labels_batch).__name__}")
        if (labels_batch is None) != (self.labels is None):
            raise InvalidArgument("Dataset.get_batch: " + (
                "the dataset has labels but no labels batch was given (a loss without labels, MEAN or SUM, "
                "cannot train on a labelled dataset)" if labels_batch is None else
                "a labels batch was given but the dataset has no labels (ne_label = 0)"))
        for what, t, ref in (("data_batch", data_batch, self.data), ("labels_batch", labels_batch, self.labels)):
            if t is None or ref is None:
                continue
            if not t.is_contiguous():
                raise InvalidArgument(f"Dataset.get_batch: {what} {t.label} must be contiguous")
            if t.type != ref.type:
                raise TypeMismatch(f"Dataset.get_batch: {what} has type {t.traits.name}, the dataset's "
                                   f"{'data' if ref is self.data else 'labels'} are {ref.traits.name}")
        spb = self._shards_per_batch(data_batch.nbytes, None if labels_batch is None else labels_batch.nbytes, ibatch)

        def raw(t: Tensor) -> np.ndarray:
            return t.storage()[t.view_offs:t.view_offs + t.nbytes]

        self._copy(self.data, raw(data_batch), self.nbs_data, spb, ibatch)
        if labels_batch is not None and self.labels is not None:
            self._copy(self.labels, raw(labels_batch), self.nbs_labels, spb, ibatch)

    def get_batch_host(self, data_batch: np.ndarray, labels_batch: np.ndarray | None, ibatch: int) -> None:
        """``ggml_opt_dataset_get_batch_host``: the same copy into C-contiguous NumPy arrays
        (their byte sizes fix the batch size; the bytes are the dataset's element type)."""
        arrays = [("data_batch", data_batch)] + ([("labels_batch", labels_batch)] if labels_batch is not None else [])
        for what, a in arrays:
            if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
                raise InvalidArgument(f"Dataset.get_batch_host: {what} must be a writeable C-contiguous NumPy array")
        if (labels_batch is None) != (self.labels is None):
            raise InvalidArgument("Dataset.get_batch_host: labels_batch must be given exactly when the dataset has "
                                  "labels")
        spb = self._shards_per_batch(data_batch.nbytes, None if labels_batch is None else labels_batch.nbytes, ibatch)
        self._copy(self.data, data_batch.reshape(-1).view(np.uint8), self.nbs_data, spb, ibatch)
        if labels_batch is not None and self.labels is not None:
            self._copy(self.labels, labels_batch.reshape(-1).view(np.uint8), self.nbs_labels, spb, ibatch)

    # ------------------------------------------------------------ checks
    def check(self, probabilities: bool = False) -> None:
        """Refuse data a training run cannot use, naming the first bad datapoint: non-finite
        data or labels, and with ``probabilities`` (the cross-entropy loss) labels that are not
        distributions: negative, or rows not summing to 1 (to within the label type's rounding).
        One pass over the data; quantized data is not read."""
        for what, t in (("data", self.data), ("labels", self.labels)):
            if t is None or t.type not in FLOAT_TYPES:
                continue
            vals = t.numpy().reshape(self.ndata, -1)
            bad = ~np.isfinite(vals).all(axis=1)
            if bad.any():
                raise InvalidArgument(f"Dataset: {what} of datapoint {int(np.argmax(bad))} "
                                      f"{'is' if vals.shape[1] == 1 else 'holds'} NaN or infinity "
                                      f"({int(bad.sum())} datapoints do)")
            if what == "labels" and probabilities:
                neg = (vals < 0).any(axis=1)
                if neg.any():
                    i = int(np.argmax(neg))
                    raise InvalidArgument(f"Dataset: the labels of datapoint {i} are not a probability "
                                          f"distribution: {float(vals[i].min())} < 0 ({int(neg.sum())} datapoints "
                                          "have negative labels)")
                sums = vals.astype(np.float64).sum(axis=1)
                tol = max(1e-5, vals.shape[1] * float(np.finfo(np.float32).eps if t.type in (F32, F64) else 2.0**-8))
                off = np.abs(sums - 1.0) > tol
                if off.any():
                    i = int(np.argmax(off))
                    raise InvalidArgument(f"Dataset: the labels of datapoint {i} sum to {sums[i]:.7g}, not 1: the "
                                          f"cross-entropy loss needs a probability distribution per datapoint "
                                          f"({int(off.sum())} datapoints do not sum to 1)")

    def __repr__(self) -> str:
        return (f"Dataset(ndata={self.ndata}, ne_datapoint={self.ne_datapoint}, ne_label={self.ne_label}, "
                f"ndata_shard={self.ndata_shard}, {self.data.traits.name})")
