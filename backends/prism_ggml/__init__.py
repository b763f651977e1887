"""The ggml backend: ggml's own CPU kernels, through ggml-python's ctypes bindings.

Registered through the ``prism.backends`` entry point exactly as a third party registers one
(``pip install '.[ggml]'`` installs ggml-python). Without ggml-python it is listed as unavailable
with the reason.

Each node Prism gives it becomes a ggml tensor of the same type, extents and strides whose data
pointer is the node's own host memory (sources likewise: model weights are read in place, never
copied). A plan hands it each run of consecutive nodes it claims (:meth:`GgmlBackend.prepare_run`),
built once as one ggml graph and computed with one ``ggml_backend_graph_compute`` on a ggml CPU
backend with ``PRISM_NUM_THREADS`` threads (default: all cores; fewer while another process keeps
the cores busy, by prism_core.contention's rule). It claims a node when it has a builder for the
op, ggml's CPU backend says it supports the built tensor (``ggml_backend_supports_op``), and the
node is one ggml computes with Prism's semantics; everything else falls back per node to the
reference. Where ggml's results differ from the reference's, docs/backends/ggml.md says how and why.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import prism_core
from prism_core import NodeRun, Tensor, contention
from prism_core.errors import Unsupported
from prism_core.settings import requested_threads

from .build import BUILDERS, Built, ggml_module, node_graph, run_graph

_state: dict[str, object] = {}


class _CpuBackend:
    """One ggml CPU backend: its graph computes are not reentrant (it keeps one work buffer), so
    each calling thread computes on its own, freed with the thread."""

    def __init__(self, threads: int) -> None:
        g = ggml_module()
        self.handle = g.ggml_backend_cpu_init()
        if not self.handle:
            raise Unsupported("ggml_backend_cpu_init() returned NULL")
        self.threads = 0
        self.use(threads)

    def use(self, threads: int) -> None:
        if threads != self.threads:
            ggml_module().ggml_backend_cpu_set_n_threads(self.handle, threads)
            self.threads = threads

    def __del__(self) -> None:
        try:
            ggml_module().ggml_backend_free(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_local = threading.local()


def _cpu_backend() -> _CpuBackend:
    """The calling thread's ggml CPU backend, with this compute's thread count: the usual
    setting, fewer while another process keeps the cores busy (prism_core.contention's rule)."""
    want = int(_state["threads"])  # type: ignore[arg-type]
    if _state["adaptive"]:
        want = contention.threads_now(want)
    cpu = getattr(_local, "cpu", None)
    if cpu is None:
        cpu = _local.cpu = _CpuBackend(want)
    cpu.use(want)
    return cpu


def _setup() -> tuple[bool, str]:
    if "ok" in _state:
        return _state["ok"], _state["reason"]  # type: ignore[return-value]
    try:
        ggml_module()
        n = requested_threads()
        adaptive = contention.adaptive()
    except ValueError as e:
        ok, reason = False, str(e)
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        ok, reason = False, (f"ggml-python is not importable ({type(e).__name__}: {e}); "
                             "install it with pip install 'prism-tensor[ggml]'")
    else:
        _state.update(threads=n if n is not None else (os.cpu_count() or 1), adaptive=adaptive)
        try:
            _state.update(probe=_CpuBackend(1))  # answers ggml_backend_supports_op, from any thread
            ok, reason = True, ""
        except Unsupported as e:
            ok, reason = False, str(e)
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
            if not ggml_module().ggml_backend_supports_op(_state["probe"].handle, built.out):
                return "ggml's CPU backend does not support these types or shapes"
        finally:
            built.free()
        return ""

    def prepare_run(self, run: NodeRun) -> Callable[[], None]:
        """The run's nodes as one ggml graph: one ``ggml_backend_graph_compute`` (one start of ggml's
        threads) for all of them. Every node reads and writes Prism's memory, internal results
        included: the plan's arena already reuses their bytes as ggml-alloc would."""
        return self._graph_call(run_graph(run.nodes, with_data=True), run.nodes)

    def prepare(self, node: Tensor) -> Callable[[], None]:
        return self._graph_call(node_graph(node, with_data=True), (node,))

    @staticmethod
    def _graph_call(built: Built, nodes: tuple[Tensor, ...]) -> Callable[[], None]:
        compute, graph = ggml_module().ggml_backend_graph_compute, built.graph

        def call() -> None:
            status = compute(_cpu_backend().handle, graph)
            if status != 0:
                what = nodes[0].label if len(nodes) == 1 else f"a run of {len(nodes)} nodes from {nodes[0].label}"
                raise Unsupported(f"ggml_backend_graph_compute returned status {status} for {what}")
        call.built = built  # type: ignore[attr-defined] # keeps the ggml context alive with the call
        return call

    def compute(self, node: Tensor) -> None:
        self.prepare(node)()


__all__ = ["GgmlBackend"]


@prism_core.hookimpl
def prism_register_backends() -> list:
    return [GgmlBackend()]
