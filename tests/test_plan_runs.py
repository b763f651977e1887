"""Backend.prepare_run: a plan hands a backend each maximal run of consecutive nodes it claims and
calls the one callable it returns; refused nodes still fall back one by one between runs."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc

NUMPY = pc.backend("numpy").kernels


class RunBackend(pc.Backend):
    """Claims ADD, MUL, SQR and SET_ROWS (the reference's kernels: the point here is the dispatch) and
    computes each run in one call, recording what it was given."""

    name = "runs_test"
    kernels = {k: NUMPY[k] for k in ("ADD", "MUL", "SQR", "SET_ROWS")}

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.runs: list[pc.NodeRun] = []
        self.calls = 0

    def prepare_run(self, run: pc.NodeRun):
        self.runs.append(run)
        if not self.accept:
            return None
        kernels = [self.kernels[n.opdef.key] for n in run.nodes]

        def call() -> None:
            self.calls += 1
            for k, n in zip(kernels, run.nodes):
                k(n)
        return call


def chain(ctx: pc.Context):
    """x + x (ggml) -> sum_rows (refused: the reference) -> r * r (ggml) -> its square (ggml)."""
    x = ctx.from_numpy(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)).set_input()
    s = pc.add(x, x)
    r = pc.sum_rows(s)
    m = pc.mul(r, r)
    out = pc.sqr(m).set_output()
    return x, s, r, m, out


def test_maximal_runs_around_a_fallback_each_in_one_call():
    be = RunBackend()
    x, s, r, m, out = chain(pc.Context())
    p = pc.plan(pc.Graph().expand(out), be)
    assert [[n.opdef.key for n in run.nodes] for run in be.runs] == [["ADD"], ["MUL", "SQR"]]
    assert [f.node.opdef.key for f in p.fallbacks] == ["SUM_ROWS"]
    assert len(p.calls) == 3 and len(p.runs) == 2  # run, fallback, run: not one call per node
    assert "3 of them in 2 runs of one call each" in p.summary()
    p.compute()
    assert be.calls == 2
    # rows sum to 2*(1+2+3) = 12 and 2*(4+5+6) = 30; then squared twice
    np.testing.assert_array_equal(out.numpy().ravel(), [12.0 ** 4, 30.0 ** 4])
    p.compute()  # again, from the same prepared calls
    assert be.calls == 4
    np.testing.assert_array_equal(out.numpy().ravel(), [12.0 ** 4, 30.0 ** 4])


def test_internal_results_are_only_those_prism_never_reads():
    be = RunBackend()
    x, s, r, m, out = chain(pc.Context())
    pc.plan(pc.Graph().expand(out), be)
    first, second = be.runs
    assert not first.is_internal(s)   # the fallback reads it
    assert second.is_internal(m)      # only SQR, in the same run, reads it
    assert not second.is_internal(out)  # a graph output
    assert second.internal == frozenset({id(m)})


def test_a_result_read_through_a_view_outside_the_run_is_not_internal():
    be = RunBackend()
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    a = pc.add(x, x)                       # run 1
    v = pc.reshape(a, (3, 2))              # a view: computes nothing
    r = pc.sum_rows(v)                     # the reference reads a through the view
    out = pc.mul(pc.sqr(a), pc.sqr(a))     # run 2 reads a too
    g = pc.Graph().expand(r).expand(out)
    pc.plan(g, be)
    assert not any(run.is_internal(a) for run in be.runs)
    assert not any(run.is_internal(v) for run in be.runs)


def test_writes_into_a_persistent_tensor_are_never_internal():
    """SET_ROWS into a cache writes a view of it: Prism reads the cache, whoever reads the view."""
    be = RunBackend()
    ctx = pc.Context()
    cache = ctx.from_numpy(np.zeros((4, 3), np.float32))
    rows = ctx.from_numpy(np.array([[1.0, 2.0, 3.0]], np.float32))
    idx = ctx.from_numpy(np.array([2], np.int64))
    written = pc.set_rows(cache, pc.add(rows, rows), idx)
    after = pc.sqr(written)                # same run, reads the view
    p = pc.plan(pc.Graph().expand(after), be)
    (run,) = be.runs
    assert [n.opdef.key for n in run.nodes] == ["ADD", "SET_ROWS", "SQR"]
    assert not run.is_internal(written) and not run.is_internal(cache)
    p.compute()
    np.testing.assert_array_equal(cache.numpy()[2], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(cache.numpy()[[0, 1, 3]], 0.0)
    np.testing.assert_array_equal(after.numpy()[2], [4.0, 16.0, 36.0])


def test_declined_runs_are_prepared_node_by_node():
    be = RunBackend(accept=False)
    x, s, r, m, out = chain(pc.Context())
    p = pc.plan(pc.Graph().expand(out), be)
    assert len(be.runs) == 2 and p.runs == [] and len(p.calls) == len(p.steps) == 4
    p.compute()
    assert be.calls == 0
    np.testing.assert_array_equal(out.numpy().ravel(), [12.0 ** 4, 30.0 ** 4])


def test_raising_unsupported_in_prepare_run_is_declining():
    class Refusing(RunBackend):
        name = "runs_test_refusing"

        def prepare_run(self, run):
            raise pc.Unsupported("not this run")

    x, s, r, m, out = chain(pc.Context())
    p = pc.plan(pc.Graph().expand(out), Refusing())
    assert p.runs == [] and len(p.calls) == 4
    p.compute()
    np.testing.assert_array_equal(out.numpy().ravel(), [12.0 ** 4, 30.0 ** 4])


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_backends_without_the_capability_keep_one_call_per_node(backend):
    be = pc.backend(backend)
    if not be.availability()[0]:
        pytest.skip(f"{backend} is unavailable here: {be.availability()[1]}")
    x, s, r, m, out = chain(pc.Context())
    p = pc.plan(pc.Graph().expand(out), be)
    assert p.runs == [] and len(p.calls) == len(p.steps) == 4


def test_a_moved_workspace_prepares_the_runs_again():
    be = RunBackend()
    ws = pc.Workspace()
    x, s, r, m, out = chain(pc.Context())
    p = pc.plan(pc.Graph().expand(out), be, workspace=ws)
    ctx2 = pc.Context()
    big = pc.sqr(pc.exp(ctx2.from_numpy(np.ones(50_000, np.float32))))  # exp's result: in the arena
    before = ws.nbytes
    pc.plan(pc.Graph().expand(big), "numpy", workspace=ws)
    assert ws.nbytes > before  # the buffer grew: p's arena moved
    assert len(be.runs) == 4  # its two runs were prepared again over the new buffer
    p.compute()
    np.testing.assert_array_equal(out.numpy().ravel(), [12.0 ** 4, 30.0 ** 4])
