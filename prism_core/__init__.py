"""Prism: ggml's tensor-compute semantics in Python, with swappable kernel backends.

Quick start::

    import numpy as np
    import prism_core as pc

    ctx = pc.Context()
    w = ctx.from_numpy(np.ones((3, 4), np.float32))    # NumPy order: 3 rows of 4
    x = ctx.from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
    y = pc.mul_mat(w, x)                                # ggml convention: x @ w.T
    pc.compute(y)                                       # best available backend
    print(y.numpy())                                    # shape (2, 3)
"""

from __future__ import annotations

from . import _moved, quant, types
from .autodiff import build_backward, reset
from .context import Context
from .errors import (
    BackendUnavailable,
    BoundExceeded,
    InvalidArgument,
    MalformedFile,
    PluginError,
    PrismError,
    PrismWarning,
    ReadOnlyTensor,
    ShapeMismatch,
    TypeMismatch,
    UnknownBackend,
    Unsupported,
)
from .graph import Graph, build_forward
from .ops import GluOp, Op, SortOrder, UnaryOp, build
from .ops import table as optable
from .ops.build import *  # noqa: F403 - the graph-building functions are the public API
from .ops.build import node
from .ops.table import OPS, OpDef, opdef
from .plan import Plan, Workspace, plan
from .plugin.base import Backend, Kernel, KernelTable, NodeRun, type_refusal
from .plugin.hookspecs import INTERFACE_VERSION, hookimpl
from .plugin.registry import (
    REGISTRY,
    BackendInfo,
    BrokenPlugin,
    backends,
    broken_plugins,
    use_backend,
    using_backend,
)
from .plugin.registry import backend as _select_backend
from .schedule import ComputeReport, compute
from .tensor import Flag, Tensor
from .types import BF16, F16, F32, F64, I8, I16, I32, I64, GGMLType

__version__ = "0.1.0"
from . import train  # noqa: E402  - training as in ggml-opt (prism_core.train)

_moved.install()


class _BackendFunction:
    """``prism_core.backend(name)`` selects a backend. The module that was called ``prism_core.backend``
    is :mod:`prism_core.plugin.base` now; its names (``prism_core.backend.KernelTable``) still resolve,
    with a DeprecationWarning, and ``import prism_core.backend`` no longer hides this function."""

    def __init__(self, select):
        self.__wrapped__ = select
        self.__doc__ = select.__doc__
        self.__name__ = self.__qualname__ = "backend"
        self.__module__ = __name__

    def __call__(self, name: str | None = None) -> Backend:
        return self.__wrapped__(name)

    def __getattr__(self, attr: str):
        from .plugin import base
        if attr.startswith("__") or not hasattr(base, attr):
            raise AttributeError(f"prism_core.backend has no attribute {attr!r}")
        _moved.warn_moved(f"prism_core.backend.{attr}", f"prism_core.plugin.base.{attr}")
        return getattr(base, attr)

    def __repr__(self) -> str:
        return "<function prism_core.backend(name=None)>"


backend = _BackendFunction(_select_backend)
__import__("sys").modules[__name__ + ".backend"] = backend  # the old module's spelling, deprecated


def __getattr__(name: str):
    import importlib
    if name == "gguf":  # GGUF files (prism_core.gguf), imported on first use: the gguf package takes 0.1 s
        return importlib.import_module(".gguf", __name__)
    if f"{__name__}.{name}" in _moved.MOVED:  # an old module's name (pc.registry): imported, deprecated
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'prism_core' has no attribute {name!r}")
