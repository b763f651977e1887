"""The core model against ggml's documented facts: numbering, block sizes, ne/nb, views, graphs."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc
from prism_core.types import TRAITS, GGMLType, bf16_to_f32, f32_to_bf16, row_size


def test_enum_numbers_follow_ggml_head():
    ops = (pc.Op.ADD, pc.Op.MUL_MAT, pc.Op.SOFT_MAX, pc.Op.ROPE, pc.Op.IM2COL, pc.Op.POOL_2D)
    assert ops == (2, 29, 46, 48, 52, 61)
    assert (pc.Op.UNARY, pc.Op.CROSS_ENTROPY_LOSS, pc.Op.OPT_STEP_ADAMW, pc.Op.GLU) == (91, 96, 98, 100)
    assert len(pc.Op) == 101 and pc.Op.CUMSUM == 16 and pc.Op.FLASH_ATTN_EXT == 74
    assert (pc.UnaryOp.EXPM1, pc.UnaryOp.SOFTPLUS, pc.UnaryOp.GELU_ERF, pc.UnaryOp.TRUNC) == (14, 15, 16, 21)
    assert (pc.GluOp.SWIGLU, pc.GluOp.SWIGLU_OAI, pc.GluOp.GEGLU_QUICK) == (2, 3, 5)


@pytest.mark.parametrize("t,blck,size", [("f32", 1, 4), ("f16", 1, 2), ("bf16", 1, 2), ("q4_0", 32, 18),
                                         ("q4_1", 32, 20), ("q5_0", 32, 22), ("q8_0", 32, 34), ("q2_K", 256, 84),
                                         ("q6_K", 256, 210), ("q8_K", 256, 292), ("iq4_xs", 256, 136),
                                         ("mxfp4", 32, 17), ("tq1_0", 256, 54), ("i64", 1, 8), ("f64", 1, 8)])
def test_type_traits(t, blck, size):
    tr = pc.types.traits(pc.types.as_type(t))
    assert (tr.name, tr.blck_size, tr.type_size) == (t, blck, size)


def test_type_numbers_and_row_size():
    assert (GGMLType.Q4_0, GGMLType.I8, GGMLType.BF16, GGMLType.MXFP4, GGMLType.Q2_0) == (2, 24, 30, 39, 42)
    assert 4 not in TRAITS and 5 not in TRAITS  # removed slots are not declared
    assert row_size(GGMLType.Q4_0, 64) == 36 and row_size(GGMLType.F16, 10) == 20


def test_bf16_rounds_to_nearest_even():
    # 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0)
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.nan], np.float32)
    bits = f32_to_bf16(x)
    assert bits[0] == 0x3F80 and bits[1] == 0x3F82 and bf16_to_f32(bits)[2] == -2.5
    assert bits[3] & 0x0040  # NaN kept quiet


def test_ne_nb_and_numpy_order():
    ctx = pc.Context()
    t = ctx.new_tensor(pc.F32, (5, 3, 2))
    assert t.ne == (5, 3, 2, 1) and t.nb == (4, 20, 60, 120)
    assert t.shape == (2, 3, 5) and t.n_dims == 3 and t.nrows == 6 and t.nbytes == 120
    q = ctx.new_tensor("q4_0", (64, 2))
    assert q.nb == (18, 36, 72, 72) and q.nbytes == 72
    a = np.arange(30, dtype=np.float32).reshape(2, 3, 5)
    t.set(a)
    assert np.array_equal(t.numpy(), a)
    assert t.host().strides == (120, 60, 20, 4)


def test_views_share_storage_and_collapse_chains():
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6))
    v = pc.view_2d(a, 3, 2, a.nb[1], 4 * 1)         # rows 0..1, columns 1..3
    vv = pc.view_1d(v, 2, 4)                        # a view of a view points at a
    assert v.view_src is a and vv.view_src is a and vv.view_offs == 8
    assert np.array_equal(v.numpy(), [[1, 2, 3], [7, 8, 9]])
    a.set(np.zeros((4, 6)))
    assert not v.numpy().any()
    assert not v.is_contiguous() and pc.transpose(a).is_transposed()


def test_permute_follows_ggml_convention():
    ctx = pc.Context()
    a = ctx.new_tensor(pc.F32, (2, 3, 4, 5))
    p = pc.permute(a, 2, 0, 1, 3)                   # source dim k goes to position axes[k]
    assert p.ne == (3, 4, 2, 5) and p.nb == (a.nb[1], a.nb[2], a.nb[0], a.nb[3])


def test_contiguity_predicates():
    ctx = pc.Context()
    a = ctx.new_tensor(pc.F32, (4, 3, 2))
    assert a.is_contiguous() and a.is_contiguous_rows() and not a.is_permuted()
    gap = pc.view_3d(a, 2, 3, 2, a.nb[1], a.nb[2])
    assert not gap.is_contiguous() and gap.is_contiguous_rows()
    assert pc.permute(a, 1, 0, 2, 3).is_permuted()


def test_flags_and_names():
    ctx = pc.Context()
    w = ctx.new_tensor(pc.F32, (3,), "w").set_param()
    assert w.flags & pc.Flag.PARAM and w.name == "w"
    s = pc.sum(w).set_loss()
    assert s.flags & pc.Flag.LOSS
    pc.view_1d(w, 2).set_output()
    assert w.flags & pc.Flag.OUTPUT  # set_output marks the view's source too
    w.name = "x" * 63
    assert len(w.name) == 63


def test_op_params_are_typed_and_immutable():
    ctx = pc.Context()
    y = pc.soft_max_ext(ctx.new_tensor(pc.F32, (4, 2)), scale=0.5)
    assert dict(y.params) == {"scale": 0.5, "max_bias": 0.0}
    with pytest.raises(TypeError):
        y.params["scale"] = 1.0  # type: ignore[index]
    assert pc.abs(ctx.new_tensor(pc.F32, (2,))).params["unary_op"] is pc.UnaryOp.ABS


def test_inplace_results_alias_their_source():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([-1.0, 2.0], np.float32))
    r = pc.relu_inplace(a)
    assert r.view_src is a
    pc.compute(r)
    assert np.array_equal(a.numpy(), [0.0, 2.0])


def test_graph_topological_order_without_duplicates():
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (4,), "x")
    w = ctx.new_tensor(pc.F32, (4,), "w").set_param()
    h = pc.mul(x, w)
    y = pc.add(h, h)  # h used twice
    z = pc.sum(pc.sqr(y))
    g = pc.Graph().expand(z)
    assert [n.op.name for n in g.nodes] == ["NONE", "MUL", "ADD", "SQR", "SUM"]
    assert g.nodes[0] is w and g.leafs == [x]  # params are nodes, as in ggml
    for i, n in enumerate(g.nodes):
        assert all(s is None or s in g.leafs or g.nodes.index(s) < i for s in n.src)
    g.expand(z)
    assert len(g.nodes) == 5  # expanding again adds nothing
    g.expand(pc.neg(h))
    assert [n.op.name for n in g.nodes][-1] == "UNARY" and len(g.nodes) == 6


def test_deep_chain_does_not_hit_recursion_limit():
    ctx = pc.Context()
    t = ctx.new_tensor(pc.F32, (2,))
    for _ in range(3000):
        t = pc.scale(t, 1.0)
    assert len(pc.Graph(capacity=4000).expand(t)) == 3000


def test_context_budget_counts_memory():
    ctx = pc.Context(mem_size=10_000)
    ctx.new_tensor(pc.F32, (1000,))
    assert ctx.used == 368 + 4000
    with pytest.raises(pc.BoundExceeded, match="budget"):
        ctx.new_tensor(pc.F32, (2000,))


def test_compute_report_lists_fallbacks():
    class OnlyAdd(pc.Backend):
        name = "onlyadd_core"
        kernels = {"ADD": pc.backend("numpy").kernels["ADD"]}

    ctx = pc.Context()
    a = ctx.from_numpy(np.ones(3, np.float32))
    y = pc.mul(pc.add(a, a), a)
    rep = pc.compute(y, OnlyAdd())
    assert rep.fell_back == ["MUL"] and np.array_equal(y.numpy(), [2, 2, 2])
    with pytest.raises(pc.Unsupported, match="MUL"):
        pc.compute(y, OnlyAdd(), strict=True)
