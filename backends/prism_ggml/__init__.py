"""The ggml backend: ggml's own CPU kernels, through ggml-python's ctypes bindings.

Registered through the ``prism.backends`` entry point exactly as a third party registers one
(``pip install '.[ggml]'`` installs ggml-python). Without ggml-python it is listed as unavailable
with the reason.

Each node Prism gives it becomes a ggml tensor of the same type, extents and strides whose data
pointer is the node's own host memory (sources likewise: model weights are read in place, never
copied), built once per plan (:meth:`GgmlBackend.prepare`) and computed with
``ggml_backend_graph_compute`` on a ggml CPU backend with ``PRISM_NUM_THREADS`` threads (default:
all cores). It claims a node when it has a builder for the op, ggml's CPU backend says it supports
the built tensor (``ggml_backend_supports_op``), and the node is one ggml computes with Prism's
semantics; everything else falls back per node to the reference. Where ggml's results differ
from the reference's, docs/backends/ggml.md says how and why.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import prism_core
from prism_core import Tensor
from prism_core.errors import Unsupported
from prism_core.settings import requested_threads

from .build import BUILDERS, ggml_module, node_graph

_state: dict[str, object] = {}


def _setup() -> tuple[bool, str]:
    if "ok" in _state:
        return _state["ok"], _state["reason"]  # type: ignore[return-value]
    try:
        g = ggml_module()
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        ok, reason = False, (f"ggml-python is not importable ({type(e).__name__}: {e}); "
                             "install it with pip install 'prism-tensor[ggml]'")
    else:
        try:
            n = requested_threads()
        except ValueError as e:
            _state.update(ok=False, reason=str(e))
            return False, str(e)
        be = g.ggml_backend_cpu_init()
        if not be:
            ok, reason = False, "ggml_backend_cpu_init() returned NULL"
        else:
            threads = n if n is not None else (os.cpu_count() or 1)
            g.ggml_backend_cpu_set_n_threads(be, threads)
            _state.update(backend=be, threads=threads)
            ok, reason = True, ""
    _state.update(ok=ok, reason=reason)
    return ok, reason


class GgmlBackend(prism_core.Backend):
    name = "ggml"
    priority = 5  # never the default: a peer to certify against and to compare with
    activation_precision = "q8"
    block_types = prism_core.ops.table.QUANTIZED

    @property
    def version(self) -> str:  # type: ignore[override]
        try:
            import importlib.metadata as md
            return f"ggml-python {md.version('ggml-python')}"
        except Exception:  # noqa: BLE001
            return "unavailable"

    def availability(self) -> tuple[bool, str]:
        return _setup()

    @property
    def threads(self) -> int:
        ok, _ = self.availability()
        return int(_state.get("threads", 1)) if ok else 1  # type: ignore[arg-type]

    def refusal(self, node: Tensor) -> str:
        ok, reason = self.availability()
        if not ok:
            return reason
        d = node.opdef
        if d is None or d.key not in BUILDERS:
            return "no ggml builder for this op"
        try:
            built = node_graph(node, with_data=False)
        except Unsupported as e:
            return str(e)
        try:
            if not ggml_module().ggml_backend_supports_op(_state["backend"], built.out):
                return "ggml's CPU backend does not support these types or shapes"
        finally:
            built.free()
        return ""

    def prepare(self, node: Tensor) -> Callable[[], None]:
        built = node_graph(node, with_data=True)
        g, be, graph = ggml_module(), _state["backend"], built.graph

        def call() -> None:
            status = g.ggml_backend_graph_compute(be, graph)
            if status != 0:
                raise Unsupported(f"ggml_backend_graph_compute returned status {status} for {node.label}")
        call.built = built  # type: ignore[attr-defined] # keeps the ggml context alive with the call
        return call

    def compute(self, node: Tensor) -> None:
        self.prepare(node)()


__all__ = ["GgmlBackend"]


@prism_core.hookimpl
def prism_register_backends() -> list:
    return [GgmlBackend()]
