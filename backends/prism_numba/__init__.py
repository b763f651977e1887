"""The Numba backend: parallel compiled kernels on the strided host memory.

Registered through the ``prism.backends`` entry point like any third-party backend.
numba itself is imported only by :meth:`NumbaBackend.availability`, the ``threads``
property and the first kernel call, so an environment without numba still discovers
the backend and lists it as unavailable with the reason.

Threads: all cores by default; ``PRISM_NUM_THREADS=n`` sets the count (capped at
numba's ``NUMBA_NUM_THREADS``), applied with ``numba.set_num_threads`` before every
kernel call (numba's setting is per calling thread), fewer while the calling thread waits often for a
CPU (another process busy on the cores: :mod:`prism_core.contention`; ``PRISM_ADAPTIVE_THREADS=0`` keeps
the count). Nodes with little work (under
``SERIAL_WORK`` elementary steps, or ``$PRISM_NUMBA_SERIAL_WORK``; 0 parallelises every
node) run on the calling thread alone, with each kernel's serial compilation (no ``prange``
launch): waking the pool costs more than they do.

``prepare(node)`` (used by plans) records a node's kernel calls once, entry points resolved
and arguments bound, so that a planned small node costs about one compiled-function call.

``warm_up()`` compiles (or loads from the on-disk cache) the kernels of common graphs.
"""

from __future__ import annotations

if __name__ != "prism_numba":
    # numba names a cached kernel's file after its source file, and a cached kernel imports its module by the
    # name it was compiled under: a second name for these files would load the other name's entries (and fail
    # where that name does not import) or overwrite them
    raise ImportError(f"import prism_numba, not {__name__}: numba's on-disk cache of its kernels holds one module "
                      "name per file (pip install -e . puts backends/ on sys.path)")

from collections.abc import Callable
from functools import partial
from importlib import metadata

import prism_core
from prism_core import Tensor, contention
from prism_core.errors import Unsupported
from prism_core.settings import env_int, requested_threads

# kernels_ext registers the RoPE, attention and convolution wrappers; kernels_quant then the block-type
# cases (re-registering MUL_MAT, GET_ROWS, CPY, ... with block types added to the float wrappers)
from . import isa, kernels_ext, kernels_quant  # noqa: F401
from .kernels import EMPTY_SOURCE_ZEROS, KERNELS, TABLE, BoundCall, record, run_wrapper
from .warmup import warm_up

__all__ = ["NumbaBackend", "warm_up"]

MIN_NUMBA = (0, 59)


def _numba_version() -> str:
    try:
        return metadata.version("numba")
    except metadata.PackageNotFoundError:
        return "missing"


ENV_SERIAL_WORK = "PRISM_NUMBA_SERIAL_WORK"
SERIAL_WORK = 1 << 16  # default: nodes with less work than this run on the calling thread alone


def _work(node: Tensor) -> int:
    """A rough count of a node's elementary steps."""
    if node.opdef is not None and node.opdef.key in ("MUL_MAT", "OUT_PROD"):
        return node.nelements * node.src[0].ne[0 if node.opdef.key == "MUL_MAT" else 1]
    return node.nelements + sum(s.nelements for s in node.src if s is not None)


def serial_work() -> int:
    """Nodes with fewer elementary steps than this run on one thread: ``$PRISM_NUMBA_SERIAL_WORK``
    (0 sends every node to the thread pool), else SERIAL_WORK. Raises ValueError when invalid."""
    return env_int(ENV_SERIAL_WORK, SERIAL_WORK, 0)


class NumbaBackend(prism_core.Backend):
    name = "numba"
    version = f"{prism_core.__version__}+numba{_numba_version()}"
    priority = 50
    kernels = KERNELS
    activation_precision = "q8"  # Q4_0/Q5_0/Q8_0/Q4_K/Q6_K products quantize activations as ggml
    block_types = kernels_quant.BLOCK_TYPES  # every block type the table holds (kernels_quant.py)
    _adaptive = True  # $PRISM_ADAPTIVE_THREADS, read by availability()

    def availability(self) -> tuple[bool, str]:
        try:
            import numba
        except Exception as e:  # noqa: BLE001 - any import failure means "not here"
            return False, f"numba cannot be imported: {type(e).__name__}: {e}"
        have = tuple(int(x) for x in numba.__version__.split(".")[:2] if x.isdigit())
        if have < MIN_NUMBA:
            return False, f"numba {numba.__version__} is too old; need >= {'.'.join(map(str, MIN_NUMBA))}"
        try:
            requested_threads()
            serial_work()
            isa.chosen()
            self._adaptive = contention.adaptive()
        except ValueError as e:
            return False, str(e)
        return True, ""

    def _apply_threads(self) -> int:
        """Set numba's thread count for this calling thread (numba's setting is per thread)."""
        import numba
        n = requested_threads()
        n = numba.config.NUMBA_NUM_THREADS if n is None else min(n, numba.config.NUMBA_NUM_THREADS)
        if self._adaptive:
            n = contention.threads_now(n)
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)
        return n

    @property
    def threads(self) -> int:
        ok, _ = self.availability()
        if not ok:
            return 1
        self._apply_threads()
        import numba
        return numba.get_num_threads()

    def compile_seconds(self) -> float:
        from .compile_progress import LISTENER
        return LISTENER.seconds

    def refusal(self, node: Tensor) -> str:
        """Why numba does not compute ``node`` ("" when it does); supports() derives from it."""
        refused = TABLE.refusal(node) or self._block_type_refusal(node)
        if refused:
            return refused
        tensors = [node, *(s for s in node.src if s is not None)]
        for t in tensors:
            if t.nelements <= 0 and (t is node or node.opdef.key not in EMPTY_SOURCE_ZEROS):
                return f"an empty tensor ({t.label})"
            refused = kernels_quant.dense_rows_refusal(t)
            if refused:
                return refused
            if not t.is_element_aligned():
                return f"{t.label}: offset or strides not multiples of its element size"
        # The kernels read and write element by element: a source may share the result's
        # memory only as the exact same view (in-place ops); any other overlap goes to the
        # reference, which reads its sources whole before writing.
        for s in tensors[1:]:
            if s.base is node.base and not s.same_view(node):
                return f"{s.label} shares the result's memory other than as the same view"
        return ""

    def compute(self, node: Tensor) -> None:
        if node.opdef is None or node.opdef.key not in KERNELS:
            super().compute(node)  # raises Unsupported
            return
        serial = _work(node) < serial_work()
        if not serial:
            self._apply_threads()
        run_wrapper(node, serial)

    def prepare(self, node: Tensor) -> Callable[[], None] | None:
        """The node's kernel calls resolved once: compiled entry points and bound arguments
        (kernels.record). A node with little work gets the serial compilations, called
        directly (no thread pool, no lock, no thread setting): a prepared call costs about
        what calling the compiled function costs. Whether a node is small is decided here,
        from ``PRISM_NUMBA_SERIAL_WORK`` as it is now; a parallel call applies the thread count
        (``PRISM_NUM_THREADS``) every time, as compute() does. None (the general compute)
        for wrappers that read tensor values."""
        if node.opdef is None or node.opdef.key not in KERNELS:
            return None
        serial = _work(node) < serial_work()
        try:
            calls = record(node, serial)
        except Unsupported:
            return None  # the general compute raises it again, where the plan runs
        if not calls:
            return None
        if all(not c.parallel for c in calls):
            if len(calls) == 1:
                return partial(calls[0].entry, *calls[0].args)
            bound = [partial(c.entry, *c.args) for c in calls]

            def serial_calls() -> None:
                for f in bound:
                    f()
            return serial_calls
        return partial(_parallel_calls, self, calls)


def _parallel_calls(be: NumbaBackend, calls: list[BoundCall]) -> None:
    import numba

    from ._jit import _RUN
    n = be._apply_threads()
    with _RUN:
        for c in calls:
            if c.stream and c.parallel and n > 1:
                numba.set_num_threads(max(1, n // 2))  # bound by memory bandwidth (kernels._stream_threads)
            c.entry(*c.args)
            if c.stream and c.parallel and n > 1:
                numba.set_num_threads(n)


@prism_core.hookimpl
def prism_register_backends() -> list[prism_core.Backend]:
    return [NumbaBackend()]
