"""The Numba backend: discovery, threads, conformance at one thread and its thread pool, and that it computes
the heavy ops itself (no fallbacks)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import one_per_op_and_family

import prism_core as pc
from prism_core.conformance.cases import all_cases, case_id
from prism_core.conformance.gradcheck import grad_cases
from prism_core.settings import requested_threads

pytest.importorskip("numba")

NUMBA_THREADS_SNIPPET = "import prism_core as pc; print('threads', pc.backend('numba').threads)"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PRISM_BACKEND", None)
    env.update(extra)
    return env


def test_discovered_via_entry_point_and_available():
    info = next((i for i in pc.backends() if i.name == "numba"), None)
    assert info is not None, [i.name for i in pc.backends()]
    assert info.available, info.reason
    assert info.plugin.startswith("numba (prism_numba")  # loaded from the entry point, not registered in-process
    import numba
    assert numba.__version__ in info.version
    assert info.priority == 50
    be = pc.backend("numba")
    assert not be.is_reference and be.threads >= 1


def test_thread_count_from_environment():
    r = subprocess.run([sys.executable, "-c", NUMBA_THREADS_SNIPPET], env=_env(PRISM_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["threads", "1"]


def test_a_second_module_name_is_refused():
    """From the repository root the files also import as backends.prism_numba; numba's cache names a kernel's
    entries after its file, and an entry imports its module by the name it was compiled under, so that name
    would load (or overwrite) prism_numba's entries: refused at import, saying which name to use."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", "import backends.prism_numba"], cwd=root, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "ImportError: import prism_numba, not backends.prism_numba" in r.stderr, r.stderr


@pytest.mark.parametrize("var,value", [("PRISM_NUM_THREADS", "zero"), ("PRISM_NUM_THREADS", "0"),
                                       ("PRISM_NUMBA_SERIAL_WORK", "-1")])
def test_invalid_thread_settings_make_backend_unavailable_with_reason(var, value):
    code = ("import prism_core as pc; i = next(i for i in pc.backends() if i.name == 'numba'); "
            "print(i.available, i.reason)")
    r = subprocess.run([sys.executable, "-c", code], env=_env(**{var: value}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False") and var in r.stdout


@pytest.mark.parametrize("mode", ["forward", "grad"])
@pytest.mark.slow
def test_conformance_has_no_failures_at_one_thread(mode):
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "numba", "--mode", mode],
                       env=_env(PRISM_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = next(line for line in r.stdout.splitlines() if line.startswith("numba:"))
    assert " 0 failed" in summary, summary


_THREADED_RUN = """
import sys
import prism_core as pc
from prism_core.conformance.cases import all_cases, case_id
from prism_core.conformance.gradcheck import grad_cases
from prism_core.conformance.runner import FAIL, run, run_grad
grad, ids = sys.argv[1] == "grad", set(sys.argv[2:])
cases = [c for c in (grad_cases() if grad else all_cases()) if case_id(c) in ids]
be = pc.backend("numba")
results = (run_grad if grad else run)(be, cases)
print("threads", be.threads, "cases", len(results), "passed", sum(r.status == "pass" for r in results))
print("\\n".join(r.describe() for r in results if r.status == FAIL))
"""


@pytest.mark.parametrize("mode", ["forward", "grad"])
@pytest.mark.slow
def test_every_node_parallel_at_two_threads(mode):
    """Every node through numba's thread pool (PRISM_NUMBA_SERIAL_WORK=0: the kernels compiled with ``parallel``,
    their prange loops split between 2 threads): each op's first case, and its first case on a block type (the
    quantized kernels), not all 1,844 forward cases. The split is the kernels' loop structure, written once per
    kernel whatever the types and layouts a signature compiles it for; every case runs at one thread above
    (the same source compiled serially). A full sweep here compiled the parallel form of every signature the
    cases reach (f16, bf16, i32, permuted and row-gapped layouts: 92 s on 2 quiet cores in CI, the most of any
    numba test); this subset compiles about one per kernel (57 from a cold cache)."""
    cases = all_cases() if mode == "forward" else grad_cases()
    ids = [case_id(c) for c in one_per_op_and_family(cases)]
    r = subprocess.run([sys.executable, "-c", _THREADED_RUN, mode, *ids], capture_output=True, text=True, timeout=900,
                       env=_env(PRISM_NUM_THREADS="2", PRISM_NUMBA_SERIAL_WORK="0"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    head, *failures = r.stdout.splitlines()
    assert head.split()[:4] == ["threads", "2", "cases", str(len(ids))], head
    assert not [f for f in failures if f.strip()], "\n".join(failures[:20])
    assert int(head.split()[-1]) > len(ids) // 2, head  # most pass outright (the rest: unsupported, said openly)


def _heavy_graph(ctx: pc.Context, rng: np.random.Generator) -> pc.Tensor:
    w = ctx.from_numpy(rng.standard_normal((48, 96)).astype(np.float32))  # 48 rows of K=96
    x = ctx.from_numpy(rng.standard_normal((2, 3, 70, 96)).astype(np.float32))  # batched, N=70
    bias = ctx.from_numpy(rng.standard_normal(48).astype(np.float32))
    h = pc.add(pc.rms_norm(pc.mul_mat(w, x), eps=1e-6), bias)  # [48, 70, 3, 2] in ggml order
    return pc.soft_max_ext(h, scale=0.5)


def test_heavy_ops_are_computed_by_numba_itself():
    be = pc.backend("numba")
    ctx = pc.Context()
    out = _heavy_graph(ctx, np.random.default_rng(1))
    graph = pc.Graph().expand(out)
    keys = {n.opdef.key for n in graph.nodes if n.opdef is not None and not n.opdef.view_only}
    assert keys == {"MUL_MAT", "RMS_NORM", "ADD", "SOFT_MAX"}
    for n in graph.nodes:
        if n.opdef is not None and not n.opdef.view_only:
            assert be.supports(n), n.label
    report = pc.compute(graph, "numba")
    assert report.fallbacks == [] and report.computed == 4

    ref_ctx = pc.Context()
    ref = _heavy_graph(ref_ctx, np.random.default_rng(1))
    pc.compute(ref, "numpy")
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-6)


def test_unsupported_nodes_fall_back_openly():
    be = pc.backend("numba")
    ctx = pc.Context()
    base = ctx.from_numpy(np.arange(8, dtype=np.float32))

    def overlapping():  # in place into the first half, reading the second half of the same buffer
        return pc.add_inplace(pc.view_1d(base, 4, 0), pc.view_1d(base, 4, 16))
    y = overlapping()  # numba reads and writes element by element: only an exact in-place view may share memory
    assert not be.supports(y)
    report = pc.compute(y, "numba")
    assert report.fell_back == ["ADD"]
    assert "shares the result's memory other than as the same view" in report.fallbacks[0].reason
    np.testing.assert_array_equal(y.numpy(), [4, 6, 8, 10])
    with pytest.raises(pc.Unsupported, match="does not support"):
        pc.compute(overlapping(), "numba", strict=True)


def test_supports_checks_every_source_type():
    be = pc.backend("numba")
    ctx = pc.Context()
    a16 = ctx.new_tensor(pc.F16, (8, 4))
    b32 = ctx.new_tensor(pc.F32, (8, 3))
    a32 = ctx.new_tensor(pc.F32, (8, 4))
    assert be.supports(pc.mul_mat(a32, b32))
    assert be.supports(pc.mul_mat(a16, b32))  # F16 weights are converted while packed
    assert be.supports(pc.add(a16, a32)) and be.supports(pc.add(a32, a16))
    i32 = ctx.new_tensor(pc.I32, (8, 4))
    assert be.supports(pc.cont(i32))  # bit-for-bit integer copy
    assert be.supports(pc.cpy(a32, ctx.new_tensor(pc.I32, (8, 4))))  # truncated as the reference
    assert not be.supports(pc.cpy(a32, ctx.new_tensor(pc.I16, (8, 4))))  # no I16 kernel
    empty = ctx.new_tensor(pc.F32, (0, 4))
    assert not be.supports(pc.add(empty, empty))  # nothing to compute: left to the reference


def test_threads_do_not_change_results():
    import numba
    be = pc.backend("numba")
    results = []
    for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        os.environ["PRISM_NUM_THREADS"] = str(n)
        os.environ["PRISM_NUMBA_SERIAL_WORK"] = "0"  # every node through the thread pool
        try:
            ctx = pc.Context()
            out = _heavy_graph(ctx, np.random.default_rng(2))
            pc.compute(out, be)
            # the setting took; the threads used may be fewer while other processes keep the cores busy
            # (prism_core.contention), which is exactly what must not move a value
            assert requested_threads() == n and 1 <= be.threads <= n
            results.append(out.numpy())
        finally:
            del os.environ["PRISM_NUM_THREADS"], os.environ["PRISM_NUMBA_SERIAL_WORK"]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_in_place_ops_run_on_numba_but_partial_aliasing_falls_back():
    be = pc.backend("numba")
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert be.supports(pc.scale_inplace(a, 2.0)) and be.supports(pc.add_inplace(a, a))
    row0 = pc.view_1d(a, 4)  # a's first row, which add_inplace overwrites before rows 1 and 2 read it
    y = pc.add_inplace(a, row0)
    assert not be.supports(y)
    report = pc.compute(y, "numba")
    assert report.fell_back == ["ADD"]
    np.testing.assert_array_equal(y.numpy(), np.arange(12).reshape(3, 4) + np.arange(4))


@pytest.mark.parametrize("t", [pc.F16, pc.BF16])
def test_half_types_round_like_the_reference_bit_for_bit(t):
    rng = np.random.default_rng(3)
    vals = np.concatenate([rng.standard_normal(521) * 10.0 ** rng.integers(-6, 5, 521),
                           [0.0, -0.0, 65504.0, 7e4, 1e-8, -3e-5, 0.5]]).astype(np.float32)

    def build(ctx):
        a = ctx.from_numpy(vals.reshape(-1, 11), t)
        b = ctx.from_numpy(vals[:11][::-1].copy(), pc.F32)
        return [pc.scale_bias(a, 0.7, 0.1), pc.add(a, b), pc.gelu(a), pc.cpy(b, ctx.new_tensor(t, (11,))),
                pc.sum_rows(a)]

    outs = {}
    for name in ("numba", "numpy"):
        ctx = pc.Context()
        nodes = build(ctx)
        g = pc.Graph()
        for n in nodes:
            g.expand(n)
        report = pc.compute(g, name)
        assert report.fallbacks == []
        outs[name] = [n.host().copy() for n in nodes]
    for got, ref in zip(outs["numba"], outs["numpy"]):
        np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))


def test_concurrent_computes_from_python_threads():
    from concurrent.futures import ThreadPoolExecutor

    def one(seed):
        ctx = pc.Context()
        out = _heavy_graph(ctx, np.random.default_rng(seed))
        pc.compute(out, "numba")
        return out.numpy()

    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(one, range(8)))
    for seed, g in enumerate(got):
        np.testing.assert_array_equal(g, one(seed))


def test_missing_numba_leaves_the_backend_listed_as_unavailable(tmp_path):
    fake = tmp_path / "numba"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('numba is not installed here')\n")
    code = ("import numpy as np, prism_core as pc\n"
            "i = next(i for i in pc.backends() if i.name == 'numba')\n"
            "print(i.available, '|', i.reason)\n"
            "print(pc.backend().name, pc.broken_plugins())\n")
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    r = subprocess.run([sys.executable, "-c", code], env=_env(PYTHONPATH=os.pathsep.join(paths)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "False | numba cannot be imported: ImportError: numba is not installed here"
    default, broken = second.split(" ", 1)
    assert default != "numba" and broken == "[]", second  # the next available backend (numpy, or csimd if built)


def test_kernel_coverage_of_the_op_table():
    be = pc.backend("numba")
    required = {"ADD", "SUB", "MUL", "DIV", "SCALE", "SQR", "SQRT", "LOG", "SIN", "COS", "LEAKY_RELU", "CLAMP",
                "SILU_BACK", "SUM_ROWS", "MEAN", "NORM", "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX", "SOFT_MAX_BACK",
                "MUL_MAT", "OUT_PROD", "GET_ROWS", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "CROSS_ENTROPY_LOSS",
                "CROSS_ENTROPY_LOSS_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD", "CPY", "CONT", "DUP"}
    required |= {u.name for u in pc.UnaryOp}
    assert required <= set(be.kernels), sorted(required - set(be.kernels))
    assert set(be.kernels) <= set(pc.OPS), sorted(set(be.kernels) - set(pc.OPS))


WARM_START_SNIPPET = """
import time
t0 = time.perf_counter()
import numpy as np
import prism_core as pc
from prism_numba.warmup import _mlp_step
g = _mlp_step(np.random.default_rng(3))
plan = pc.plan(g, "numba")
plan.compute()
print("fallbacks", len(pc.compute(g, "numba").fallbacks))
print("seconds", time.perf_counter() - t0)
"""


def test_warm_up_then_second_process_computes_an_mlp_step():
    """warm_up() compiles (or loads) the common kernels strictly (no fallbacks); a second
    process with the warm cache imports, plans and computes an MLP training step. The
    time is printed, not asserted (the machine is shared)."""
    code = "import prism_numba; r = prism_numba.warm_up(); print('kernels', int(r['kernels']))"
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert int(r.stdout.split()[-1]) > 10
    r = subprocess.run([sys.executable, "-c", WARM_START_SNIPPET], env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = dict(line.split() for line in r.stdout.splitlines())
    assert out["fallbacks"] == "0"
    print(f"warm second-process start-up: {float(out['seconds']):.2f} s")


def _conv_pool_attn_graph(ctx: pc.Context, rng: np.random.Generator) -> list[pc.Tensor]:
    img = ctx.from_numpy(rng.standard_normal((2, 3, 9, 10)).astype(np.float32))  # [W=10, H=9, C=3, N=2]
    ker = ctx.from_numpy(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))  # [KW, KH, IC=3, OC=4]
    q = ctx.from_numpy(rng.standard_normal((1, 4, 5, 8)).astype(np.float32))  # [D=8, n_q=5, H=4, B=1]
    kv = ctx.from_numpy(rng.standard_normal((1, 2, 7, 8)).astype(np.float16))  # GQA: 2 kv heads
    pos = ctx.from_numpy(np.arange(4, dtype=np.int32))  # rope: ne2 = 4 tokens
    return [pc.conv_2d(ker, img, p0=1, p1=1), pc.im2col(ker, img, 1, 1, 1, 1, 1, 1),
            pc.pool_2d(img, "MAX", 2, 2, 2, 2), pc.upscale(img, 2, "BILINEAR"),
            pc.flash_attn_ext(q, kv, kv, scale=0.3), pc.rope_ext(q, pos, n_dims=8, mode=2)]


def test_new_heavy_ops_are_computed_by_numba_itself():
    outs = _conv_pool_attn_graph(pc.Context(), np.random.default_rng(2))
    refs = _conv_pool_attn_graph(pc.Context(), np.random.default_rng(2))
    be = pc.backend("numba")
    for out, ref in zip(outs, refs):
        assert be.supports(out), out.label
        report = pc.compute(out, "numba", strict=True)
        assert report.fallbacks == []
        pc.compute(ref, "numpy")
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)


def test_float_to_int_copies_truncate_as_the_reference():
    """F32/F16 -> I32 truncates toward zero; NaN and out-of-range give INT32_MIN (NumPy on x86)."""
    f = np.array([2.7, -2.7, 0.5, -0.5, 1e9, -1e9, 3e9, -3e9, np.nan, np.inf, -np.inf, 16777217.0], np.float32)
    expect = np.array([2, -2, 0, 0, 10**9, -10**9] + [-2**31] * 5 + [16777216], np.int32)
    for t in (pc.F32, pc.F16):
        with np.errstate(over="ignore"):  # 1e9, 3e9 become F16 infinities: INT32_MIN as well
            vals = f if t == pc.F32 else f.astype(np.float16)
        ctx = pc.Context()
        src = ctx.new_tensor(t, (12,))
        src.set(vals)
        y = pc.cpy(src, ctx.new_tensor(pc.I32, (12,)))
        pc.compute(y, "numba", strict=True)
        ref = np.trunc(vals.astype(np.float64))
        want = expect if t == pc.F32 else np.where(np.isfinite(ref) & (np.abs(ref) < 2**31), ref, -2**31)
        np.testing.assert_array_equal(y.numpy(), want.astype(np.int32))
