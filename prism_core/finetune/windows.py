"""A dataset of token windows from one text, as llama.cpp's finetune builds it (common_opt_dataset_init).

The text is tokenized once (with the model's BOS, specials not parsed: common_tokenize(ctx, text, true)).
Datapoint i is the ``n_ctx`` tokens starting at ``i * stride``; its labels are the same window moved one
token on (the next token at every position). There are ``(n_tokens - n_ctx - 1) // stride`` windows,
llama.cpp's count (it leaves the last window out when the text ends exactly on it), one window per shard,
so ggml-opt's shuffles permute windows.

The labels are stored as token ids; a batch's labels tensor is filled with them (an optimizer context with
sparse labels) or with their one-hot rows (ggml-opt's F32 [n_vocab, n_ctx * windows] labels, as llama.cpp's
opt_epoch_iter fills them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InvalidArgument, ShapeMismatch, TypeMismatch
from ..tensor import Tensor
from ..train.dataset import Dataset
from ..types import F32, I32


def window_count(n_tokens: int, n_ctx: int, stride: int) -> int:
    """llama.cpp's number of windows: (n_tokens - n_ctx - 1) // stride, never below 0."""
    return max(0, (n_tokens - n_ctx - 1) // stride)


class TokenWindows(Dataset):
    """Windows of ``n_ctx`` token ids of ``ids`` every ``stride`` tokens, labelled with the next tokens."""

    def __init__(self, ids: Sequence[int] | np.ndarray, n_ctx: int, n_vocab: int, stride: int | None = None, *,
                 multiple: int = 1) -> None:
        """``multiple``: keep the largest multiple of this many windows (a logical batch: ggml-opt's fit
        takes whole batches only); the windows past it are left out."""
        for name, v in (("n_ctx", n_ctx), ("n_vocab", n_vocab)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidArgument(f"TokenWindows: {name} must be a positive int, got {v!r}")
        stride = n_ctx // 2 if stride is None else stride
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
            raise InvalidArgument(f"TokenWindows: stride must be a positive int, got {stride!r} (n_ctx={n_ctx} "
                                  "gives the default n_ctx // 2 = 0: use a context of at least 2 tokens)")
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise InvalidArgument(f"TokenWindows: ids must be a 1-d sequence of ints, got {arr.dtype} {arr.shape}")
        bad = (arr < 0) | (arr >= n_vocab)
        if bad.any():
            raise InvalidArgument(f"TokenWindows: token id {int(arr[bad][0])} at index {int(np.argmax(bad))} is "
                                  f"outside the vocabulary [0, {n_vocab})")
        if isinstance(multiple, bool) or not isinstance(multiple, (int, np.integer)) or multiple < 1:
            raise InvalidArgument(f"TokenWindows: multiple must be a positive int, got {multiple!r}")
        n_windows = window_count(len(arr), int(n_ctx), int(stride))
        ndata = n_windows // multiple * multiple
        if n_windows >= 1 and ndata < 1:
            raise InvalidArgument(f"the text gives {n_windows} training window{'s' if n_windows > 1 else ''} of "
                                  f"{n_ctx} tokens (stride {stride}), fewer than one batch of {multiple}: give a "
                                  "longer text or a smaller batch")
        if ndata < 1:
            raise InvalidArgument(f"the text is {len(arr)} tokens long, shorter than one training window: a context "
                                  f"of {n_ctx} tokens with a stride of {stride} needs at least {n_ctx + stride + 1} "
                                  "tokens (llama.cpp's count: (tokens - ctx - 1) // stride windows); give a longer "
                                  "text or a smaller --ctx")
        super().__init__(int(n_ctx), int(n_ctx), ndata, 1, type_data=I32, type_label=I32)
        self.n_vocab, self.stride, self.n_tokens = int(n_vocab), int(stride), len(arr)
        self.n_left_out = n_windows - ndata
        starts = np.arange(ndata)[:, None] * self.stride + np.arange(self.n_ctx)[None, :]
        arr = arr.astype(np.int32)
        self.data.set(arr[starts])
        assert self.labels is not None
        self.labels.set(arr[starts + 1])

    @property
    def n_ctx(self) -> int:
        return self.ne_datapoint

    def window(self, i: int) -> np.ndarray:
        """The ids of datapoint ``i`` (storage order, not shuffled) and the token after it: n_ctx + 1 ids."""
        assert self.labels is not None
        ids = self.data.numpy()[i]
        return np.concatenate([ids, self.labels.numpy()[i][-1:]])

    def get_batch(self, data_batch: Tensor, labels_batch: Tensor | None, ibatch: int) -> None:
        """Batch ``ibatch``'s windows (in permutation order) into ``data_batch`` (I32 [n_ctx, windows]) and
        their next tokens into ``labels_batch``: as ids (I32 [n_ctx * windows], an optimizer context with
        sparse labels) or one-hot (F32 [n_vocab, n_ctx * windows], ggml-opt's labels)."""
        if labels_batch is None or labels_batch.type == I32:
            return super().get_batch(data_batch, labels_batch, ibatch)  # a raw copy, as ggml's
        if not isinstance(labels_batch, Tensor) or labels_batch.type != F32 or not labels_batch.is_contiguous():
            raise TypeMismatch("TokenWindows.get_batch: labels_batch must be a contiguous F32 tensor [n_vocab, "
                               f"tokens], got {getattr(labels_batch, 'label', type(labels_batch).__name__)}")
        if not isinstance(data_batch, Tensor) or data_batch.type != I32 or not data_batch.is_contiguous():
            raise TypeMismatch("TokenWindows.get_batch: data_batch must be a contiguous I32 tensor [n_ctx, windows]")
        spb = self._shards_per_batch(data_batch.nbytes, None, ibatch)
        if labels_batch.ne[0] != self.n_vocab or labels_batch.nelements != self.n_vocab * self.n_ctx * spb:
            raise ShapeMismatch(f"TokenWindows.get_batch: labels_batch has ne={list(labels_batch.ne)}, a batch of "
                                f"{spb} windows needs [{self.n_vocab}, {self.n_ctx * spb}]")
        shards = self.permutation[ibatch * spb:(ibatch + 1) * spb]
        data_batch.host().reshape(spb, self.n_ctx)[...] = self.data.host().reshape(-1, self.n_ctx)[shards]
        assert self.labels is not None
        nxt = self.labels.host().reshape(-1, self.n_ctx)[shards].reshape(-1)
        onehot = labels_batch.host().reshape(-1, self.n_vocab)
        onehot.fill(0.0)
        onehot[np.arange(len(nxt)), nxt] = 1.0

    def __repr__(self) -> str:
        return (f"TokenWindows({self.ndata} windows of {self.n_ctx} tokens every {self.stride}, from "
                f"{self.n_tokens} tokens)")
