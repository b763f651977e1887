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

from . import build, ops, optable, quant, types
from .autodiff import build_backward, reset
from .backend import Backend, Kernel, KernelTable, type_refusal
from .build import *  # noqa: F403 - the graph-building functions are the public API
from .build import node
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
from .hookspecs import INTERFACE_VERSION, hookimpl
from .ops import GluOp, Op, SortOrder, UnaryOp
from .optable import OPS, OpDef, opdef
from .plan import Plan, Workspace, plan
from .registry import (
    REGISTRY,
    BackendInfo,
    BrokenPlugin,
    backend,
    backends,
    broken_plugins,
    use_backend,
    using_backend,
)
from .schedule import ComputeReport, compute
from .tensor import Flag, Tensor
from .types import BF16, F16, F32, F64, I8, I16, I32, I64, GGMLType

__version__ = "0.1.0"
from . import train  # noqa: E402  - training as in ggml-opt (prism_core.train)


def __getattr__(name: str):
    if name == "gguf":  # GGUF files (prism_core.gguf), imported on first use: the gguf package takes 0.1 s
        import importlib
        return importlib.import_module(".gguf", __name__)
    raise AttributeError(f"module 'prism_core' has no attribute {name!r}")
