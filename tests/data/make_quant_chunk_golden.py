"""ggml_quantize_chunk's blocks (llama-quantize's quantizers, with and without an importance matrix), recorded
from llama.cpp 0.3.36's own ggml, for tests/test_quant_chunk.py.

    python tests/data/make_quant_chunk_golden.py            # writes tests/data/quant_chunk_golden.npz

Needs llama-cpp-python 0.3.36 (a test-data peer only): its wheel carries ``libggml-base.so``, whose
``ggml_quantize_chunk`` is called through ctypes, one row per call, into a zero-filled buffer. The rows are
quant_golden.npz's ``x`` (126 rows of 256 with every edge case of the reference quantizers) and ``x_huge``
(62 rows of huge values), plus ``x_long``: 12 rows of 1024 drawn here (seeded) with repeated values (F16-
and coarsely rounded, so IQ1's sorts meet ties), all-zero and tiny sub-blocks. The importance matrices
(``w``, ``w_huge``, ``w_long``: one per row, as ggml_quantize_chunk takes one per call) are seeded too:
log-normal, with zeros, constant, spanning 1e-6..1e6. Keys: ``c_<type>`` (no importance matrix, for every
type that quantizes without one), ``cw_<type>`` (with ``w``), ``cwh_<type>`` (``x_huge`` with ``w_huge``),
``cl_<type>`` / ``cwl_<type>`` (``x_long`` without / with ``w_long``), ``types`` and ``llama_cpp_version``.
ggml aborts on some rows of huge values (a NaN scale fails its ``GGML_ASSERT(scale >= 0)`` in the IQ
searches): each run of rows goes to a forked child, and ``<key>_<type>_aborted`` marks the rows ggml
aborted on (their blocks are zeros, not reference data).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "quant_chunk_golden.npz"

# ggml type ids of every block type ggml_quantize_chunk writes (Q1_0/Q2_0/NVFP4 aside: Prism leaves them out)
TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13,
         "q6_K": 14, "iq2_xxs": 16, "iq2_xs": 17, "iq3_xxs": 18, "iq1_s": 19, "iq4_nl": 20, "iq3_s": 21,
         "iq2_s": 22, "iq4_xs": 23, "iq1_m": 29, "tq1_0": 34, "tq2_0": 35, "mxfp4": 39}
NEEDS_IMATRIX = {"iq2_xxs", "iq2_xs", "iq1_s"}
BLOCK = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34), "q2_K": (256, 84),
         "q3_K": (256, 110), "q4_K": (256, 144), "q5_K": (256, 176), "q6_K": (256, 210), "iq2_xxs": (256, 66),
         "iq2_xs": (256, 74), "iq3_xxs": (256, 98), "iq1_s": (256, 50), "iq4_nl": (32, 18), "iq3_s": (256, 110),
         "iq2_s": (256, 82), "iq4_xs": (256, 136), "iq1_m": (256, 56), "tq1_0": (256, 54), "tq2_0": (256, 66),
         "mxfp4": (32, 17)}


def long_rows(rng: np.random.Generator) -> np.ndarray:
    rows = []
    for i in range(12):
        r = rng.standard_normal(1024) * 10.0 ** rng.uniform(-3, 2)
        if i % 3 == 0:
            r = r.astype(np.float16).astype(np.float64)  # F16 weights: many equal values per block
        if i % 3 == 1:
            r = np.round(r / np.abs(r).max() * 8) / 8 * np.abs(r).max()  # few distinct values
        if i % 4 == 2:
            r[256:288] = 0.0  # an all-zero group (IQ3_S's shifted pointers, IQ4_NL's zero block)
            r[544:560] = 1e-9  # tiny, below the IQ epsilons
        if i == 5:
            r[:256] = 0.0  # a whole zero super-block
        rows.append(r)
    return np.asarray(rows, np.float32)


def importance(rng: np.random.Generator, n: int, cols: int) -> np.ndarray:
    w = np.exp(rng.standard_normal((n, cols)) * 1.5).astype(np.float32)
    for i in range(n):
        kind = i % 5
        if kind == 1:
            w[i, rng.integers(0, cols, cols // 8)] = 0.0  # unused columns
        elif kind == 2:
            w[i] = 1.0
        elif kind == 3:
            w[i] = (10.0 ** rng.uniform(-6, 6, cols)).astype(np.float32)
    return w


def _ggml():
    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def _rows_in_child(lib, name: str, x: np.ndarray, w: np.ndarray | None, start: int, out: np.ndarray) -> None:
    """Quantize rows start.. into out (shared memory; column 0 marks a row done) in a forked child: ggml
    aborts on some inputs (a NaN scale fails GGML_ASSERT(scale >= 0)), which ends only the child."""
    for i in range(start, len(x)):
        row = np.ascontiguousarray(x[i], np.float32)
        qw = None if w is None else np.ascontiguousarray(w[i], np.float32)
        buf = np.zeros(out.shape[1] - 1, np.uint8)
        n = lib.ggml_quantize_chunk(TYPES[name], row.ctypes.data, buf.ctypes.data, 0, 1, row.size,
                                    None if qw is None else qw.ctypes.data)
        assert n == buf.size, (name, n)
        out[i, 1:] = buf
        out[i, 0] = 1


def _shared(rows: int, width: int) -> np.ndarray:
    import mmap
    return np.frombuffer(mmap.mmap(-1, rows * (width + 1)), np.uint8).reshape(rows, width + 1)


def chunk_runs(name: str, runs) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each (rows, imatrix) of runs: (blocks of every row, whether ggml aborted on it). One process per
    type loads ggml and builds its grids once (ggml_quantize_init), then forks a child per run of rows, and
    a new one after each abort, so no restart pays for the grids again."""
    import os
    be, bb = BLOCK[name]
    outs = [_shared(len(x), x.shape[1] // be * bb) for x, _ in runs]
    aborted = [_shared(len(x), 0) for x, _ in runs]  # column 0: 1 = ggml aborted on the row
    os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml's abort would attach gdb for a backtrace (seconds each)
    zygote = os.fork()
    if zygote == 0:
        try:
            lib = _ggml()
            lib.ggml_quantize_init(TYPES[name])
            for (x, w), out, ab in zip(runs, outs, aborted):
                start = 0
                while start < len(x):
                    pid = os.fork()
                    if pid == 0:
                        os.close(2)  # ggml's abort message and backtrace
                        try:
                            _rows_in_child(lib, name, x, w, start, out)
                        finally:
                            os._exit(0)
                    os.waitpid(pid, 0)
                    todo = np.flatnonzero(out[start:, 0] == 0)
                    if not len(todo):
                        break
                    ab[start + int(todo[0]), 0] = 1
                    start += int(todo[0]) + 1
        finally:
            os._exit(0)
    os.waitpid(zygote, 0)
    return [(out[:, 1:].copy(), ab[:, 0] == 1) for out, ab in zip(outs, aborted)]


def main() -> int:
    import llama_cpp
    golden = np.load(HERE / "quant_golden.npz")
    rng = np.random.default_rng(3030)
    x, x_huge, x_long = golden["x"], golden["x_huge"], long_rows(rng)
    w, w_huge, w_long = importance(rng, len(x), 256), importance(rng, len(x_huge), 256), importance(rng, 12, 1024)
    data: dict[str, np.ndarray] = {"x_long": x_long, "w": w, "w_huge": w_huge, "w_long": w_long,
                                   "types": np.array(sorted(TYPES)),
                                   "llama_cpp_version": np.array(llama_cpp.__version__)}
    runs = [("c", x, None), ("cl", x_long, None), ("cw", x, w), ("cwh", x_huge, w_huge), ("cwl", x_long, w_long)]
    for name in TYPES:
        todo = [(key, rows, imatrix) for key, rows, imatrix in runs if imatrix is not None or name not in NEEDS_IMATRIX]
        for (key, _, _), (blocks, aborted) in zip(todo, chunk_runs(name, [(r, m) for _, r, m in todo])):
            data[f"{key}_{name}"] = blocks
            if aborted.any():  # ggml asserted on these rows: no reference bytes
                data[f"{key}_{name}_aborted"] = aborted
        print(name, {k: int(v.sum()) for k, v in data.items() if k.endswith(f"_{name}_aborted")}, file=sys.stderr,
              flush=True)
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
