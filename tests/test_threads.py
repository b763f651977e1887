"""Plans and computes from several threads: one plan computed by 4 threads at once, and two plans
over one graph used from two threads, give every compute the single-threaded values.

A plan points its graph's intermediates at its own arena, and the reference's kernels read a
tensor's storage when they run; computes over one context's tensors therefore take turns on
the context's lock (``Context.compute_lock``). Without it, a thread's remaining kernels read
buffers another thread had just rebound or overwritten.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import prism_core as pc

BACKENDS = [b.name for b in pc.backends() if b.available]
THREADS, COMPUTES = 4, 40


def mlp(ctx: pc.Context, rng: np.random.Generator):
    """A small graph with several intermediates that share arena memory once planned."""
    x = ctx.from_numpy(rng.normal(size=(64, 128)).astype(np.float32)).set_input()
    w1 = ctx.from_numpy(rng.normal(0, 0.3, (192, 128)).astype(np.float32))
    w2 = ctx.from_numpy(rng.normal(0, 0.3, (40, 192)).astype(np.float32))
    h = pc.silu(pc.scale(pc.mul_mat(w1, x), 1.5))
    y = pc.soft_max(pc.add(pc.mul_mat(w2, pc.sqr(h)), pc.tanh(pc.sum_rows(h)))).set_output()
    return pc.Graph().expand(y), y


def hammer(work, n_threads: int = THREADS) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def body(k: int) -> None:
        try:
            start.wait()
            work(k)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_plan_computed_from_four_threads(backend):
    ctx = pc.Context()
    graph, y = mlp(ctx, np.random.default_rng(1))
    p = pc.plan(graph, backend)
    expected = p.compute() and y.numpy()
    wrong = []

    def work(k: int) -> None:
        for _ in range(COMPUTES):
            p.compute()
            with ctx.compute_lock:  # read while no compute is half-way (every compute writes the same values)
                got = y.numpy()
            if not np.array_equal(got, expected):
                wrong.append(k)

    assert not hammer(work)
    assert not wrong, f"{len(wrong)} of {THREADS * COMPUTES} computes were wrong"


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_computes_are_serialised_without_the_callers_lock(backend):
    """Callers that only compute (no read in between) need no lock of their own: each compute
    runs whole, so the output after all threads finish is the single-threaded value."""
    ctx = pc.Context()
    graph, y = mlp(ctx, np.random.default_rng(2))
    p = pc.plan(graph, backend)
    expected = p.compute() and y.numpy()
    inside, most = [0], [0]
    original = list(p.calls)

    def counting(call):
        def run():
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            try:
                call()
            finally:
                inside[0] -= 1
        return run

    p.calls[:] = [counting(c) for c in original]
    assert not hammer(lambda k: [p.compute() for _ in range(COMPUTES)])
    assert most[0] == 1, "two threads ran kernels of one plan at the same time"
    np.testing.assert_array_equal(y.numpy(), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_plans_of_one_graph_from_two_threads(backend):
    ctx = pc.Context()
    graph, y = mlp(ctx, np.random.default_rng(3))
    plans = [pc.plan(graph, backend), pc.plan(graph, backend)]
    expected = plans[0].compute() and y.numpy()
    wrong = []

    def work(k: int) -> None:
        for _ in range(COMPUTES):
            plans[k % 2].compute()
            with ctx.compute_lock:
                got = y.numpy()
            if not np.array_equal(got, expected):
                wrong.append(k)

    assert not hammer(work, 2)
    assert not wrong, f"{len(wrong)} of {2 * COMPUTES} computes were wrong"


def test_eager_computes_of_one_graph_from_four_threads():
    ctx = pc.Context()
    graph, y = mlp(ctx, np.random.default_rng(4))
    pc.compute(graph, "numpy")
    expected = y.numpy()
    p = pc.plan(graph, "numpy")  # a plan beside the eager computes moves the intermediates
    wrong = []

    def work(k: int) -> None:
        for i in range(COMPUTES // 2):
            if (i + k) % 2:
                p.compute()
            else:
                pc.compute(graph, "numpy")
            with ctx.compute_lock:
                got = y.numpy()
            if not np.array_equal(got, expected):
                wrong.append(k)

    assert not hammer(work)
    assert not wrong
