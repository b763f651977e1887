"""The numba backend's prepared calls (Backend.prepare, used by plans): kernel calls recorded
once with their arguments bound must keep computing what the reference computes when the
input values change between computes, both for small nodes (serial compilations) and for
nodes sent to the thread pool; wrappers that read tensor values are not recorded."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import one_per_op_and_family

import prism_core as pc
from prism_core.conformance.cases import all_cases
from prism_core.conformance.runner import compare

pytest.importorskip("numba")


def _perturb(ctx: pc.Context) -> None:
    """New values for every leaf, the same in any context built from the same case: floats
    x -> 0.75 x + 0.125 (signs and infinities kept for x >= 0 or x = -inf ranges that the cases
    use), integers in reversed order (index ranges kept), block types' rows in reversed order."""
    for t in ctx.tensors:
        if t.opdef is not None or t.view_src is not None or t.nelements == 0:
            continue
        if t.traits.is_quantized:  # valid blocks stay valid: the rows in reversed order
            t.set_raw(t.raw()[..., ::-1, :].copy())
            continue
        v = t.numpy()
        if t.type in (pc.F32, pc.F16, pc.BF16):
            t.set(v.astype(np.float64) * 0.75 + 0.125)
        else:
            t.set(v.reshape(-1)[::-1].reshape(v.shape))


# Every case with small nodes on the serial compilations; with every node sent to the thread pool, each op's
# first case and its first on a block type (the recorded arguments are the same, only the entry points differ):
# the parallel compilations tests/test_numba_backend.py's two-thread run makes, loaded from the on-disk cache.
@pytest.mark.parametrize("serial_work,subset", [("65536", False), ("0", True)],
                         ids=["small nodes serial", "every node parallel"])
def test_prepared_calls_follow_new_input_values(serial_work, subset, monkeypatch):
    monkeypatch.setenv("PRISM_NUMBA_SERIAL_WORK", serial_work)
    be = pc.backend("numba")
    cases = one_per_op_and_family(all_cases()) if subset else all_cases()
    failures, prepared = [], 0
    for case in cases:
        ctx = pc.Context()
        built = case.build(ctx, np.random.default_rng(case.seed))
        built.out.set_output()
        graph = pc.Graph().expand(built.out)
        plan = pc.plan(graph, be, reuse=False)
        prepared += sum(isinstance(c, functools.partial) and c.func != be.compute for c in plan.calls)
        _perturb(ctx)  # after planning: the recorded calls must read the new values
        plan.compute()

        ref_ctx = pc.Context()
        ref = case.build(ref_ctx, np.random.default_rng(case.seed))
        _perturb(ref_ctx)
        pc.compute(pc.Graph().expand(ref.out), "numpy")
        bound = built.out.opdef.nmse if built.out.opdef else 0.0
        for got, want in zip((built.out, *built.extra), (ref.out, *ref.extra)):
            ok, msg, err, _ = compare(got.numpy(), want.numpy(), bound)
            if not ok:
                failures.append(f"{case.name}: {msg or f'error {err:.3g} > {bound:.3g}'}")
    assert not failures, "\n".join(failures[:20])
    assert prepared > len(cases) // 2  # most nodes were prepared, not left to compute()


def test_small_node_prepared_call_is_the_compiled_function(monkeypatch):
    monkeypatch.delenv("PRISM_NUMBA_SERIAL_WORK", raising=False)
    be = pc.backend("numba")
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(16, dtype=np.float32))
    one = ctx.from_numpy(np.ones(16, np.float32))
    y = pc.add(pc.add(x, one), one).set_output()
    plan = pc.plan(y, be)
    for call in plan.calls:  # no Python wrapper in between: the serial compilation's entry point
        assert isinstance(call, functools.partial) and call.func != be.compute
        assert not hasattr(call.func, "__code__")
    plan.compute()
    np.testing.assert_array_equal(y.numpy(), np.arange(16) + 2)
    x.set(np.full(16, 5.0))
    plan.compute()
    np.testing.assert_array_equal(y.numpy(), np.full(16, 7.0))


def test_value_reading_wrappers_are_not_recorded():
    from prism_numba.kernels import READS_VALUES, record
    assert {"GET_ROWS", "OPT_STEP_ADAMW", "ROPE", "SET_ROWS", "MUL_MAT_ID"} <= READS_VALUES
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    idx = ctx.from_numpy(np.array([2, 0], np.int32))
    rows = pc.get_rows(a, idx).set_output()
    assert record(rows, serial=True) is None
    plan = pc.plan(rows, "numba")
    plan.compute()
    np.testing.assert_array_equal(rows.numpy(), [[8, 9, 10, 11], [0, 1, 2, 3]])
    idx.set(np.array([5, 0]))  # out of range: still checked on every compute
    with pytest.raises(pc.InvalidArgument, match="out of range"):
        plan.compute()


def test_plans_over_shared_tensors_on_numba():
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(4, dtype=np.float32))
    mid = pc.sqr(x)
    first = pc.add(mid, x).set_output()
    second = pc.mul(pc.add(mid, mid), x).set_output()
    p1, p2 = pc.plan(pc.Graph().expand(first), "numba"), pc.plan(pc.Graph().expand(second), "numba")
    for _ in range(2):
        p1.compute()
        np.testing.assert_array_equal(first.numpy(), np.arange(4) ** 2 + np.arange(4))
        p2.compute()
        np.testing.assert_array_equal(second.numpy(), 2 * np.arange(4) ** 3)
