"""The csimd backend: C kernels (csrc/) bound with cffi in API mode, SIMD by run-time dispatch.

Registered through the ``prism.backends`` entry point like any third-party backend. The
extension ``prism_csimd._csimd`` is built by ``pip install`` of the project when a C
compiler is present; without it the backend is still listed, as unavailable with the reason.

Environment:

* ``PRISM_CSIMD_ISA=scalar|avx2|avxvnni|avx512`` (x86) or ``scalar|neon|dotprod|i8mm`` (arm64): force
  an instruction-set path the CPU runs (default: the best it runs). ``prism info`` shows the active
  one in the version string (``0.1.0+avx512``).
* ``PRISM_NUM_THREADS=n``: OpenMP threads per kernel (default: all cores); nodes with little
  work run on one thread (``PRISM_CSIMD_SERIAL_WORK``, default 32768 elementary steps).
* ``PRISM_ADAPTIVE_THREADS=1|0``: with 1 (the default), parallel kernels take fewer threads while
  the calling thread waits often for a CPU (another process busy on the cores), by the rule of
  :mod:`prism_core.contention`, run in C at every kernel entry (csrc/csimd_threads.h).
* ``GOMP_SPINCOUNT``: when neither it nor ``OMP_WAIT_POLICY`` is set, set to 3000
  (``PRISM_CSIMD_SPINCOUNT`` overrides) before the extension (and with it the OpenMP runtime)
  is loaded: idle workers spin briefly, then sleep. A process that loaded libgomp earlier
  (e.g. PyTorch) keeps that runtime's settings.
* ``PRISM_CSIMD_LIBRARY=/path/to/_csimd.*.so``: load that build of the extension instead of
  the installed one (the sanitized build: see csrc/README.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

import prism_core
from prism_core import Tensor, contention
from prism_core.ops.gelu_tables import gelu_f16_table, gelu_quick_f16_table
from prism_core.settings import ENV_THREADS, env_choice, env_int, env_values, requested_threads

from . import kernels as _k
from .kernels import KERNELS, TABLE
from .kernels_quant import dense_rows_refusal, quantizer_refusal
from .kernels_quant import quantize_rows as _quantize_rows
from .kernels_rope import rope_supported

ENV_ISA = "PRISM_CSIMD_ISA"
ENV_LIBRARY = "PRISM_CSIMD_LIBRARY"
ENV_SERIAL_WORK = "PRISM_CSIMD_SERIAL_WORK"
SERIAL_WORK = 1 << 15
#: the paths by their CSIMD_ISA_* numbers (csrc/csimd.h)
ISA_NAMES = ("scalar", "avx2", "avx512", "avxvnni", "neon", "dotprod", "i8mm")
ABI_VERSION = 7  # csrc/csimd.h's CSIMD_ABI_VERSION: the C signatures these wrappers call

_loaded: dict[str, object] = {}

# every C entry point the kernels call: an extension built from older sources is refused whole
REQUIRED_FUNCTIONS = (
    "csimd_abi_version", "csimd_cpu_isa", "csimd_isa_runs", "csimd_set_isa", "csimd_get_isa", "csimd_has_openmp",
    "csimd_max_threads",
    "csimd_set_adaptive_threads", "csimd_thread_watch_look", "csimd_thread_readings", "csimd_binary",
    "csimd_unary", "csimd_set_gelu_tables",
    "csimd_mul_mat", "csimd_soft_max", "csimd_norm", "csimd_cpy", "csimd_get_rows",
    "csimd_cross_entropy", "csimd_opt_step", "csimd_repeat", "csimd_reduce", "csimd_repeat_back", "csimd_rows_back",
    "csimd_diag_mask", "csimd_get_rows_back", "csimd_out_prod", "csimd_glu", "csimd_index_map", "csimd_arange",
    "csimd_argmax", "csimd_xielu", "csimd_timestep_embedding", "csimd_group_norm",
    "csimd_argsort", "csimd_set_rows", "csimd_mul_mat_id", "csimd_count_equal", "csimd_pool", "csimd_im2col",
    "csimd_pool_2d_back",
    "csimd_flash_attn_ext", "csimd_conv_2d", "csimd_conv_transpose_1d",
    "csimd_rope", "csimd_upscale", "csimd_im2col_back",
    "csimd_q_isa", "csimd_q_info", "csimd_q_dequantize", "csimd_q_quantize", "csimd_q_quantize_rows",
    "csimd_q_row_quantizer", "csimd_q_vec_dot", "csimd_q_mul_mat",
    "csimd_q_mul_mat_id", "csimd_q_get_rows", "csimd_q_cpy", "csimd_q_set_rows", "csimd_q_out_prod", "csimd_q_add",
)


def _load_module():
    """The extension module (cached); raises ImportError/OSError when it is missing or broken."""
    if "module" in _loaded:
        return _loaded["module"]
    if "error" in _loaded:
        raise _loaded["error"]  # type: ignore[misc]
    # OpenMP workers spin briefly, then sleep, between parallel regions: long spinning (libgomp's
    # default) starves the working threads on a shared or busy machine (10x slowdowns were
    # measured), while sleeping at once (OMP_WAIT_POLICY=PASSIVE) makes each hand-off a futex
    # wake-up (Gemma 3 270M decode at 2 threads: 50 tok/s against 81 spinning). 3000 spins decode
    # as fast as 30000 on an idle machine (81.6 against 80.9 tok/s, 3 runs each) and 1.5-2.3x
    # faster with another process busy on one of the 2 cores (29-35 against 12-24 tok/s). Read by
    # the OpenMP runtime when it is loaded; an explicit setting of either variable wins.
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = os.environ.get("PRISM_CSIMD_SPINCOUNT", "3000")
    try:
        path = os.environ.get(ENV_LIBRARY, "").strip()
        if path:
            spec = importlib.util.spec_from_file_location("prism_csimd._csimd", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"{ENV_LIBRARY}={path!r} is not a loadable extension module")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules["prism_csimd._csimd"] = mod
        else:
            from . import _csimd as mod  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - any failure means "not here"
        _loaded["error"] = e
        raise
    _loaded["module"] = mod
    return mod


def serial_work() -> int:
    """Nodes with fewer elementary steps than this run on one thread: ``$PRISM_CSIMD_SERIAL_WORK``."""
    return env_int(ENV_SERIAL_WORK, SERIAL_WORK, 0)


#: the environment _configure reads: a change in any of them sets the backend up again
SETUP_ENV = (ENV_ISA, ENV_THREADS, ENV_SERIAL_WORK, contention.ENV_ADAPTIVE)


def _setup() -> tuple[bool, str]:
    """Load the extension, choose the ISA path and the thread count; (ok, reason). Asked on every call
    into the backend (each quantize_rows call among them), so the answer is kept while the module, the
    variables of SETUP_ENV and the C side's ISA path (which a caller may set directly) stay as they were
    when it was made; tests that switch $PRISM_CSIMD_ISA between calls get the path they ask for."""
    try:
        mod = _load_module()
    except Exception as e:  # noqa: BLE001
        return False, (f"the C extension prism_csimd._csimd is not available ({type(e).__name__}: {e}); "
                       "it is built by `pip install` of prism-tensor when a C compiler is present")
    env = env_values(SETUP_ENV)
    kept = _loaded.get("setup")
    if (kept is not None and kept[0] is mod and kept[1] == env
            and (not kept[2][0] or mod.lib.csimd_get_isa() == kept[3])):
        return kept[2]
    result = _configure(mod)
    _loaded["setup"] = (mod, env, result, mod.lib.csimd_get_isa() if result[0] else None)
    return result


def _configure(mod) -> tuple[bool, str]:
    """Check the loaded extension and set its ISA path, threads and tables from the environment."""
    lib, ffi = mod.lib, mod.ffi
    missing = [f for f in REQUIRED_FUNCTIONS if not hasattr(lib, f)]
    if missing:
        return False, (f"the C extension at {getattr(mod, '__file__', '?')} is stale (lacks {', '.join(missing)}); "
                       "reinstall prism-tensor to rebuild it")
    if lib.csimd_abi_version() != ABI_VERSION:
        return False, (f"the C extension at {getattr(mod, '__file__', '?')} was built from other sources (interface "
                       f"version {lib.csimd_abi_version()}, this package needs {ABI_VERSION}); reinstall prism-tensor "
                       "to rebuild it")
    cpu = lib.csimd_cpu_isa()
    try:
        raw = env_choice(ENV_ISA, ISA_NAMES, ISA_NAMES[cpu])
    except ValueError as e:
        return False, str(e)
    want = ISA_NAMES.index(raw)
    if not lib.csimd_isa_runs(want):
        runs = [n for i, n in enumerate(ISA_NAMES) if lib.csimd_isa_runs(i)]
        return False, (f"{ENV_ISA}={raw} asks for a path this CPU does not run "
                       f"(best path here: {ISA_NAMES[cpu]}; it runs {', '.join(runs)})")
    if lib.csimd_set_isa(want) != 0:
        return False, f"the CPU cannot run the {ISA_NAMES[want]} path"
    try:
        n = requested_threads()
        sw = serial_work()
        watching = contention.adaptive()
    except ValueError as e:
        return False, str(e)
    if _loaded.get("adaptive") != watching:  # setting it starts every watch afresh: only on a change
        if lib.csimd_set_adaptive_threads(int(watching), contention.LOOK_S, contention.DELAY_SHARE,
                                          contention.OUTSIDE_CPUS, contention.HOLD_MIN_S,
                                          contention.HOLD_MAX_S) < 0:
            return False, "the C extension refused prism_core.contention's constants"
        _loaded["adaptive"] = watching
    tables = (np.ascontiguousarray(gelu_f16_table(), np.float32),
              np.ascontiguousarray(gelu_quick_f16_table(), np.float32))
    if lib.csimd_set_gelu_tables(*(ffi.cast("const float *", ffi.from_buffer(t)) for t in tables)) != 0:
        return False, "the C extension refused the GELU tables"
    _loaded["gelu_tables"] = tables  # the C side keeps pointers into them
    cores = max(1, int(lib.csimd_max_threads()))
    threads = 1 if not lib.csimd_has_openmp() else (cores if n is None else n)
    _k._state.update(ffi=ffi, lib=lib, threads=threads, serial_work=sw, isa=ISA_NAMES[want])
    return True, ""


def _inside(t: Tensor) -> bool:
    """The view fits its base's allocation (base.nbytes, what a Context allocates), checked
    without allocating; the kernels check again against the real buffer before each call."""
    try:
        _k.check_view(t, t.base.nbytes)
        return True
    except Exception:  # noqa: BLE001
        return False


class CsimdBackend(prism_core.Backend):
    name = "csimd"
    priority = 60  # the default where it builds: fastest in every benchmark section but tiny-node dispatch
    kernels = KERNELS
    activation_precision = "q8"  # block-weight products quantize the activations to the vec_dot type, as ggml
    block_types = prism_core.ops.table.QUANTIZED  # every block type the table holds (csrc/csimd_quant*.h)

    @property
    def version(self) -> str:  # type: ignore[override]
        ok, _ = self.availability()
        return f"{prism_core.__version__}+{_k._state['isa'] if ok else 'unavailable'}"

    def availability(self) -> tuple[bool, str]:
        return _setup()

    @property
    def threads(self) -> int:
        ok, _ = self.availability()
        return int(_k._state.get("threads", 1)) if ok else 1

    def prepare(self, node: Tensor):
        return _k.prepare(node)

    def quantize_rows(self, rows: np.ndarray, type: prism_core.GGMLType, mode: str, imatrix: np.ndarray | None = None,
                      threads: int | None = None) -> np.ndarray | None:
        """ggml's quantizers in C (csrc/csimd_quantize_rows.h), for prism_core.quant."""
        ok, _ = self.availability()
        return _quantize_rows(rows, type, mode, imatrix, threads) if ok else None

    def refusal(self, node: Tensor) -> str:
        """Why csimd does not compute ``node`` ("" when it does); supports() derives from it."""
        if "lib" not in _k._state:
            return "the C extension is not loaded"
        refused = TABLE.refusal(node)
        if refused:
            return refused
        refused = quantizer_refusal(node)
        if refused:
            return refused
        tensors = [node, *(s for s in node.src if s is not None)]
        key = node.opdef.key
        if key == "SOFT_MAX":
            sinks = node.src[2] if len(node.src) > 2 else None
            if sinks is not None and sinks.ne[0] < node.src[0].ne[2]:
                return "fewer sinks than heads"
            mask = node.src[1] if len(node.src) > 1 else None
            if mask is not None and mask.ne[0] != node.src[0].ne[0]:
                return "a mask row of another width than the input's"
        if key == "GET_ROWS" and node.src[1].ne[3] != 1:
            return "indices with a 4th dimension"
        if key == "ADD1" and node.src[1].nelements != 1:
            return "b is not a single value"
        if key in ("REPEAT", "CONCAT", "SET") and node.type != node.src[0].type:
            return "a type change"
        if key in ("PAD", "PAD_REFLECT_1D", "DIAG") and any(n <= 0 for n in node.src[0].ne):
            return "an empty source"
        if key == "ARANGE" and (node.ne[1:] != (1, 1, 1)):
            return "a result of more than one dimension"
        if key == "TIMESTEP_EMBEDDING" and (node.src[0].ne[1:] != (1, 1, 1) or node.ne[2:] != (1, 1)
                                            or float(node.params["max_period"]) <= 0):
            return "timesteps of more than one dimension or max_period <= 0"
        if key == "ARGMAX" and node.src[0].ne[2:] != (1, 1):
            return "a source of more than two dimensions"
        if key == "SET_ROWS" and (node.type != node.src[2].type or node.src[0].base is node.base
                                  or node.src[1].base is node.base):
            # rows are read while others are written: the values must not share the destination
            return "a result of another type than c, or rows/indices sharing the destination's memory"
        if key in ("ACC", "SET"):
            b = node.src[1]
            try:
                _k._check_region(node, node.view_offs + int(node.params["offset"]), b.ne,
                                 (node.traits.type_size, int(node.params["nb1"]), int(node.params["nb2"]),
                                  int(node.params["nb3"])), node.base.nbytes)
            except Exception:  # noqa: BLE001 - a region outside the result's buffer: the reference decides
                return "a region outside the result's buffer"
        if key == "GET_ROWS_BACK" and (node.ne[2:] != (1, 1) or node.src[0].ne[2:] != (1, 1)
                                       or node.src[1].nelements != node.src[0].ne[1]):
            return "batched rows or an index count other than the gradient's rows"
        if key in ("ROPE", "ROPE_BACK") and not rope_supported(node):
            return "parameters for which the reference raises (see kernels_rope.rope_supported)"
        for t in tensors:
            if t.nelements <= 0 and (t is node or key not in _k.EMPTY_SOURCE_ZEROS):
                return f"an empty tensor ({t.label})"
            if t.traits.is_quantized:
                why = dense_rows_refusal(t)
                if why:
                    return why
            elif not t.is_element_aligned():
                return f"{t.label}: offset or strides not multiples of its element size"
            if not _inside(t):
                return f"{t.label}: the view reaches outside its buffer"
        if key in ("MUL_MAT", "OUT_PROD") and node.nb[0] != node.traits.type_size:
            return "a result with non-contiguous rows"
        # The kernels read and write row by row (GROUP_NORM: each group read whole before its
        # elements are written in place): a source may share the result's memory only
        # as the exact same view (in-place ops); any other overlap goes to the reference.
        # REPEAT_BACK, GET_ROWS_BACK and OUT_PROD write their result before reading all of a source:
        # no overlap at all for them.
        strict = key in ("REPEAT_BACK", "GET_ROWS_BACK", "OUT_PROD", "MUL_MAT", "PAD", "PAD_REFLECT_1D", "DIAG",
                         "ARGMAX", "CONCAT", "TIMESTEP_EMBEDDING",
                         "MUL_MAT_ID", "IM2COL", "POOL_1D", "POOL_2D", "POOL_2D_BACK",
                         "FLASH_ATTN_EXT", "CONV_2D", "CONV_TRANSPOSE_1D")
        strict = strict or key in ("UPSCALE", "IM2COL_BACK")  # gather from other positions than they write
        for s in tensors[1:]:
            if s.base is node.base and (strict or not s.same_view(node)):
                return (f"{s.label} shares the result's memory" + (" (this kernel cannot run in place)" if strict
                                                                   else " other than as the same view"))
        return ""


@prism_core.hookimpl
def prism_register_backends() -> list[prism_core.Backend]:
    return [CsimdBackend()]
