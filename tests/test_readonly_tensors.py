"""Read-only tensors over external memory (Context.map_tensor): no copy, a budget of their own,
and every write into them refused, in builders, in set() and in compute()/plan()."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from helpers import refused

import prism_core as pc
from prism_core.context import TENSOR_OVERHEAD
from prism_core.errors import ReadOnlyTensor
from prism_core.types import F16, F32


def _available(name: str) -> bool:
    return any(i.name == name and i.available for i in pc.backends())


@pytest.fixture
def mapped_file(tmp_path):
    """A read-only-mapped copy-on-write file holding a (3, 64) F32 and a (3, 64) F16 matrix."""
    rng = np.random.default_rng(7)
    w32 = rng.standard_normal((3, 64)).astype(np.float32)
    w16 = rng.standard_normal((3, 64)).astype(np.float16)
    path = tmp_path / "w.bin"
    path.write_bytes(w32.tobytes() + w16.tobytes())
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    buf = np.frombuffer(mm, dtype=np.uint8)
    return buf[:w32.nbytes], buf[w32.nbytes:], w32, w16


def test_mapped_tensor_shares_the_buffer_and_costs_only_its_overhead(mapped_file):
    b32, _, w32, _ = mapped_file
    ctx = pc.Context(mem_size=4 * TENSOR_OVERHEAD)  # far less than the bytes mapped below
    w = ctx.map_tensor(F32, (64, 3), b32, "w")
    assert np.shares_memory(w.storage(), b32)
    assert ctx.used == TENSOR_OVERHEAD and ctx.mapped_bytes == 3 * 64 * 4
    assert w.read_only and not ctx.new_tensor(F32, (1,)).read_only
    np.testing.assert_array_equal(w.numpy(), w32)


def test_a_large_mapping_needs_no_raised_budget():
    big = np.zeros(256 << 20, np.uint8)  # 256 MiB, a model's worth; zero pages cost nothing until touched
    ctx = pc.Context(mem_size=1 << 16)
    ctx.map_tensor("q4_0", (32 * 1024, (256 << 20) // (18 * 1024)), big[: 18 * 1024 * ((256 << 20) // (18 * 1024))])
    assert ctx.used == TENSOR_OVERHEAD and ctx.mapped_bytes > 250 << 20


@pytest.mark.parametrize("bad, match", [
    (np.zeros(100, np.uint8), "needs 768 bytes, the buffer has 100"),
    (np.zeros(192, np.float32), "1-dim uint8 ndarray, got float32"),
    (np.zeros((2, 384), np.uint8), "1-dim uint8"),
    (np.zeros(1536, np.uint8)[::2], "contiguous"),
])
def test_map_tensor_checks_its_buffer(bad, match):
    ctx = pc.Context()
    with pytest.raises(pc.InvalidArgument, match=match):
        ctx.map_tensor(F32, (64, 3), bad)
    assert ctx.tensors == [] and ctx.used == 0


def test_set_is_refused_naming_the_tensor(mapped_file):
    b32, _, w32, _ = mapped_file
    ctx = pc.Context()
    w = ctx.map_tensor(F32, (64, 3), b32, "blk.0.w")
    with refused(ReadOnlyTensor, r"set: 'blk.0.w' \(leaf\) is read-only", ctx):
        w.set(np.zeros((3, 64), np.float32))
    with refused(ReadOnlyTensor, r"set_raw: 'blk.0.w' \(leaf\) is read-only", ctx):
        w.set_raw(bytes(w.nbytes))
    np.testing.assert_array_equal(w.numpy(), w32)


def _writers(w: pc.Tensor, x: pc.Tensor, idx: pc.Tensor):
    """Builders whose result lives in w's memory (or a view of it)."""
    row = pc.view_1d(w, 64, 64 * 4)
    xrow, xrows = pc.view_1d(x, 64), pc.view_2d(x, 64, 1, x.nb[1])
    return {
        "add_inplace": lambda: pc.add_inplace(w, x),
        "scale_inplace": lambda: pc.scale_inplace(w, 2.0),
        "unary inplace": lambda: pc.unary(w, "RELU", inplace=True),
        "acc inplace": lambda: pc.acc(w, x, w.nb[1], w.nb[2], w.nb[3], 0, inplace=True),
        "set inplace": lambda: pc.set(w, x, w.nb[1], w.nb[2], w.nb[3], 0, inplace=True),
        "cpy into w": lambda: pc.cpy(x, w),
        "cpy into a view of w": lambda: pc.cpy(xrow, row),
        "set_rows into w": lambda: pc.set_rows(w, xrows, idx),
        "in place op on a view": lambda: pc.scale_inplace(row, 0.5),
        "set_param": lambda: w.set_param(),
    }


@pytest.mark.parametrize("case", [
    "add_inplace", "scale_inplace", "unary inplace", "acc inplace", "set inplace", "cpy into w",
    "cpy into a view of w", "set_rows into w", "in place op on a view", "set_param"])
def test_builders_that_would_write_into_it_are_refused(mapped_file, case):
    b32, _, w32, _ = mapped_file
    ctx = pc.Context()
    w = ctx.map_tensor(F32, (64, 3), b32, "w")
    x = ctx.from_numpy(np.ones((3, 64), np.float32), name="x")
    idx = ctx.from_numpy(np.array([1], np.int64), name="idx")
    build = _writers(w, x, idx)[case]  # the views it needs exist before the refused call
    with refused(ReadOnlyTensor, r"'w'.*read-only", ctx):
        build()
    np.testing.assert_array_equal(w.numpy(), w32)


def test_reading_ops_and_views_of_it_are_fine(mapped_file):
    b32, _, w32, _ = mapped_file
    ctx = pc.Context()
    w = ctx.map_tensor(F32, (64, 3), b32, "w")
    x = ctx.from_numpy(np.ones((3, 64), np.float32))
    y = pc.add(pc.transpose(pc.transpose(w)), x)
    z = pc.cont(pc.view_1d(w, 64, 64 * 4))
    pc.compute(y, "numpy", strict=True)
    pc.compute(z, "numpy", strict=True)
    np.testing.assert_array_equal(y.numpy(), w32 + 1)
    np.testing.assert_array_equal(z.numpy(), w32[1])


def test_compute_and_plan_refuse_a_graph_writing_into_it(mapped_file):
    b32, _, w32, _ = mapped_file
    ctx = pc.Context()
    target = ctx.new_tensor(F32, (64, 3), "target")
    x = ctx.from_numpy(np.ones((3, 64), np.float32))
    y = pc.cpy(x, target)
    # Builders already refuse such a node; a graph built over a tensor that became read-only
    # afterwards (simulated through the private flag) must still be refused before running.
    target._storage = b32
    target._read_only = True
    for run in (lambda: pc.compute(y, "numpy"), lambda: pc.plan(y, "numpy")):
        with pytest.raises(ReadOnlyTensor, match=r"computing CPY: .*'target'.* is read-only"):
            run()
    np.testing.assert_array_equal(target.numpy(), w32)


def test_a_failed_transaction_drops_mapped_tensors(mapped_file):
    b32, *_ = mapped_file
    ctx = pc.Context()
    with pytest.raises(RuntimeError):
        with ctx.transaction():
            ctx.map_tensor(F32, (64, 3), b32, "w")
            raise RuntimeError("boom")
    assert ctx.tensors == [] and ctx.used == 0 and ctx.mapped_bytes == 0


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
@pytest.mark.parametrize("wtype", [F32, F16])
def test_mapped_weights_are_sources_on_every_backend(mapped_file, backend, wtype):
    if not _available(backend):
        pytest.skip(f"backend {backend} is not available here")
    b32, b16, w32, w16 = mapped_file
    ctx = pc.Context()
    w = ctx.map_tensor(wtype, (64, 3), b32 if wtype == F32 else b16, "w")
    xs = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    x = ctx.from_numpy(xs)
    y = pc.mul_mat(w, x)
    report = pc.compute(y, backend, strict=True)
    assert report.fallbacks == []
    xs_seen = xs if wtype == F32 else xs.astype(np.float16)  # an F16 weight's product rounds x to F16 (ggml)
    expected = xs_seen.astype(np.float64) @ (w32 if wtype == F32 else w16).astype(np.float64).T
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-4)
    p = pc.plan(pc.mul_mat(w, x).set_output(), backend, strict=True).compute()
    np.testing.assert_allclose(p.graph.nodes[-1].numpy(), expected, rtol=1e-4, atol=1e-4)
