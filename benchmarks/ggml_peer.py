"""ggml's CPU backend as a benchmark peer: a quantized product through ggml-python, in this process or in
another interpreter's.

``GgmlMulMat`` runs d = mul_mat(w, x) on the ggml this process imports. ``RemoteGgml`` runs the same in a
child process of another Python (say a venv whose ggml-python was built for AVX2 only, see docs/isa.md), this
file being its whole program (it needs only numpy and ggml there): lines of JSON on its stdin and stdout. The
benchmark then interleaves both ggml builds and Prism's paths in one run.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import ggml  # ggml-python: builds ggml's CPU backend from source
except ImportError:
    ggml = None


def rate(fn, ops: float, clock: str = "wall") -> float:
    """GOPS of fn(): one warm-up call, then the mean of enough calls to fill 0.1 s; clock "cpu" times the
    calling thread's CPU time instead of the wall clock (one-thread products on a shared machine: the time
    the thread waited for a core is left out)."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    fn()
    n, t0 = 0, now()
    while True:
        fn()
        n += 1
        dt = now() - t0
        if dt > 0.1:
            return ops * n / dt / 1e9


class GgmlMulMat:
    """d = mul_mat(w, x) on ggml's CPU backend, w of a block type (the same bytes as Prism's)."""

    def __init__(self, t: int, blocks: np.ndarray, x: np.ndarray, threads: int) -> None:
        m, n, k = blocks.shape[0], x.shape[0], x.shape[1]
        self.threads = threads
        params = ggml.ggml_init_params(mem_size=blocks.nbytes + x.nbytes + 4 * m * n + (64 << 20), mem_buffer=None,
                                       no_alloc=False)
        self.ctx = ggml.ggml_init(params)
        self.w = ggml.ggml_new_tensor_2d(self.ctx, int(t), k, m)
        self.x = ggml.ggml_new_tensor_2d(self.ctx, ggml.GGML_TYPE_F32, k, n)
        ctypes.memmove(ggml.ggml_get_data(self.w), blocks.ctypes.data, blocks.nbytes)
        ctypes.memmove(ggml.ggml_get_data(self.x), np.ascontiguousarray(x).ctypes.data, x.nbytes)
        self.y = ggml.ggml_mul_mat(self.ctx, self.w, self.x)
        self.graph = ggml.ggml_new_graph(self.ctx)
        ggml.ggml_build_forward_expand(self.graph, self.y)
        self.shape = (n, m)

    def __call__(self) -> None:
        ggml.ggml_graph_compute_with_ctx(self.ctx, self.graph, self.threads)

    def result(self) -> np.ndarray:
        p = ctypes.cast(ggml.ggml_get_data(self.y), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(p, shape=self.shape).copy()

    def close(self) -> None:
        ggml.ggml_free(self.ctx)


class RemoteGgml:
    """GgmlMulMat in a child process of the interpreter `python` (its own ggml-python build)."""

    def __init__(self, python: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([python, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.tmp = tempfile.TemporaryDirectory(prefix="ggml-peer-")
        self._ask({"op": "hello"})

    def _ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ggml peer process exited (code {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"ggml peer: {reply['error']}")
        return reply

    def load(self, t: int, blocks: np.ndarray, x: np.ndarray, threads: int) -> None:
        bp, xp = os.path.join(self.tmp.name, "w.npy"), os.path.join(self.tmp.name, "x.npy")
        np.save(bp, blocks)
        np.save(xp, np.ascontiguousarray(x))
        self._ask({"op": "load", "type": int(t), "blocks": bp, "x": xp, "threads": threads})

    def rate(self, ops: float, clock: str = "wall") -> float:
        return float(self._ask({"op": "rate", "ops": ops, "clock": clock})["gops"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self.tmp.cleanup()


def _serve() -> None:
    """The child's loop: one JSON request a line on stdin, one reply a line on stdout."""
    mm = None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            if msg["op"] == "load":
                if mm is not None:
                    mm.close()
                mm = GgmlMulMat(msg["type"], np.load(msg["blocks"]), np.load(msg["x"]), msg["threads"])
                reply = {"ok": True}
            elif msg["op"] == "rate":
                reply = {"gops": rate(mm, msg["ops"], msg.get("clock", "wall"))}
            else:
                reply = {"ok": ggml is not None} if ggml is not None else {"error": "ggml-python not installed"}
        except Exception as e:  # reported to the parent, which raises it
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    _serve()
