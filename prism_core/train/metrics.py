"""Training/validation statistics (ggml_opt_result_*).

One :class:`Result` collects, per evaluated physical batch, the loss value, the number
of datapoints, the predictions and the number of correct predictions (classification).
The formulas follow ggml-opt:

* loss: each batch value ``v`` is multiplied by ``opt_period`` when the loss is
  per-datapoint (MEAN, CROSS_ENTROPY, MEAN_SQUARED_ERROR scale it by 1/opt_period).
  Per-datapoint: loss = mean(v), uncertainty = sqrt(var / (N - 1)); summed (SUM):
  loss = sum(v), uncertainty = sqrt(var * N / (N - 1)); var = mean(v^2) - mean(v)^2.
  N < 2 gives an uncertainty of NaN; N = 0 gives loss 0.
* accuracy = ncorrect / ndata (NaN without a classification loss), uncertainty
  sqrt(acc (1 - acc) / (ndata - 1)) for ndata >= 2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InvalidArgument


class Result:
    """``ggml_opt_result``: statistics over the batches evaluated with it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Clear everything (``ggml_opt_result_reset``)."""
        self.ndata = 0
        self.losses: list[np.float32] = []
        self._pred: list[np.ndarray] = []
        self.ncorrect = 0
        self.opt_period = 1
        self.loss_per_datapoint = False

    # -------------------------------------------------------------- record
    def add_batch(self, loss: float, ndata: int, *, ncorrect: int | None = None, pred: Any = None,
                  opt_period: int = 1, loss_per_datapoint: bool = True) -> None:
        """Record one evaluated batch, as ``ggml_opt_eval`` does. ``ncorrect=None`` means
        the loss is not a classification loss (accuracy becomes NaN for good)."""
        if isinstance(ndata, bool) or not isinstance(ndata, (int, np.integer)) or ndata <= 0:
            raise InvalidArgument(f"Result.add_batch: ndata must be a positive int, got {ndata!r}")
        if isinstance(opt_period, bool) or not isinstance(opt_period, (int, np.integer)) or opt_period < 1:
            raise InvalidArgument(f"Result.add_batch: opt_period must be an int >= 1, got {opt_period!r}")
        if self.ndata == 0:
            self.loss_per_datapoint = bool(loss_per_datapoint)
            self.opt_period = int(opt_period)
        elif self.loss_per_datapoint != bool(loss_per_datapoint) or self.opt_period != opt_period:
            raise InvalidArgument(
                "Result.add_batch: this result already holds batches with "
                f"loss_per_datapoint={self.loss_per_datapoint}, opt_period={self.opt_period}; got "
                f"loss_per_datapoint={bool(loss_per_datapoint)}, opt_period={opt_period} (use one result per "
                "optimizer context)")
        if self.ndata != ndata * len(self.losses):
            raise InvalidArgument(f"Result.add_batch: batches of {ndata} datapoints after batches of "
                                  f"{self.ndata // max(len(self.losses), 1)}; a varying batch size is not supported")
        p = None
        if pred is not None:
            p = np.asarray(pred, dtype=np.int32).reshape(-1)
            if p.size != ndata:
                raise InvalidArgument(f"Result.add_batch: pred has {p.size} values for {ndata} datapoints")
        self.ndata += int(ndata)
        self.losses.append(np.float32(loss))
        if p is not None:
            self._pred.append(p)
        if ncorrect is None or self.ncorrect < 0:
            self.ncorrect = -1
        else:
            self.ncorrect += int(ncorrect)

    # ------------------------------------------------------------- queries
    @property
    def nbatches(self) -> int:
        return len(self.losses)

    def loss(self) -> tuple[float, float]:
        """(loss, uncertainty) as ``ggml_opt_result_loss``."""
        n = len(self.losses)
        if n == 0:
            return 0.0, math.nan
        period = np.float32(self.opt_period)
        total = 0.0
        total_sq = 0.0
        for v in self.losses:  # float32 scaling and squaring, double sums, as in ggml
            s = v * period if self.loss_per_datapoint else v
            total += float(s)
            total_sq += float(s * s)
        mean = total / n
        loss = mean if self.loss_per_datapoint else total
        if n < 2:
            return loss, math.nan
        var = total_sq / n - mean * mean
        unc = math.sqrt(var / (n - 1)) if self.loss_per_datapoint else math.sqrt(var * n / (n - 1))
        return loss, unc

    def accuracy(self) -> tuple[float, float]:
        """(accuracy, uncertainty) as ``ggml_opt_result_accuracy``; NaN without classification."""
        if self.ncorrect < 0 or self.ndata == 0:
            acc = math.nan
        else:
            acc = self.ncorrect / self.ndata
        unc = (math.sqrt(max(acc * (1.0 - acc), 0.0) / (self.ndata - 1))
               if self.ncorrect >= 0 and self.ndata >= 2 else math.nan)
        return acc, unc

    def pred(self) -> np.ndarray:
        """All predictions so far, in evaluation order (int32)."""
        return np.concatenate(self._pred) if self._pred else np.zeros(0, dtype=np.int32)

    def __repr__(self) -> str:
        loss, lu = self.loss()
        acc, au = self.accuracy()
        return (f"Result(ndata={self.ndata}, loss={loss:.5f}±{lu:.5f}"
                + (f", accuracy={acc:.4f}±{au:.4f}" if self.ncorrect >= 0 and self.ndata else "") + ")")
