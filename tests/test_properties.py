"""Property tests (hypothesis, derandomised so CI runs are reproducible).

Random shapes, strides and params against independent NumPy formulations: ggml's modulo
broadcast, the permute convention, views over random windows, RMS norm, and the graph's
topological order with its rollback on capacity overflow.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import prism_core as pc

settings.register_profile("prism", derandomize=True, max_examples=60, deadline=None)
settings.load_profile("prism")

extent = st.integers(1, 5)
ne4 = st.tuples(extent, extent, extent, extent)


@st.composite
def broadcast_pair(draw):
    small = draw(ne4)
    reps = draw(st.tuples(*[st.integers(1, 3)] * 4))
    return tuple(s * r for s, r in zip(small, reps)), small


@given(broadcast_pair(), st.sampled_from(["ADD", "SUB", "MUL"]), st.integers(0, 2**31 - 1))
def test_binary_ops_broadcast_by_modulo(shapes, key, seed):
    big, small = shapes
    rng = np.random.default_rng(seed)
    a_np = rng.normal(size=big[::-1]).astype(np.float32)   # NumPy order
    b_np = rng.normal(size=small[::-1]).astype(np.float32)
    ctx = pc.Context()
    y = pc.node(key, ctx.from_numpy(a_np), ctx.from_numpy(b_np))
    pc.compute(y, "numpy")
    expect = np.empty_like(a_np)
    for idx in np.ndindex(*a_np.shape):                      # b[i % b.ne] for every element
        bv = b_np[tuple(i % n for i, n in zip(idx, b_np.shape))]
        expect[idx] = {"ADD": a_np[idx] + bv, "SUB": a_np[idx] - bv, "MUL": a_np[idx] * bv}[key]
    np.testing.assert_array_equal(y.numpy().reshape(a_np.shape), expect)


@given(ne4, st.permutations([0, 1, 2, 3]))
def test_permute_moves_source_dim_k_to_axes_k(ne, axes):
    ctx = pc.Context()
    vals = np.arange(np.prod(ne), dtype=np.float32).reshape(ne[::-1])
    a = ctx.from_numpy(vals)
    p = pc.permute(a, *axes)
    c = pc.cont(p)
    pc.compute(c, "numpy")
    for k in range(4):
        assert p.ne[axes[k]] == ne[k]
    got = c.numpy().reshape(p.ne[::-1])
    for idx in np.ndindex(*ne):                               # idx in ggml order (i0, i1, i2, i3)
        dst = [0] * 4
        for k in range(4):
            dst[axes[k]] = idx[k]
        assert got[tuple(dst[::-1])] == vals[tuple(idx[::-1])]


@given(ne4, st.data())
def test_views_read_the_window_they_describe(ne, data):
    ctx = pc.Context()
    vals = np.arange(np.prod(ne), dtype=np.float32).reshape(ne[::-1])
    a = ctx.from_numpy(vals)
    start = [data.draw(st.integers(0, n - 1)) for n in ne]
    size = [data.draw(st.integers(1, n - s)) for n, s in zip(ne, start)]
    offset = sum(s * nb for s, nb in zip(start, a.nb))
    v = pc.view_4d(a, *size, a.nb[1], a.nb[2], a.nb[3], offset)
    window = vals[tuple(slice(s, s + z) for s, z in zip(start[::-1], size[::-1]))]
    np.testing.assert_array_equal(v.numpy().reshape(window.shape), window)


@given(st.integers(1, 40), st.integers(1, 6), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_rms_norm_matches_its_formula(n, rows, eps, seed):
    x = np.random.default_rng(seed).normal(size=(rows, n))
    ctx = pc.Context()
    y = pc.rms_norm(ctx.from_numpy(x.astype(np.float32)), eps)
    pc.compute(y, "numpy")
    xf = x.astype(np.float32).astype(np.float64)
    expect = xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps)
    np.testing.assert_allclose(y.numpy().reshape(rows, n), expect, rtol=2e-6, atol=1e-7)


@given(st.lists(st.tuples(st.sampled_from(["add", "mul", "sqr", "neg"]), st.integers(0, 10)), min_size=1,
                max_size=25), st.integers(1, 30))
def test_graph_order_is_topological_and_overflow_rolls_back(program, capacity):
    ctx = pc.Context()
    pool = [ctx.new_tensor(pc.F32, (3,)) for _ in range(2)]
    for op, pick in program:  # a random DAG whose nodes reuse earlier tensors
        a, b = pool[pick % len(pool)], pool[(pick * 7 + 1) % len(pool)]
        pool.append(pc.add(a, b) if op == "add" else pc.mul(a, b) if op == "mul" else
                    pc.sqr(a) if op == "sqr" else pc.neg(a))
    g = pc.Graph(capacity)
    try:
        g.expand(pool[-1])
    except pc.BoundExceeded:
        assert g.nodes == [] and g.leafs == []  # nothing half-added
        return
    position = {id(t): i for i, t in enumerate(g.nodes)}
    assert len(position) == len(g.nodes)  # no duplicates
    for i, n in enumerate(g.nodes):
        for s in n.src:
            assert s in g.leafs or position[id(s)] < i
