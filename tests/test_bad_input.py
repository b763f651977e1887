"""Bad input is refused cleanly: the most specific error class, a message naming the op
or argument, and no trace left in the context or in a graph.

Each refusal runs inside :func:`refused`, which snapshots the context (tensor count,
bytes used, tensor identities) and a graph (node and leaf identities) before the call
and compares them afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from helpers import refused

import prism_core as pc
from prism_core import BoundExceeded, InvalidArgument, ShapeMismatch, TypeMismatch, UnknownBackend, Unsupported


# ---------------------------------------------------------------- helpers
@pytest.fixture
def ctx() -> pc.Context:
    return pc.Context()


@pytest.fixture
def graph(ctx: pc.Context) -> pc.Graph:
    """A graph that already holds a few nodes and leafs of ``ctx``."""
    x = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), name="x")
    return pc.Graph().expand(pc.sqr(pc.add(x, x)))


def f32(ctx: pc.Context, *shape: int) -> pc.Tensor:
    """An F32 tensor of NumPy ``shape`` holding 0, 1, 2..."""
    return ctx.from_numpy(np.arange(math.prod(shape), dtype=np.float32).reshape(shape))


def i32(ctx: pc.Context, values) -> pc.Tensor:
    return ctx.from_numpy(np.asarray(values, dtype=np.int32))


# ---------------------------------------------------------------- builders: table of refusals
# Each case: (id, setup(ctx) -> the refused call, error class, regex on the message).
Setup = Callable[[pc.Context], Callable[[], object]]


def _transposed_mul_mat(ctx):
    at = pc.transpose(f32(ctx, 4, 3))  # ne [4, 3] after the swap; nb[0] > nb[1]
    b = f32(ctx, 2, 4)
    return lambda: pc.mul_mat(at, b)


def _reshape_non_contiguous(ctx):
    t = pc.transpose(f32(ctx, 4, 4))
    return lambda: pc.reshape(t, (16,))


def _adamw_not_param(ctx):
    a, g, m, v = (f32(ctx, 2, 3) for _ in range(4))
    p = f32(ctx, 7)
    return lambda: pc.opt_step_adamw(a, g, m, v, p)


def _two_args(make_a, make_b, call):
    def setup(ctx):
        a, b = make_a(ctx), make_b(ctx)
        return lambda: call(a, b)
    return setup


def _one_arg(make_a, call):
    def setup(ctx):
        a = make_a(ctx)
        return lambda: call(a)
    return setup


def _other_context(ctx):
    a = f32(ctx, 2, 2)
    b = f32(pc.Context(), 2, 2)
    return lambda: pc.add(a, b)


M34 = lambda c: f32(c, 3, 4)  # noqa: E731
M44 = lambda c: f32(c, 4, 4)  # noqa: E731
F16_34 = lambda c: c.from_numpy(np.ones((3, 4), np.float16))  # noqa: E731
I32_34 = lambda c: c.from_numpy(np.ones((3, 4), np.int32))  # noqa: E731


def empty(*ne: int) -> Callable[[pc.Context], pc.Tensor]:
    """A maker of a zero-filled F32 tensor of extents ``ne`` (ggml order)."""
    return lambda c: c.new_tensor("f32", ne)


CASES: list[tuple[str, Setup, type[Exception], str]] = [
    # shapes that do not broadcast
    ("add-no-broadcast", _two_args(M34, lambda c: f32(c, 3, 3), pc.add), ShapeMismatch,
     r"ADD: b \(ne=\[3, 3, 1, 1\]\) does not broadcast into a"),
    ("mul-no-broadcast", _two_args(M34, lambda c: f32(c, 2, 4), pc.mul), ShapeMismatch,
     r"MUL: b .* does not broadcast"),
    ("repeat-not-a-tiling", _two_args(M34, lambda c: f32(c, 4, 8), pc.repeat), ShapeMismatch,
     r"REPEAT: a .* cannot be tiled"),
    ("repeat_back-not-a-tiling", _two_args(M34, lambda c: f32(c, 2, 4), pc.repeat_back), ShapeMismatch,
     r"REPEAT_BACK: a .* is not a tiling"),
    # matrix products
    ("mul_mat-inner-dim", _two_args(M34, lambda c: f32(c, 2, 5), pc.mul_mat), ShapeMismatch,
     r"MUL_MAT: inner extents differ: a.ne\[0\]=4, b.ne\[0\]=5"),
    ("mul_mat-batch-not-divisible", _two_args(lambda c: f32(c, 3, 2, 4), lambda c: f32(c, 2, 2, 4), pc.mul_mat),
     ShapeMismatch, r"MUL_MAT: a's batch dims \(3, 1\) must divide b's \(2, 1\)"),
    ("mul_mat-transposed-a", _transposed_mul_mat, InvalidArgument, r"MUL_MAT: a must not be transposed"),
    ("out_prod-summed-dim", _two_args(M34, lambda c: f32(c, 2, 5), pc.out_prod), ShapeMismatch,
     r"OUT_PROD: a.ne\[1\]=3 must equal b.ne\[1\]=2"),
    # element types
    ("add-i32", _two_args(I32_34, I32_34, pc.add), TypeMismatch, r"ADD: source 'a' has type i32; accepted: .*f32"),
    ("get_rows-f32-indices", _two_args(M34, lambda c: f32(c, 2), pc.get_rows), TypeMismatch,
     r"GET_ROWS: source 'b' has type f32; accepted: i32"),
    ("count_equal-f32", _two_args(M34, M34, pc.count_equal), TypeMismatch, r"COUNT_EQUAL: source 'a' has type f32"),
    ("set-different-types", _two_args(M34, F16_34, lambda a, b: pc.set_1d(a, b, 0)), TypeMismatch,
     r"SET: b has type f16 but a has f32"),
    ("cross_entropy-f16", _two_args(F16_34, F16_34, pc.cross_entropy_loss), TypeMismatch,
     r"CROSS_ENTROPY_LOSS: source 'a' has type f16"),
    ("add-quantized-b", _two_args(lambda c: c.new_tensor("q4_0", (32,)), lambda c: c.new_tensor("q4_0", (32,)),
                                  pc.add), TypeMismatch, r"ADD: source 'b' has type q4_0; accepted: bf16, f16, f32"),
    ("sub-quantized", _two_args(lambda c: c.new_tensor("q4_0", (32,)), lambda c: f32(c, 32), pc.sub),
     TypeMismatch, r"SUB: source 'a' has type q4_0; accepted: bf16, f16, f32"),
    ("mul_mat-quantized-f16-b", _two_args(lambda c: c.new_tensor("q4_0", (32, 2)),
                                          lambda c: c.new_tensor("f16", (32, 3)), pc.mul_mat), TypeMismatch,
     r"MUL_MAT: source 'a' is quantized \(q4_0\), so 'b' must be f32, got f16"),
    ("mul_mat-q8_K-weight", _two_args(lambda c: c.new_tensor("q8_K", (256, 2)), lambda c: f32(c, 256), pc.mul_mat),
     TypeMismatch, r"MUL_MAT: source 'a' has type q8_K"),
    ("cpy-quantized-to-f16", _two_args(lambda c: c.new_tensor("q8_0", (32,)), lambda c: c.new_tensor("f16", (32,)),
                                       pc.cpy), TypeMismatch, r"CPY: q8_0 -> f16: block types convert to and from f32"),
    ("cpy-to-iq2_xxs", _two_args(lambda c: f32(c, 256), lambda c: c.new_tensor("iq2_xxs", (256,)), pc.cpy),
     TypeMismatch, r"CPY: no quantizer for iq2_xxs: Prism dequantizes it only"),
    # parameters: not finite, out of range, wrong kind, unknown, missing
    ("scale-nan", _one_arg(M34, lambda a: pc.scale(a, float("nan"))), InvalidArgument,
     r"SCALE: parameter 's' must be finite, got nan"),
    ("scale-inf", _one_arg(M34, lambda a: pc.scale(a, math.inf)), InvalidArgument,
     r"SCALE: parameter 's' must be finite, got inf"),
    ("scale-bias-nan-numpy", _one_arg(M34, lambda a: pc.scale_bias(a, 1.0, np.float32("nan"))), InvalidArgument,
     r"SCALE: parameter 'b' must be finite"),
    ("scale-str", _one_arg(M34, lambda a: pc.scale(a, "2")), InvalidArgument,
     r"SCALE: parameter 's' must be a number, got '2'"),
    ("norm-eps-negative", _one_arg(M34, lambda a: pc.norm(a, -1e-5)), InvalidArgument,
     r"NORM: parameter 'eps' must be >= 0.0, got -1e-05"),
    ("rms_norm-eps-inf", _one_arg(M34, lambda a: pc.rms_norm(a, math.inf)), InvalidArgument,
     r"RMS_NORM: parameter 'eps' must be finite"),
    ("soft_max-max_bias-negative", _one_arg(M34, lambda a: pc.soft_max_ext(a, max_bias=-0.5)), InvalidArgument,
     r"SOFT_MAX: parameter 'max_bias' must be >= 0.0, got -0.5"),
    ("soft_max-alibi-without-mask", _one_arg(M34, lambda a: pc.soft_max_ext(a, max_bias=8.0)), InvalidArgument,
     r"SOFT_MAX: max_bias > 0 \(ALiBi\) needs a mask"),
    ("clamp-min-over-max", _one_arg(M34, lambda a: pc.clamp(a, 1.0, -1.0)), InvalidArgument,
     r"CLAMP: min=1.0 is greater than max=-1.0"),
    ("leaky_relu-nan", _one_arg(M34, lambda a: pc.leaky_relu(a, float("nan"))), InvalidArgument,
     r"LEAKY_RELU: parameter 'negative_slope' must be finite"),
    ("xielu-inf", _one_arg(M34, lambda a: pc.xielu(a, beta=-math.inf)), InvalidArgument,
     r"XIELU: parameter 'beta' must be finite"),
    ("diag_mask-n_past-float", _one_arg(M44, lambda a: pc.diag_mask_inf(a, 1.5)), InvalidArgument,
     r"DIAG_MASK_INF: parameter 'n_past' must be an int, got 1.5"),
    ("diag_mask-n_past-bool", _one_arg(M44, lambda a: pc.diag_mask_zero(a, True)), InvalidArgument,
     r"DIAG_MASK_ZERO: parameter 'n_past' must be an int, got True"),
    ("diag_mask-n_past-over-int32", _one_arg(M44, lambda a: pc.diag_mask_inf(a, 2**31)), InvalidArgument,
     r"DIAG_MASK_INF: parameter 'n_past' must be <= 2147483647"),
    ("unknown-param", _one_arg(M34, lambda a: pc.node("SCALE", a, s=1.0, bias=2.0)), InvalidArgument,
     r"SCALE: unknown parameter\(s\) \['bias'\]; known: \['b', 's'\]"),
    ("missing-param", _one_arg(M34, lambda a: pc.node("SCALE", a)), InvalidArgument,
     r"SCALE: parameter 's' is required"),
    ("param-on-paramless-op", _one_arg(M34, lambda a: pc.node("ABS", a, unary_op=3)), InvalidArgument,
     r"ABS: unknown parameter\(s\) \['unary_op'\]; known: none"),
    ("view-offset-negative", _one_arg(M44, lambda a: pc.view_1d(a, 2, -4)), InvalidArgument,
     r"VIEW: parameter 'offset' must be >= 0"),
    # sources
    ("source-not-a-tensor", _one_arg(M34, lambda a: pc.add(a, np.ones((3, 4), np.float32))), InvalidArgument,
     r"ADD: source 'b' must be a Tensor, got ndarray"),
    ("too-many-sources", _two_args(M34, M34, lambda a, b: pc.node("SQR", a, b)), InvalidArgument,
     r"SQR: takes at most 1 sources, got 2"),
    ("missing-source", _one_arg(M34, lambda a: pc.node("ADD", a)), InvalidArgument,
     r"ADD: source 'b' is required"),
    ("unknown-op", _one_arg(M34, lambda a: pc.node("FROBNICATE", a)), InvalidArgument,
     r"unknown op 'FROBNICATE'"),
    ("sources-from-two-contexts", _other_context, InvalidArgument, r"ADD: source 'b' belongs to another context"),
    ("unknown-unary-name", _one_arg(M34, lambda a: pc.unary(a, "frobnicate")), InvalidArgument,
     r"unknown unary op 'frobnicate'; known: ABS"),
    ("inplace-without-variant", _two_args(M44, M44, lambda a, b: pc.node("MUL_MAT", a, b, inplace=True)),
     InvalidArgument, r"MUL_MAT: has no in-place variant"),
    ("inplace-repeat", _two_args(M34, M34, lambda a, b: pc.node("REPEAT", a, b, inplace=True)),
     InvalidArgument, r"REPEAT: has no in-place variant"),
    # views, reshapes, permutes
    ("view_1d-offset-past-end", _one_arg(lambda c: f32(c, 8), lambda a: pc.view_1d(a, 4, 20)), BoundExceeded,
     r"VIEW: view of .* spans bytes \[20, 36\) but its storage has 32 bytes"),
    ("view_2d-nb1-too-large", _one_arg(M44, lambda a: pc.view_2d(a, 4, 4, 32)), BoundExceeded,
     r"view of .* spans bytes \[0, 112\) but its storage has 64 bytes"),
    ("view-of-view-past-end", _one_arg(lambda c: pc.view_1d(f32(c, 8), 4, 16), lambda v: pc.view_1d(v, 4, 4)),
     BoundExceeded, r"spans bytes \[20, 36\)"),
    ("view-negative-stride", _one_arg(M44, lambda a: pc.view(a, (4, 2), (-16, 32, 32))), InvalidArgument,
     r"VIEW: strides must be non-negative"),
    ("view-nb-wrong-count", _one_arg(M44, lambda a: pc.view(a, (4, 2), (16,))), InvalidArgument,
     r"VIEW: nb must hold the 3 strides"),
    ("reshape-non-contiguous", _reshape_non_contiguous, InvalidArgument,
     r"RESHAPE: a must be contiguous; use cont\(\) first"),
    ("reshape-element-count", _one_arg(M44, lambda a: pc.reshape(a, (15,))), ShapeMismatch,
     r"RESHAPE: new ne=\[15, 1, 1, 1\] has 15 elements, a has 16"),
    ("reshape-5-dims", _one_arg(M44, lambda a: pc.reshape(a, (1, 1, 1, 4, 4))), BoundExceeded,
     r"RESHAPE: ne has 5 dims"),
    ("reshape-negative", _one_arg(M44, lambda a: pc.reshape(a, (-4, -4))), InvalidArgument,
     r"RESHAPE: ne must be non-negative"),
    ("cont-element-count", _one_arg(M44, lambda a: pc.cont_2d(a, 3, 5)), ShapeMismatch,
     r"CONT: new ne=\[3, 5, 1, 1\] has 15 elements, a has 16"),
    ("cpy-element-count", _two_args(M34, M44, pc.cpy), ShapeMismatch, r"CPY: a has 12 elements, the target b has 16"),
    ("permute-repeated-axes", _one_arg(M44, lambda a: pc.permute(a, 0, 0, 1, 2)), InvalidArgument,
     r"PERMUTE: axes must be a permutation of 0..3, got \(0, 0, 1, 2\)"),
    ("permute-axis-out-of-range", _one_arg(M44, lambda a: pc.permute(a, 0, 1, 2, 4)), InvalidArgument,
     r"PERMUTE: axes must be a permutation"),
    # regions (acc / set)
    ("acc-region-past-end", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 16, 32, 32, 60)),
     InvalidArgument, r"ACC: the region \(offset 60, .*\) .* ends at byte 84, past a's 64 bytes"),
    ("acc-misaligned-offset", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 16, 32, 32, 2)),
     InvalidArgument, r"ACC: offset=2 is not a multiple of the element size 4"),
    ("acc-misaligned-nb1", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 6, 32, 32, 0)),
     InvalidArgument, r"ACC: nb1=6 is not a multiple of the element size 4"),
    ("acc-negative-offset", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 16, 32, 32, -4)),
     InvalidArgument, r"ACC: parameter 'offset' must be >= 0"),
    ("set-region-past-end", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.set_1d(a, b, 64)),
     InvalidArgument, r"SET: the region .* past a's 64 bytes"),
    ("set-b-too-big", _two_args(lambda c: f32(c, 2, 2), M44, lambda a, b: pc.set_1d(a, b, 0)),
     ShapeMismatch, r"SET: b has 16 elements, more than a's 4"),
    # indexing, masks, sinks
    ("get_rows-index-shape", _two_args(M44, lambda c: i32(c, [[0, 1], [2, 3]]), pc.get_rows), ShapeMismatch,
     r"GET_ROWS: indices b ne=\[2, 2, 1, 1\] must be \[m, a.ne\[2\]=1"),
    ("soft_max-mask-ne0", _two_args(M44, lambda c: f32(c, 4, 3), pc.soft_max_ext), ShapeMismatch,
     r"SOFT_MAX: mask ne=\[3, 4, 1, 1\] must have ne\[0\]=4"),
    ("soft_max-mask-too-few-rows", _two_args(M44, lambda c: f32(c, 2, 4), pc.soft_max_ext), ShapeMismatch,
     r"SOFT_MAX: mask ne=\[4, 2, 1, 1\] must have ne\[0\]=4 and ne\[1\] >= 4"),
    ("soft_max-mask-i32", _two_args(M44, lambda c: c.from_numpy(np.zeros((4, 4), np.int32)), pc.soft_max_ext),
     TypeMismatch, r"SOFT_MAX: source 'mask' has type i32"),
    ("soft_max-sinks-length", _two_args(lambda c: f32(c, 3, 4, 4), lambda c: f32(c, 2),
                                        lambda a, s: pc.soft_max_ext(a, sinks=s)),
     ShapeMismatch, r"SOFT_MAX: sinks must be a vector of a.ne\[2\]=3 entries"),
    ("argmax-3d", _one_arg(lambda c: f32(c, 2, 3, 4), pc.argmax), ShapeMismatch, r"ARGMAX: a must be a matrix"),
    ("add1-not-scalar", _two_args(M34, lambda c: f32(c, 2), pc.add1), ShapeMismatch,
     r"ADD1: b must hold one element"),
    ("count_equal-shapes", _two_args(lambda c: i32(c, [1, 2, 3]), lambda c: i32(c, [1, 2]), pc.count_equal),
     ShapeMismatch, r"COUNT_EQUAL: a has ne=\[3, 1, 1, 1\] but b has ne=\[2, 1, 1, 1\]"),
    # optimizer
    ("adamw-not-a-param", _adamw_not_param, InvalidArgument,
     r"OPT_STEP_ADAMW: a .* must be flagged as a parameter \(set_param\)"),
    # zero extents must give a clean ShapeMismatch, not ZeroDivisionError
    ("mul_mat-zero-batch", _two_args(empty(4, 3, 0), empty(4, 2, 2), pc.mul_mat), ShapeMismatch,
     r"MUL_MAT: a's batch dims \(0, 1\) must divide"),
    ("out_prod-zero-batch", _two_args(empty(4, 3, 0), empty(5, 3, 2), pc.out_prod), ShapeMismatch,
     r"OUT_PROD: a's batch dims \(0, 1\) must divide"),
    ("soft_max-mask-zero-batch", _two_args(empty(4, 4, 2), empty(4, 4, 0), pc.soft_max_ext), ShapeMismatch,
     r"SOFT_MAX: mask dims 2,3 \(0, 1\) must divide"),
]


@pytest.mark.parametrize("setup, cls, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_builder_refuses(ctx, graph, setup, cls, match):
    call = setup(ctx)
    with refused(cls, match, ctx, graph):
        call()


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_refused_builder_then_valid_builder_works(ctx, graph):
    """A refusal leaves nothing half-made: the same context builds and computes afterwards."""
    a, b = f32(ctx, 3, 4), f32(ctx, 3, 3)
    with refused(ShapeMismatch, "ADD", ctx, graph):
        pc.add(a, b)
    c = pc.add(a, a)
    pc.compute(c, "numpy")
    np.testing.assert_array_equal(c.numpy(), 2 * a.numpy())


# ---------------------------------------------------------------- tensor creation
@pytest.mark.parametrize("ne, cls, match", [
    ((1, 1, 1, 1, 2), BoundExceeded, r"ne has 5 dims; Prism tensors have 1 to 4"),
    ((), BoundExceeded, r"ne has 0 dims"),
    ((4, -1), InvalidArgument, r"ne must be non-negative, got \(4, -1\)"),
    ((4.0, 2), InvalidArgument, r"ne must hold ints, got 4.0"),
    ((4, True), InvalidArgument, r"ne must hold ints, got True"),
    (("4",), InvalidArgument, r"ne must hold ints, got '4'"),
    (4, InvalidArgument, r"ne must be a sequence of 1 to 4 ints, got 4"),
    ((2**40, 2**40), BoundExceeded, r"elements, over the bound 2\*\*62"),
    ((2**63,), BoundExceeded, r"ne extent 9223372036854775808 exceeds the bound"),
], ids=["5-dims", "0-dims", "negative", "float", "bool", "str", "not-a-sequence", "too-many-elements",
        "extent-too-large"])
def test_new_tensor_bad_ne(ctx, graph, ne, cls, match):
    with refused(cls, match, ctx, graph):
        ctx.new_tensor("f32", ne)


def test_quantized_ne0_not_multiple_of_block(ctx, graph):
    with refused(InvalidArgument, r"ne\[0\]=33 must be a multiple of q4_0's block size 32", ctx, graph):
        ctx.new_tensor("q4_0", (33, 2))
    with refused(InvalidArgument, r"ne\[0\]=128 must be a multiple of q4_K's block size 256", ctx, graph):
        ctx.new_tensor("q4_k", (128,))


@pytest.mark.parametrize("name", ["x" * 64, "é" * 32, "名" * 22, "a" * 62 + "é"],
                         ids=["ascii-64", "2-byte-utf8-64", "3-byte-utf8-66", "ascii-plus-2-bytes-64"])
def test_name_over_63_bytes(ctx, graph, name):
    assert len(name) <= 64 and len(name.encode()) > 63
    with refused(BoundExceeded, r"tensor name .* is \d+ bytes; the bound is 63", ctx, graph):
        ctx.new_tensor("f32", (4,), name=name)
    with refused(BoundExceeded, r"the bound is 63", ctx, graph):
        ctx.from_numpy(np.ones(3, np.float32), name=name)
    t = ctx.new_tensor("f32", (4,), name="ok")
    with refused(BoundExceeded, r"the bound is 63", ctx, graph):
        t.set_name(name)
    assert t.name == "ok"
    t.name = "é" * 31 + "a"  # exactly 63 bytes is fine
    assert len(t.name.encode()) == 63


def test_name_not_a_str(ctx, graph):
    with refused(InvalidArgument, r"tensor name must be str, got int", ctx, graph):
        ctx.new_tensor("f32", (4,), name=5)


def test_unknown_type_names(ctx, graph):
    with pytest.raises(InvalidArgument, match=r"unknown type name 'q9_9'; known: f32, f16") as info:
        pc.types.as_type("q9_9")
    assert info.type is InvalidArgument
    with refused(InvalidArgument, r"unknown type name 'q9_9'", ctx, graph):
        ctx.new_tensor("q9_9", (4,))
    with refused(InvalidArgument, r"unknown type number 99", ctx, graph):
        ctx.new_tensor(99, (4,))
    a = f32(ctx, 4)
    with refused(InvalidArgument, r"unknown type name 'f33'", ctx, graph):
        pc.cast(a, "f33")


def test_from_numpy_bad_arrays(ctx, graph):
    with refused(BoundExceeded, r"from_numpy: array has 5 dims", ctx, graph):
        ctx.from_numpy(np.ones((1, 1, 1, 1, 2), np.float32))
    with refused(TypeMismatch, r"NumPy dtype complex128 has no Prism type", ctx, graph):
        ctx.from_numpy(np.ones(3, complex))
    with refused(TypeMismatch, r"NumPy dtype object has no Prism type", ctx, graph):
        ctx.from_numpy(np.array([None, 1]))
    with refused(TypeMismatch, r"set: values must be numeric, got dtype <U1", ctx, graph):
        ctx.from_numpy(np.array(["a", "b"]), type="f32")  # the admitted tensor is rolled back


@pytest.mark.parametrize("kw, match", [
    ({"mem_size": 0}, r"Context: mem_size must be a positive int"),
    ({"mem_size": -1}, r"Context: mem_size must be a positive int"),
    ({"mem_size": 1.5e6}, r"Context: mem_size must be a positive int"),
    ({"mem_size": True}, r"Context: mem_size must be a positive int"),
    ({"guard_bytes": -1}, r"Context: guard_bytes must be an int >= 0"),
    ({"guard_bytes": 1.5}, r"Context: guard_bytes must be an int >= 0"),
    ({"guard_bytes": "16"}, r"Context: guard_bytes must be an int >= 0"),
])
def test_context_bad_arguments(kw, match):
    with pytest.raises(InvalidArgument, match=match) as info:
        pc.Context(**kw)
    assert info.type is InvalidArgument


# ---------------------------------------------------------------- memory budget
def test_memory_budget_exceeded_new_tensor():
    small = pc.Context(mem_size=2000)
    a = small.new_tensor("f32", (16,))  # 368 + 64 bytes
    with refused(BoundExceeded, r"context memory budget exceeded: a new tensor \(f32, ne=\[1000, 1, 1, 1\]\) "
                 r"needs 4368 bytes, 1568 of 2000 are left", small):
        small.new_tensor("f32", (1000,))
    assert small.tensors == [a]


def test_memory_budget_exceeded_by_builder_and_view():
    small = pc.Context(mem_size=368 * 3 + 64)
    a = small.from_numpy(np.ones(4, np.float32))
    b = pc.add(a, a)  # two tensors of 368 + 16 bytes each: 400 bytes left
    g = pc.Graph().expand(b)
    c = pc.view_1d(a, 2)  # a view costs only its metadata (368): 32 bytes left
    assert small.used == 368 * 3 + 32
    with refused(BoundExceeded, r"ADD: context memory budget exceeded: a new tensor \(f32, ne=\[4, 1, 1, 1\]\) "
                 r"needs 384 bytes, 32 of", small, g):
        pc.add(a, a)
    with refused(BoundExceeded, r"VIEW: context memory budget exceeded: a new view \(f32, ne=\[1, 1, 1, 1\]\) "
                 r"needs 368 bytes", small, g):
        pc.view_1d(c, 1)
    with refused(BoundExceeded, r"context memory budget exceeded", small, g):
        pc.add_inplace(b, a)


def test_memory_budget_exceeded_in_cast_rolls_back_the_target():
    """cast() creates the target, then the CPY view; when the view does not fit, the
    target is forgotten again."""
    t = pc.Context(mem_size=368 * 2 + 16)
    a = t.from_numpy(np.ones(4, np.float32))
    assert t.used == 368 + 16
    room = pc.Context(mem_size=368 * 3 + 31)
    b = room.from_numpy(np.ones(4, np.float32))
    with refused(BoundExceeded, r"context memory budget exceeded", t):
        pc.cast(a, "f16")
    with refused(BoundExceeded, r"context memory budget exceeded", room):
        pc.cast(b, "f16")  # the f16 target (368 + 16) fits, the CPY view (368) does not


# ---------------------------------------------------------------- graphs
def test_graph_capacity_exceeded_leaves_graph_unchanged(ctx):
    x = f32(ctx, 2)
    g = pc.Graph(capacity=3)
    short = pc.sqr(pc.sqr(x))
    g.expand(short)
    assert len(g.nodes) == 2 and len(g.leafs) == 1
    chain = short
    for _ in range(3):
        chain = pc.sqr(chain)
    with refused(BoundExceeded, r"graph capacity 3 exceeded: expanding .* needs 5 nodes", ctx, g):
        g.expand(chain)
    assert chain not in g and chain.src[0] not in g  # nothing half-added, not even to the seen set
    g.expand(pc.sqr(short))  # one more node still fits after the refusal
    assert len(g.nodes) == 3


def test_graph_capacity_exceeded_by_leafs(ctx):
    leaves = [f32(ctx, 2) for _ in range(4)]
    total = leaves[0]
    for leaf in leaves[1:]:
        total = pc.add(total, leaf)
    g = pc.Graph(capacity=3)
    with refused(BoundExceeded, r"graph capacity 3 exceeded: .* and 4 leafs", ctx, g):
        g.expand(total)
    assert g.nodes == [] and g.leafs == []


def test_graph_bad_arguments(ctx, graph):
    for cap in (0, -1, 2.0, True):
        with pytest.raises(InvalidArgument, match=r"Graph: capacity must be a positive int") as info:
            pc.Graph(cap)
        assert info.type is InvalidArgument
    with refused(InvalidArgument, r"Graph.expand: expected a Tensor, got ndarray", ctx, graph):
        graph.expand(np.ones(3))


# ---------------------------------------------------------------- flags
def test_set_param_on_non_leaf(ctx, graph):
    a = f32(ctx, 2, 2)
    r = pc.add(a, a)
    with refused(InvalidArgument, r"set_param: .* is the result of ADD; only leaf tensors", ctx, graph):
        r.set_param()
    assert r.flags == pc.Flag(0)
    h = ctx.from_numpy(np.ones(2, np.float16))
    with refused(TypeMismatch, r"set_param: .* has type f16; parameters must be f32", ctx, graph):
        h.set_param()
    assert h.flags == pc.Flag(0)


def test_set_loss_on_non_scalar(ctx, graph):
    a = f32(ctx, 2, 2)
    with refused(ShapeMismatch, r"set_loss: .* must be a scalar \(one element\), has ne=\[2, 2, 1, 1\]", ctx, graph):
        a.set_loss()
    h = ctx.from_numpy(np.ones(1, np.float16))
    with refused(TypeMismatch, r"set_loss: .* has type f16; the loss must be f32", ctx, graph):
        h.set_loss()
    assert a.flags == pc.Flag(0) and h.flags == pc.Flag(0)


# ---------------------------------------------------------------- Tensor.set
def test_tensor_set_wrong_shape(ctx, graph):
    a = f32(ctx, 3, 4)
    before = a.numpy()
    with refused(ShapeMismatch, r"set: .* has shape \(3, 4\) \(NumPy order\), got values of shape \(4, 3\)",
                 ctx, graph):
        a.set(np.zeros((4, 3)))
    with refused(ShapeMismatch, r"got values of shape \(4,\)", ctx, graph):
        a.set(np.zeros(4))  # broadcastable in NumPy, but not accepted
    with refused(TypeMismatch, r"set: values must be numeric", ctx, graph):
        a.set([["a"] * 4] * 3)
    np.testing.assert_array_equal(a.numpy(), before)


def test_quantized_tensor_has_no_element_view(ctx, graph):
    q = ctx.new_tensor("q4_0", (32,))
    with refused(Unsupported, r"q4_0 is a block type with no per-element storage; use raw\(\)", ctx, graph):
        q.host()


# ---------------------------------------------------------------- backends and compute
def test_unknown_backend_lists_registered_names():
    with pytest.raises(UnknownBackend, match=r"no backend named 'nope'; registered: .*numpy") as info:
        pc.backend("nope")
    assert info.type is UnknownBackend
    assert isinstance(info.value, LookupError)


def test_compute_on_unknown_backend_computes_nothing(ctx, graph):
    a = f32(ctx, 2, 2)
    r = pc.add(a, a)
    with refused(UnknownBackend, r"no backend named 'nope'", ctx, graph):
        pc.compute(r, "nope")
    assert not r.numpy().any()


class _AddOnly(pc.Backend):
    """A backend object (not registered) with one kernel, written with the public API."""

    name = "addonly_unregistered"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.kernels = {"ADD": self._add}

    def _add(self, n: pc.Tensor) -> None:
        self.calls.append(n.opdef.key)
        a, b = n.src[0], n.src[1]
        n.set(a.numpy() + b.numpy())


def test_strict_compute_without_kernel_leaves_values_untouched(ctx):
    a = f32(ctx, 2, 3)
    s = pc.add(a, a)
    p = pc.mul(s, a)
    g = pc.Graph().expand(p)
    be = _AddOnly()
    with refused(Unsupported, r"backend 'addonly_unregistered' does not support <MUL .*> \(strict mode\)", ctx, g):
        pc.compute(g, be, strict=True)
    assert be.calls == []  # refused before anything ran
    assert not s.numpy().any() and not p.numpy().any()
    # without strict, MUL falls back to the reference backend
    report = pc.compute(g, be)
    assert be.calls == ["ADD"] and report.fell_back == ["MUL"]
    np.testing.assert_array_equal(p.numpy(), 2 * a.numpy() ** 2)


def test_strict_compute_backend_with_no_kernels(ctx):
    class Empty(pc.Backend):
        name = "empty"
        kernels = {}

    a = f32(ctx, 4)
    r = pc.sqrt(a)
    with refused(Unsupported, r"backend 'empty' does not support <SQRT .*>", ctx):
        pc.compute(r, Empty(), strict=True)
    assert not r.numpy().any()


def test_a_backends_reason_reaches_errors_reports_and_conformance(ctx):
    """Backend.why_unsupported: in the strict error, the fallback report, the plan and the
    conformance result; an explanation that raises is reported as such, never propagated."""
    from prism_core.conformance.cases import cases_for
    from prism_core.conformance.runner import UNSUPPORTED, run_case

    class Picky(pc.Backend):
        name = "picky"
        kernels = {"SQRT": lambda n: None}

        def supports(self, node):
            return False

        def why_unsupported(self, node):
            return "odd lengths only"

    class Broken(Picky):
        name = "broken"

        def why_unsupported(self, node):
            raise RuntimeError("boom")

    a = f32(ctx, 4)
    r = pc.sqrt(a)
    with refused(Unsupported, r"backend 'picky' does not support <SQRT .*> \(odd lengths only; strict mode\)", ctx):
        pc.compute(r, Picky(), strict=True)
    assert pc.compute(r, Picky()).fallbacks[0].reason == "not supported: odd lengths only"
    assert pc.plan(pc.Graph().expand(r), Picky()).fallbacks[0].reason == "not supported: odd lengths only"
    assert pc.compute(r, Broken()).fallbacks[0].reason == "not supported: why_unsupported() raised RuntimeError"
    result = run_case(next(iter(cases_for("SQRT"))), Picky())
    assert result.status == UNSUPPORTED and result.message == "does not support SQRT: odd lengths only"


def test_type_refusal_names_the_offending_type(ctx):
    from prism_core.plugin.base import type_refusal

    y = pc.cpy(f32(ctx, 4), ctx.new_tensor(pc.I16, (4,)))
    floats = frozenset({pc.F32, pc.F16})
    assert type_refusal(y, (floats, floats), floats) == "result type I16 (kernel: F16, F32)"
    assert type_refusal(y, (floats, frozenset({pc.I16})), floats | {pc.I16}) == ""
    assert type_refusal(y, (frozenset({pc.F16}),), frozenset({pc.I16})) == "source 0 of type F32 (kernel: F16)"
    assert type_refusal(y, (floats,), frozenset({pc.I16})) == "source 1 of type I16 (kernel: none)"
    if any(b.name == "numba" and b.available for b in pc.backends()):
        z = pc.cpy(f32(ctx, 4), ctx.new_tensor(pc.I16, (4,)))
        assert pc.backend("numba").why_unsupported(z).startswith("result type I16")


@pytest.mark.parametrize("indices", [[0, 5], [-1, 0], [3, 3]], ids=["too-large", "negative", "equal-to-rows"])
def test_get_rows_out_of_range_at_compute(ctx, indices):
    a = f32(ctx, 3, 4)  # 3 rows
    idx = i32(ctx, indices)
    r = pc.get_rows(a, idx)  # shapes are fine; the values are checked at compute time
    g = pc.Graph().expand(r)
    with refused(InvalidArgument, r"GET_ROWS: row index out of range \[0, 3\)", ctx, g):
        pc.compute(g, "numpy")
    assert not r.numpy().any(), "the output was (half-)written before the error"
    np.testing.assert_array_equal(a.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))


def test_budget_message_names_a_named_tensor():
    small = pc.Context(mem_size=1000)
    with refused(BoundExceeded, r"context memory budget exceeded: 'weights' \(f16, ne=\[512, 2, 1, 1\]\)", small):
        small.new_tensor("f16", (512, 2), name="weights")


def test_refused_helper_detects_a_leftover_tensor(ctx, graph):
    """The helper itself: a call that raises *after* admitting a tensor is caught."""
    def leaky():
        ctx.new_tensor("f32", (2,))
        raise InvalidArgument("leaky: fails after creating a tensor")

    with pytest.raises(AssertionError, match="changed the context or the graph"):
        with refused(InvalidArgument, "leaky", ctx, graph):
            leaky()
    with pytest.raises(AssertionError, match="expected exactly InvalidArgument, got ShapeMismatch"):
        with refused(InvalidArgument, "x", ctx, graph):
            raise ShapeMismatch("x")  # a subclass is not enough: the most specific class is asserted


# ---------------------------------------------------------------- hardening (issue 18): each class a PrismError
def _stride0_view(c):
    """A [4, 3] view whose three rows are one row of memory (nb1 = 0)."""
    return pc.view_2d(f32(c, 4), 4, 3, 0)


def _rope_sections(sections):
    def setup(c):
        a, pos = f32(c, 2, 3, 8), i32(c, [0, 1])
        return lambda: pc.rope_ext(a, pos, n_dims=8, sections=sections)
    return setup


HARDENING: list[tuple[str, Setup, type[Exception], str]] = [
    # float params: an int no float holds, a double beyond float32 (the kernels' precision)
    ("scale-int-beyond-float", _one_arg(M34, lambda a: pc.scale(a, 10**400)), InvalidArgument,
     r"SCALE: parameter 's' must be a finite float32, got an int of 1329 bits"),
    ("scale-beyond-float32", _one_arg(M34, lambda a: pc.scale(a, 3.5e38)), InvalidArgument,
     r"SCALE: parameter 's' is 3.5e\+38, beyond float32's range"),
    ("soft_max-scale-beyond-float32", _one_arg(M34, lambda a: pc.soft_max_ext(a, scale=-3.5e38)), InvalidArgument,
     r"SOFT_MAX: parameter 'scale' is -3.5e\+38, beyond float32's range"),
    ("clamp-numpy-float64-beyond-float32", _one_arg(M34, lambda a: pc.clamp(a, -1.0, np.float64(1e39))),
     InvalidArgument, r"CLAMP: parameter 'max' is 1e\+39, beyond float32's range"),
    # tuple params given as something else
    ("reshape-int", _one_arg(M44, lambda a: pc.reshape(a, 16)), InvalidArgument,
     r"RESHAPE: parameter 'ne' must be a sequence of None ints, got 16"),
    ("reshape-str", _one_arg(M44, lambda a: pc.reshape(a, "16")), InvalidArgument,
     r"RESHAPE: parameter 'ne' must be a sequence of ints, got '16'"),
    ("view-nb-int", _one_arg(M44, lambda a: pc.view(a, (4,), 16)), InvalidArgument,
     r"VIEW: parameter 'nb' must be a sequence"),
    ("cont-ne-float", _one_arg(M44, lambda a: pc.cont(a, 16.0)), InvalidArgument,
     r"CONT: parameter 'ne' must be a sequence"),
    ("rope-sections-int", _rope_sections(5), InvalidArgument, r"ROPE: parameter 'sections' must be a sequence"),
    # integer params with no bound of their own: int64, or the op's own range
    ("acc-offset-beyond-int64", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 16, 32, 32, 2**63)),
     InvalidArgument, r"ACC: parameter 'offset' must fit in int64, got 9223372036854775808"),
    ("rope-negative-sections", _rope_sections((-2, 0, 0, 0)), InvalidArgument,
     r"ROPE: parameter 'sections' must be >= 0, got -2"),
    # layouts on which backends would disagree: decided once, in the op table
    ("acc-region-overlaps-itself", _two_args(M44, lambda c: f32(c, 2, 2), lambda a, b: pc.acc(a, b, 0, 32, 32, 0)),
     InvalidArgument, r"ACC: the region \(strides 4/0/32/32\) for b ne=\[2, 2, 1, 1\] overlaps itself"),
    ("set-region-overlaps-itself", _two_args(M44, lambda c: f32(c, 3, 2), lambda a, b: pc.set_2d(a, b, 4, 0)),
     InvalidArgument, r"SET: the region \(strides 4/4/.*\) for b ne=\[2, 3, 1, 1\] overlaps itself"),
    ("inplace-on-stride-0-view", _one_arg(_stride0_view, pc.relu_inplace), InvalidArgument,
     r"RELU: the result is written into .* with strides \[4, 0, 0, 0\] for ne=\[4, 3, 1, 1\], "
     r"whose elements overlap"),
    ("scale-inplace-on-stride-0-view", _one_arg(_stride0_view, lambda v: pc.scale_inplace(v, 2.0)), InvalidArgument,
     r"SCALE: the result is written into .* whose elements overlap"),
    ("cpy-into-stride-0-view", _two_args(M34, _stride0_view, pc.cpy), InvalidArgument,
     r"CPY: the result is written into .* whose elements overlap"),
    # builders that read an argument before the op table does
    ("set_1d-a-not-a-tensor", _one_arg(M34, lambda b: pc.set_1d("x", b, 0)), InvalidArgument,
     r"SET: a must be a Tensor, got str"),
    ("cast-not-a-tensor", lambda c: lambda: pc.cast(0, "f16"), InvalidArgument, r"cast: a must be a Tensor, got int"),
    ("view_1d-ne0-dict", _one_arg(M44, lambda a: pc.view_1d(a, {})), InvalidArgument,
     r"VIEW: ne0 must be an int, got \{\}"),
    ("view_2d-nb1-tuple", _one_arg(M44, lambda a: pc.view_2d(a, 4, 10**400, (4, 3))), InvalidArgument,
     r"VIEW: nb1 must be an int, got \(4, 3\)"),
    ("rope-a-not-a-tensor", lambda c: (lambda pos: lambda: pc.rope_ext(None, pos))(i32(c, [0])), InvalidArgument,
     r"ROPE: a must be a Tensor, got NoneType"),
    ("inplace-not-a-bool", _one_arg(M34, lambda a: pc.norm(a, 1e-5, "MAX")), InvalidArgument,
     r"NORM: inplace must be a bool, got 'MAX'"),
    # parameters whose result ggml leaves undefined: refused for every backend
    ("rope-yarn-beta-zero", lambda c: (lambda a, pos: lambda: pc.rope_ext(a, pos, n_dims=8, ext_factor=0.5,
                                                                          n_ctx_orig=64, beta_fast=-0.0))(
        f32(c, 2, 3, 8), i32(c, [0, 1])), InvalidArgument, r"ROPE: YaRN \(ext_factor=0.5\) needs a finite correction"),
    ("conv_2d-empty-input", _two_args(empty(1, 1, 1, 1), empty(0, 3, 1, 1),
                                      lambda a, b: pc.conv_2d(a, b, 2**31 - 1, 2, 0, 0, 2, 1)), ShapeMismatch,
     r"CONV_2D: the input is empty along dim 0"),
    ("pool_2d-padding-beyond-input", _one_arg(empty(4, 4), lambda a: pc.pool_2d(a, "MAX", 2**31 - 1, 1, 2**31 - 1, 1,
                                                                               2**30, 0)), InvalidArgument,
     r"POOL_2D: padding 1073741824 along dim 0 is larger than the input's 4 elements"),
    # zero extents the op cannot define
    ("cross_entropy-no-classes", _two_args(empty(0, 3), empty(0, 3), pc.cross_entropy_loss), ShapeMismatch,
     r"CROSS_ENTROPY_LOSS: a has no elements \(ne=\[0, 3, 1, 1\]\)"),
    ("cross_entropy-no-rows", _two_args(empty(4, 0), empty(4, 0), pc.cross_entropy_loss), ShapeMismatch,
     r"CROSS_ENTROPY_LOSS: a has no elements"),
]


@pytest.mark.parametrize("setup, cls, match", [c[1:] for c in HARDENING], ids=[c[0] for c in HARDENING])
def test_hardening_refusals(ctx, graph, setup, cls, match):
    call = setup(ctx)
    with refused(cls, match, ctx, graph):
        call()


def test_a_stride_0_view_can_still_be_read(ctx):
    """Only writing into an overlapping layout is refused: reading one broadcasts."""
    v = _stride0_view(ctx)
    y = pc.relu(v)
    pc.compute(y, "numpy")
    np.testing.assert_array_equal(y.numpy(), np.tile(np.arange(4, dtype=np.float32), (3, 1)))


def test_float_params_are_kept_in_float32(ctx):
    """ggml stores float params as float32: every backend computes with the same value."""
    y = pc.scale(f32(ctx, 2), 0.1)
    assert y.params["s"] == float(np.float32(0.1))


@pytest.mark.parametrize("name", ["\udc80", "ok\ud800"], ids=["lone-low-surrogate", "lone-high-surrogate"])
def test_name_with_lone_surrogate(ctx, graph, name):
    with refused(InvalidArgument, r"tensor name .* is not valid Unicode text: surrogates not allowed", ctx, graph):
        ctx.new_tensor("f32", (4,), name=name)
    t = ctx.new_tensor("f32", (4,), name="ok")
    with refused(InvalidArgument, r"not valid Unicode text", ctx, graph):
        t.set_name(name)
    assert t.name == "ok"


@pytest.mark.parametrize("call, match", [
    (lambda g: pc.compute(5), r"compute: expected a Graph or a Tensor, got int"),
    (lambda g: pc.compute("x"), r"compute: expected a Graph or a Tensor, got str"),
    (lambda g: pc.plan([g]), r"plan: expected a Graph or a Tensor, got list"),
    (lambda g: pc.reset(5), r"reset: expected a Graph, got int"),
    (lambda g: pc.compute(g, []), r"compute: backend must be a Backend, a backend name or None, got list"),
    (lambda g: pc.plan(g, {}), r"plan: backend must be a Backend, a backend name or None, got dict"),
    (lambda g: pc.compute(g, 3), r"compute: backend must be .* got int"),
    (lambda g: pc.compute(g, "numpy", strict="no"), r"compute: strict must be a bool, got 'no'"),
    (lambda g: pc.plan(g, "numpy", reuse=0), r"plan: reuse must be a bool, got 0"),
], ids=["compute-int", "compute-str", "plan-list", "reset-int", "compute-unhashable-backend",
        "plan-unhashable-backend", "compute-int-backend", "compute-strict-str", "plan-reuse-int"])
def test_compute_plan_reset_bad_arguments(ctx, graph, call, match):
    with refused(InvalidArgument, match, ctx, graph):
        call(graph)


def test_build_backward_accumulators_not_a_mapping(ctx):
    p = f32(ctx, 3).set_param()
    g = pc.Graph().expand(pc.sum(pc.sqr(p)).set_loss())
    with refused(InvalidArgument, r"build_backward: grad_accs must map tensors to accumulators, got int", ctx, g):
        pc.build_backward(g, 5)
    with refused(InvalidArgument, r"got list", ctx, g):
        pc.build_backward(g, [p])


@pytest.mark.parametrize("make, match", [
    (lambda c, p: {p: p}, r"must be a leaf tensor of its own .* got <leaf"),
    (lambda c, p: {p: pc.sqr(c.new_tensor("f32", (3,)))}, r"must be a leaf tensor of its own .* got <UNARY\(SQR\)|SQR"),
    (lambda c, p: {p: pc.view_1d(c.new_tensor("f32", (6,)), 3, 0)}, r"must be a leaf tensor of its own"),
    (lambda c, p: {p: pc.Context().new_tensor("f32", (3,))}, r"the accumulator of .* belongs to another context"),
], ids=["the-parameter-itself", "a-node", "a-view", "another-context"])
def test_build_backward_malformed_accumulators(ctx, make, match):
    p = f32(ctx, 3).set_param()
    g = pc.Graph().expand(pc.sum(pc.sqr(p)).set_loss())
    accs = make(ctx, p)
    with refused(InvalidArgument, match, ctx, g):
        pc.build_backward(g, accs)


def test_build_backward_one_accumulator_for_two_nodes(ctx):
    p, q = f32(ctx, 3).set_param(), f32(ctx, 3).set_param()
    g = pc.Graph().expand(pc.sum(pc.mul(p, q)).set_loss())
    acc = ctx.new_tensor("f32", (3,))
    with refused(InvalidArgument, r"one accumulator .* is given for several nodes", ctx, g):
        pc.build_backward(g, {p: acc, q: acc})


def test_budget_beyond_what_the_host_can_give():
    big = pc.Context(mem_size=2**62)
    t = big.new_tensor("f32", (2**48,))  # admitted by the budget; memory is allocated on first use
    with pytest.raises(BoundExceeded, match=r"the host cannot allocate its 1125899906842624 bytes"):
        t.numpy()
    assert t._storage is None


def test_empty_tensor_numpy_keeps_its_empty_shape(ctx):
    for ne, shape in [((3, 0), (0, 3)), ((0, 3), (3, 0)), ((2, 1, 0), (0, 1, 2))]:
        t = ctx.new_tensor("f32", ne)
        assert t.numpy().shape == shape and t.numpy().size == 0


@pytest.mark.parametrize("backend", [b.name for b in pc.backends() if b.available and b.name != "numba"])
def test_empty_results_compute_nothing_on_every_backend(ctx, backend):
    """An empty result is computed by no kernel (as ggml's CPU backend skips empty nodes); a
    reduction over empty rows gives ggml's value: sum 0, argmax 0, mean 0/0 = NaN."""
    z = empty(0, 3)(ctx)
    outs = [pc.soft_max(z), pc.norm(z, 1e-5), pc.rms_norm(z, 1e-5), pc.argsort(z),
            pc.repeat_back(empty(4, 0)(ctx), empty(0, 1)(ctx))]
    rows = [pc.sum_rows(z), pc.argmax(z), pc.sum(z), pc.mean(z),
            pc.repeat_back(empty(0, 2)(ctx), empty(3, 2)(ctx))]
    g = pc.Graph()
    for t in outs + rows:
        g.expand(t)
    pc.compute(g, backend)
    assert all(t.numpy().size == 0 for t in outs)
    assert rows[0].numpy().tolist() == [[0.0], [0.0], [0.0]]
    assert rows[1].numpy().tolist() == [0, 0, 0]
    assert rows[2].numpy().tolist() == [0.0]
    assert np.isnan(rows[3].numpy()).all()
    assert rows[4].numpy().tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("backend", [b.name for b in pc.backends() if b.available and b.name in ("csimd", "numba")])
def test_reductions_over_empty_rows_run_on_the_native_backends(ctx, backend):
    """csimd and numba compute these themselves (no node left to the reference): ggml's loops over no
    element leave sum 0, argmax 0 and REPEAT_BACK's zeros, written again on every compute of a plan."""
    z = empty(0, 3)(ctx)
    rows = [pc.sum_rows(z), pc.argmax(z), pc.sum(z), pc.repeat_back(empty(0, 2)(ctx), empty(3, 2)(ctx))]
    g = pc.Graph()
    for t in rows:
        g.expand(t)
    be = pc.backend(backend)
    assert all(be.supports(t) for t in rows), [be.refusal(t) for t in rows]
    p = pc.plan(g, be, strict=True)
    for _ in range(2):
        for t in rows:
            t.host()[...] = 7
        p.compute()
        assert rows[0].numpy().tolist() == [[0.0], [0.0], [0.0]]
        assert rows[1].numpy().tolist() == [0, 0, 0]
        assert rows[2].numpy().tolist() == [0.0] and not np.signbit(rows[2].numpy()).any()
        assert rows[3].numpy().tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("backend", [b.name for b in pc.backends() if b.available and b.name != "numba"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_flash_attention_with_no_keys_gives_zeros(ctx, backend, with_sinks):
    """n_kv = 0: ggml's running sum S stays 0 (or is the sink's 1) and its VKQ accumulator 0, so
    every output is 0 (S_inv = 0 when S == 0)."""
    q = f32(ctx, 1, 2, 8)  # D = 8, n_q = 2, one head
    k, v = empty(8, 0)(ctx), empty(6, 0)(ctx)
    sinks = ctx.from_numpy(np.array([0.5], np.float32)) if with_sinks else None
    y = pc.flash_attn_ext(q, k, v, sinks=sinks)
    pc.compute(y, backend)
    assert y.numpy().shape == (2, 1, 6) and not y.numpy().any()


@pytest.mark.parametrize("values", [[[1, 2], [3]], [[1.0, 2.0, 3.0], [1.0, [2.0], 3.0]]], ids=["ragged", "nested"])
def test_ragged_values_are_refused(ctx, graph, values):
    with refused(InvalidArgument, r"from_numpy: values must form a rectangular numeric array", ctx, graph):
        ctx.from_numpy(values)
    t = f32(ctx, 2, 3)
    with refused(InvalidArgument, r"set: values must form a rectangular numeric array", ctx, graph):
        t.set(values)
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_numpy_of_a_huge_stride_0_view_is_refused_before_allocating():
    big = pc.Context(mem_size=2**40)
    v = pc.view_4d(big.new_tensor("f32", (1,)), 1, 2**20, 2**20, 2**10, 0, 0, 0)  # 4 bytes seen 2**50 times
    with pytest.raises(BoundExceeded, match=r"numpy: the copy of .* needs 4503599627370496 bytes, more than its "
                                            r"context's budget of 1099511627776"):
        v.numpy()
    assert pc.view_2d(big.new_tensor("f32", (4,)), 4, 3, 0).numpy().shape == (3, 4)
