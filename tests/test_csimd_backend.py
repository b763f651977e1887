"""The csimd backend (C kernels in csrc/, cffi API mode): discovery, the unavailable path,
conformance on every ISA path this CPU runs, no fallbacks for the hot ops, numerics of
mul_mat against NumPy, Python-side view validation, and a sanitizer (ASan+UBSan) run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from csimd_builds import sanitized_build

import prism_core as pc

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses start in tests/, not the repository root: a stale prism_tensor.egg-info left in the
# root by an old build would otherwise shadow the installed entry points (the current directory
# comes first on sys.path for `python -c` and `python -m`).
RUN_DIR = str(Path(__file__).resolve().parent)
ISAS = ("scalar", "avx2", "avx512", "avxvnni", "neon", "dotprod", "i8mm")  # CSIMD_ISA_* order


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("PRISM_BACKEND", "PRISM_CSIMD_ISA", "PRISM_CSIMD_LIBRARY"):
        env.pop(k, None)
    env.update(extra)
    return env


def _info():
    return next((i for i in pc.backends() if i.name == "csimd"), None)


def _need_available():
    info = _info()
    assert info is not None, [i.name for i in pc.backends()]
    if not info.available:
        pytest.skip(f"csimd unavailable here: {info.reason}")
    return pc.backend("csimd")


def _cpu_isas() -> list[str]:
    _need_available()
    from prism_csimd import kernels
    return [n for i, n in enumerate(ISAS) if kernels._state["lib"].csimd_isa_runs(i)]


def test_discovered_via_entry_point():
    info = _info()
    assert info is not None, [i.name for i in pc.backends()]
    assert info.plugin.startswith("csimd (prism_csimd")  # from the entry point, not registered in-process
    assert info.priority == 60
    if info.available:
        assert info.version.split("+")[-1] in ISAS  # the active path, shown by prism info
        assert pc.backend("csimd").threads >= 1
    else:
        assert info.reason  # unavailable always says why


@pytest.mark.parametrize("env,needle", [
    ({"PRISM_CSIMD_ISA": "bogus"}, "PRISM_CSIMD_ISA='bogus' is not one of"),
    ({"PRISM_CSIMD_LIBRARY": "/nonexistent/_csimd.so"}, "prism_csimd._csimd is not available"),
    ({"PRISM_NUM_THREADS": "zero"}, "PRISM_NUM_THREADS"),
], ids=["bad-isa", "module-missing", "bad-threads"])
def test_unavailable_with_reason_does_not_break_other_backends(env, needle):
    code = ("import prism_core as pc\n"
            "i = next(i for i in pc.backends() if i.name == 'csimd')\n"
            "print('AVAILABLE', i.available)\nprint('REASON', i.reason)\n"
            "n = next(i for i in pc.backends() if i.name == 'numpy')\nprint('NUMPY', n.available)\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(**env), cwd=RUN_DIR, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "AVAILABLE False" in r.stdout and needle in r.stdout and "NUMPY True" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "numpy", "--op", "ADD",
                        "-q"], env=_env(**env), cwd=RUN_DIR, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "info"], env=_env(**env),
                       cwd=RUN_DIR, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "UNAVAILABLE" in r.stdout, r.stdout + r.stderr


def test_availability_follows_the_environment_between_calls(monkeypatch):
    """availability() keeps its answer between calls but sets the backend up again when a variable it reads
    changes, or when the C side's path was moved under it (a bad value after a good one is refused too)."""
    be = _need_available()
    from prism_csimd import kernels
    lib = kernels._state["lib"]
    have = _cpu_isas()
    for name in [have[-1], have[0], *have[1:]]:
        monkeypatch.setenv("PRISM_CSIMD_ISA", name)
        assert be.availability() == (True, "") and kernels._state["isa"] == name
        assert lib.csimd_get_isa() == ISAS.index(name) and be.version.endswith("+" + name)
    lib.csimd_set_isa(ISAS.index("scalar") if have[-1] != "scalar" else 0)  # moved directly, env unchanged
    assert be.availability()[0] and lib.csimd_get_isa() == ISAS.index(have[-1])
    for n in ("1", "3"):
        monkeypatch.setenv("PRISM_NUM_THREADS", n)
        assert be.threads == (int(n) if lib.csimd_has_openmp() else 1)
    monkeypatch.setenv("PRISM_NUM_THREADS", "zero")
    ok, reason = be.availability()
    assert not ok and "PRISM_NUM_THREADS" in reason
    monkeypatch.delenv("PRISM_NUM_THREADS")
    monkeypatch.delenv("PRISM_CSIMD_ISA")
    assert be.availability() == (True, "") and kernels._state["isa"] == ISAS[lib.csimd_cpu_isa()]


def test_a_path_the_cpu_does_not_run_is_refused():
    have = _cpu_isas()
    if len(have) == len(ISAS):
        pytest.skip("this CPU runs every path")
    code = ("import prism_core as pc; i = next(i for i in pc.backends() if i.name == 'csimd'); "
            "print(i.available, i.reason)")
    missing = next(n for n in ISAS if n not in have)
    r = subprocess.run([sys.executable, "-c", code], env=_env(PRISM_CSIMD_ISA=missing), cwd=RUN_DIR,
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("False") and "asks for a path this CPU does not run" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode", ["forward", "grad"])
@pytest.mark.parametrize("isa", ISAS)
def test_conformance_on_every_isa_path(isa, mode):
    if isa not in _cpu_isas():
        pytest.skip(f"this CPU cannot run the {isa} path")
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "csimd", "--mode", mode],
                       env=_env(PRISM_CSIMD_ISA=isa), cwd=RUN_DIR, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = next(line for line in r.stdout.splitlines() if line.startswith("csimd:"))
    assert " 0 failed" in summary and " 0 timed out" in summary, summary
    info = subprocess.run([sys.executable, "-m", "prism_core.cli", "info"], env=_env(PRISM_CSIMD_ISA=isa),
                          cwd=RUN_DIR, capture_output=True, text=True, timeout=120).stdout
    assert f"+{isa}" in next(line for line in info.splitlines() if line.strip().startswith("csimd")), info


def test_random_cases_on_the_default_path():
    _need_available()
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "csimd", "--random", "30",
                        "--seed", "11", "-q"], env=_env(), cwd=RUN_DIR, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def _heavy_graph(ctx: pc.Context, rng: np.random.Generator) -> pc.Tensor:
    w = ctx.from_numpy(rng.standard_normal((48, 96)).astype(np.float32))
    x = ctx.from_numpy(rng.standard_normal((2, 3, 70, 96)).astype(np.float32))
    bias = ctx.from_numpy(rng.standard_normal(48).astype(np.float32))
    h = pc.add(pc.rms_norm(pc.mul_mat(w, x), eps=1e-6), bias)
    return pc.soft_max_ext(h, scale=0.5)


def test_hot_ops_are_computed_by_csimd_itself():
    be = _need_available()
    ctx = pc.Context()
    out = _heavy_graph(ctx, np.random.default_rng(1))
    graph = pc.Graph().expand(out)
    keys = {n.opdef.key for n in graph.nodes if n.opdef is not None and not n.opdef.view_only}
    assert keys == {"MUL_MAT", "RMS_NORM", "ADD", "SOFT_MAX"}
    for n in graph.nodes:
        if n.opdef is not None and not n.opdef.view_only:
            assert be.supports(n), n.label
    report = pc.compute(graph, "csimd", strict=True)
    assert report.fallbacks == [] and report.computed == 4
    ref = _heavy_graph(pc.Context(), np.random.default_rng(1))
    pc.compute(ref, "numpy")
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (3, 77, 45), (1, 2048, 64), (7, 13, 5), (37, 300, 70), (129, 517, 33),
                                   (64, 256, 512), (2, 35, 10), (4, 2051, 7), (3, 64, 4), (33, 1000, 67),
                                   (64, 300, 1000)])
def test_mul_mat_matches_numpy(n, k, m):
    _need_available()
    rng = np.random.default_rng(n * 1000 + k + m)
    a = rng.standard_normal((m, k)).astype(np.float32)  # ggml a: [k, m]
    b = rng.standard_normal((n, k)).astype(np.float32)  # ggml b: [k, n]
    ctx = pc.Context()
    y = pc.mul_mat(ctx.from_numpy(a), ctx.from_numpy(b))
    pc.compute(y, "csimd", strict=True)
    ref = b.astype(np.float64) @ a.astype(np.float64).T
    np.testing.assert_allclose(y.numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("n,k,m,half", [(500, 64, 10, ""), (300, 40, 3, "a"), (70, 33, 20, "a"), (9, 100, 40, "ab"),
                                        (200, 31, 1, ""), (3, 50, 70, "b"), (90, 20, 5, "b"), (100, 70, 90, "ab")])
def test_mul_mat_narrow_a_and_half_operands_match_numpy(n, k, m, half):
    """a with fewer rows than the micro-tile is wide (operands swapped, result written transposed);
    F16 operands ("a", "b" or both) are converted exactly while packed; an F32 b meeting an F16 a is
    rounded to F16 first (ggml's CPU converts b to the weight's vec_dot_type)."""
    _need_available()
    rng = np.random.default_rng(n + k + m)
    a = rng.standard_normal((m, k)).astype(np.float16 if "a" in half else np.float32)
    b = rng.standard_normal((n, k)).astype(np.float16 if "b" in half else np.float32)
    ctx = pc.Context()
    ta, tb = (_half_or_plain(ctx, x) for x in (a, b))
    y = pc.mul_mat(ta, tb)
    pc.compute(y, "csimd", strict=True)
    b_seen = b.astype(np.float16) if half == "a" else b
    ref = b_seen.astype(np.float64) @ a.astype(np.float64).T
    np.testing.assert_allclose(y.numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def _half_or_plain(ctx, x):
    if x.dtype != np.float16:
        return ctx.from_numpy(x)
    t = ctx.new_tensor(pc.F16, x.shape[::-1])
    t.set(x)
    return t


@pytest.mark.parametrize("m,n,k,half", [(784, 500, 32, ""), (500, 10, 500, ""), (10, 300, 50, ""), (37, 5, 19, "a"),
                                        (3, 70, 8, "a"), (130, 66, 257, ""), (40, 9, 30, "b"), (50, 80, 20, "ab")])
def test_out_prod_matches_numpy(m, n, k, half):
    """out_prod(a [m, k], b [n, k]) = b^T a in NumPy order: both operands are read transposed."""
    _need_available()
    rng = np.random.default_rng(m * 7 + n + k)
    a = rng.standard_normal((k, m)).astype(np.float16 if "a" in half else np.float32)
    b = rng.standard_normal((k, n)).astype(np.float16 if "b" in half else np.float32)
    ctx = pc.Context()
    y = pc.out_prod(_half_or_plain(ctx, a), _half_or_plain(ctx, b))
    pc.compute(y, "csimd", strict=True)
    ref = b.astype(np.float64).T @ a.astype(np.float64)
    np.testing.assert_allclose(y.numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_mul_mat_batch_broadcast_and_transposed_input():
    _need_available()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 1, 9, 40)).astype(np.float32)  # ne [40, 9, 1, 2]
    b = rng.standard_normal((2, 3, 11, 40)).astype(np.float32)
    ctx = pc.Context()
    bt = pc.transpose(ctx.from_numpy(np.ascontiguousarray(np.swapaxes(b, -1, -2))))  # a permuted view of b
    y = pc.mul_mat(ctx.from_numpy(a), bt)
    pc.compute(y, "csimd", strict=True)
    ref = b.astype(np.float64) @ np.swapaxes(np.repeat(a, 3, axis=1), -1, -2)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_threads_do_not_change_results():
    be = _need_available()
    results = []
    for n in ("1", "2"):
        os.environ["PRISM_NUM_THREADS"] = n
        os.environ["PRISM_CSIMD_SERIAL_WORK"] = "0"
        try:
            out = _heavy_graph(pc.Context(), np.random.default_rng(2))
            pc.compute(out, be, strict=True)
            assert be.threads == int(n)
            results.append(out.numpy())
        finally:
            del os.environ["PRISM_NUM_THREADS"], os.environ["PRISM_CSIMD_SERIAL_WORK"]
    np.testing.assert_array_equal(results[0], results[1])


_GEMM_PATHS_SCRIPT = r"""
import os, sys
import numpy as np
import prism_core as pc
rng = np.random.default_rng(7)

def run(build, threads):
    os.environ["PRISM_NUM_THREADS"], os.environ["PRISM_CSIMD_SERIAL_WORK"] = str(threads), "0"
    ctx = pc.Context(mem_size=1 << 28)
    y = build(ctx)
    pc.compute(y, "csimd", strict=True)
    return y.numpy()

def half(ctx, x):
    t = ctx.new_tensor(pc.F16, x.shape[::-1])
    t.set(x)
    return t

cases = []
# (n, k, m) of mul_mat(a [k, m], b [k, n]): K in several cache blocks, M and N off the micro-tile,
# M split unevenly between 3 threads, N beyond one shared block of packed b (a 32 MiB L3), F16 a
for n, k, m, f16 in [(130, 1000, 200, 0), (97, 64, 1037, 0), (7100, 300, 40, 0), (100, 500, 300, 1)]:
    a = rng.standard_normal((m, k)).astype(np.float16 if f16 else np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    b_seen = b.astype(np.float16) if f16 else b  # an F16 a's product takes b rounded to F16 (ggml's CPU)
    ref = b_seen.astype(np.float64) @ a.astype(np.float64).T
    cases.append((f"mul_mat {n}x{k}x{m}", lambda c, a=a, b=b, f16=f16: pc.mul_mat(
        half(c, a) if f16 else c.from_numpy(a), c.from_numpy(b)), ref, k))
# out_prod(a [m, k], b [n, k]) = b^T a: both operands packed from transposed rows
a = rng.standard_normal((700, 300)).astype(np.float32)
b = rng.standard_normal((700, 200)).astype(np.float32)
cases.append(("out_prod 300x200x700", lambda c: pc.out_prod(c.from_numpy(a), c.from_numpy(b)),
              b.astype(np.float64).T @ a.astype(np.float64), 700))
for name, build, ref, k in cases:
    outs = [run(build, t).reshape(ref.shape) for t in (1, 2, 3)]
    np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4 * np.sqrt(k), err_msg=name)
    for o in outs[1:]:  # each thread owns whole output elements: the same sums in the same order
        np.testing.assert_array_equal(o, outs[0], err_msg=name)
print("ok", len(cases))
"""


@pytest.mark.parametrize("isa", ISAS)
def test_gemm_blocks_edges_and_threads_on_every_isa_path(isa):
    """The cache-blocked GEMM on each ISA path against float64 NumPy, on shapes that cross its
    K blocks, micro-tile edges and thread splits, and bit-identical at 1, 2 and 3 threads."""
    if isa not in _cpu_isas():
        pytest.skip(f"this CPU cannot run the {isa} path")
    r = subprocess.run([sys.executable, "-c", _GEMM_PATHS_SCRIPT], env=_env(PRISM_CSIMD_ISA=isa), cwd=RUN_DIR,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip() == "ok 5", r.stdout[-4000:] + r.stderr[-4000:]


def test_unsupported_nodes_fall_back_openly():
    be = _need_available()
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    row0 = pc.view_1d(a, 4)
    y = pc.add_inplace(a, row0)  # a source partially aliasing the result: the reference's
    assert not be.supports(y)
    report = pc.compute(y, "csimd")
    assert report.fell_back == ["ADD"]
    assert "shares the result's memory other than as the same view" in report.fallbacks[0].reason
    ctx2 = pc.Context()
    b = ctx2.from_numpy(np.ones((2, 3), np.float32))
    z = pc.cpy(b, ctx2.new_tensor(pc.I16, (3, 2)))  # the op table accepts I16, the C kernels do not
    assert not be.supports(z) and be.why_unsupported(z).startswith("result type I16")


@pytest.mark.parametrize("t", [pc.F16, pc.BF16])
def test_half_conversions_round_like_the_reference_bit_for_bit(t):
    _need_available()
    rng = np.random.default_rng(3)
    vals = np.concatenate([rng.standard_normal(527) * 10.0 ** rng.integers(-9, 6, 527),
                           [0.0, -0.0, 65504.0, 65519.0, 65520.0, 7e4, 1e-8, 6e-8, -3e-5, 0.5, np.inf, -np.inf]])
    vals = vals.astype(np.float32)

    def build(ctx):
        a = ctx.from_numpy(vals.reshape(-1, 11), t)
        f = ctx.from_numpy(vals.reshape(-1, 11), pc.F32)
        rows = len(vals) // 11
        return [pc.cpy(f, ctx.new_tensor(t, (11, rows))), pc.cpy(a, ctx.new_tensor(pc.F32, (11, rows))),
                pc.scale_bias(a, 0.7, 0.1), pc.get_rows(a, ctx.from_numpy(np.array([3, 0, 5], np.int32)))]

    outs = {}
    for name in ("csimd", "numpy"):
        ctx = pc.Context()
        nodes = build(ctx)
        g = pc.Graph()
        for n in nodes:
            g.expand(n)
        report = pc.compute(g, name, strict=name == "csimd")
        assert report.fallbacks == []
        outs[name] = [n.host().copy() for n in nodes]
    for got, ref in zip(outs["csimd"], outs["numpy"]):
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_views_outside_their_buffer_are_refused_before_any_call():
    _need_available()
    from prism_csimd import kernels

    ctx = pc.Context()
    t = ctx.new_tensor(pc.F32, (8, 4))
    kernels.check_view(t)  # fine
    storage = t.storage()
    fake = SimpleNamespace(type=pc.F32, traits=t.traits, ne=(8, 5, 1, 1), nb=(4, 32, 160, 160), view_offs=0,
                           storage=lambda: storage, label="fake")
    with pytest.raises(pc.errors.InvalidArgument, match="exceeds its buffer"):
        kernels.check_view(fake)
    fake.ne, fake.view_offs = (8, 4, 1, 1), 2
    with pytest.raises(pc.errors.InvalidArgument, match="not aligned"):
        kernels.check_view(fake)
    fake.view_offs, fake.nb = 0, (4, -32, 128, 128)
    with pytest.raises(pc.errors.InvalidArgument, match="negative"):
        kernels.check_view(fake)


@pytest.mark.slow
def test_sanitized_build_runs_conformance_clean(tmp_path_factory):
    """The whole conformance suite with the module built with -fsanitize=address,undefined and the runtimes
    preloaded (csrc/README.md): forward on every ISA path this CPU runs, gradients on the best one. Every op has
    forward cases (test_conformance.py), so the forward suite reaches every kernel of every path; a gradient case
    computes its graphs from those same kernels (on the shapes of a backward pass), which the best path, the one
    an install takes, runs under the sanitizers (once per path, it repeated those kernels at a sanitized build's
    speed)."""
    _need_available()
    lib, rt = sanitized_build(tmp_path_factory)  # built once, shared with test_quant_chunk.py
    lib = str(lib)
    env = _env(LD_PRELOAD=" ".join(rt), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", PRISM_CSIMD_LIBRARY=lib)
    probe = subprocess.run([sys.executable, "-c", "print(1)"], env=env, cwd=RUN_DIR, capture_output=True, text=True,
                           timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"this Python cannot run with the sanitizer runtime preloaded: {probe.stderr[-500:]}")
    which = subprocess.run([sys.executable, "-c", "import sys, prism_core as pc; pc.backend('csimd'); "
                            "print(sys.modules['prism_csimd._csimd'].__file__)"], env=env, cwd=RUN_DIR,
                           capture_output=True, text=True, timeout=120)
    assert which.returncode == 0 and which.stdout.strip() == lib, which.stdout + which.stderr  # the sanitized build
    from prism_csimd import kernels
    best = ISAS[kernels._state["lib"].csimd_cpu_isa()]
    for isa in _cpu_isas():
        env["PRISM_CSIMD_ISA"] = isa
        for mode in ("forward", "grad") if isa == best else ("forward",):
            r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "csimd",
                                "--mode", mode, "-q"], env=env, cwd=RUN_DIR, capture_output=True, text=True,
                               timeout=900)
            out = r.stdout + r.stderr
            assert "Sanitizer" not in out and "runtime error" not in out, out[-6000:]
            assert r.returncode == 0, out[-4000:]
            assert " 0 failed" in out, out[-2000:]


def test_c_entry_points_refuse_inconsistent_descriptors():
    """Defence in depth: even past the Python checks, a C entry point given extents that do not
    fit together returns an error code and writes nothing."""
    _need_available()
    from prism_csimd import kernels

    ffi, lib = kernels._state["ffi"], kernels._state["lib"]
    bufs = {n: np.zeros(64, np.float32) for n in ("a", "b", "d")}
    bufs["d"][:] = 7.0

    def t(name, ne):
        d = ffi.new("csimd_tensor *")
        d.data = ffi.cast("char *", ffi.from_buffer(bufs[name]))
        d.ne = list(ne)
        d.nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
        d.type = 0
        return d

    assert lib.csimd_binary(0, t("a", (8, 2, 1, 1)), t("b", (3, 1, 1, 1)), t("d", (8, 2, 1, 1)), 1) == -1  # 3 ∤ 8
    assert lib.csimd_unary(2, 0.0, 0.0, t("a", (8, 2, 1, 1)), t("d", (8, 4, 1, 1)), 1) == -1
    assert lib.csimd_mul_mat(t("a", (8, 4, 1, 1)), t("b", (5, 2, 1, 1)), t("d", (4, 2, 1, 1)), 1) == -1  # K differs
    assert lib.csimd_cpy(t("a", (8, 2, 1, 1)), t("d", (8, 3, 1, 1)), 1) == -1
    assert lib.csimd_norm(1, 1e-6, t("a", (8, 2, 1, 1)), t("d", (4, 2, 1, 1)), 1) == -1
    assert (bufs["d"] == 7.0).all()
    assert lib.csimd_binary(0, t("a", (8, 2, 1, 1)), t("b", (8, 1, 1, 1)), t("d", (8, 2, 1, 1)), 1) == 0
    assert (bufs["d"][:16] == 0.0).all() and (bufs["d"][16:] == 7.0).all()  # a valid call writes its output only


@pytest.mark.parametrize("order", ["ASC", "DESC"])
def test_argsort_is_stable_with_ties_nan_and_signed_zero(order):
    _need_available()
    rng = np.random.default_rng(11)
    x = rng.integers(-3, 4, size=(2, 3, 5, 37)).astype(np.float32)
    x[0, 0, 0, 5] = np.nan
    x[0, 0, 0, 9] = np.nan
    x[1, 2, 4, 0] = -0.0
    x[1, 2, 4, 1] = 0.0
    outs = []
    for be in ("csimd", "numpy"):
        ctx = pc.Context()
        y = pc.argsort(ctx.from_numpy(x), order)
        pc.compute(y, be, strict=(be == "csimd"))
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("dst_type", [pc.F32, pc.F16, pc.BF16])
def test_set_rows_with_broadcast_indices_matches_the_reference(dst_type):
    _need_available()
    rng = np.random.default_rng(12)
    a = rng.standard_normal((2, 3, 10, 8)).astype(np.float32)  # ne [8, 10, 3, 2]
    b = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)  # ne [8, 4, 3, 2]
    c = np.stack([rng.permutation(10)[:4] for _ in range(3)]).astype(np.int32).reshape(1, 1, 3, 4)  # ne [4, 3, 1, 1]
    outs = []
    for be in ("csimd", "numpy"):
        ctx = pc.Context()
        ta = ctx.from_numpy(a)
        if dst_type != pc.F32:
            ta = pc.cpy(ta, ctx.new_tensor(dst_type, (8, 10, 3, 2)))
        y = pc.set_rows(ta, ctx.from_numpy(b), ctx.from_numpy(c))
        out = pc.cpy(y, ctx.new_tensor(pc.F32, (8, 10, 3, 2)))
        pc.compute(out, be, strict=(be == "csimd"))
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("w_type,n_b", [(pc.F32, 2), (pc.F16, 1), (pc.BF16, 2)])
def test_mul_mat_id_matches_the_reference(w_type, n_b):
    _need_available()
    rng = np.random.default_rng(13)
    w = rng.standard_normal((1, 5, 24, 70)).astype(np.float32)  # ne [70, 24, 5]: 5 experts
    b = rng.standard_normal((1, 6, n_b, 70)).astype(np.float32)  # ne [70, n_b, 6 tokens]
    ids = rng.integers(0, 5, size=(1, 1, 6, 2)).astype(np.int32)  # ne [2 used, 6 tokens]
    outs = []
    for be in ("csimd", "numpy"):
        ctx = pc.Context()
        tw = ctx.from_numpy(w)
        if w_type != pc.F32:
            tw = pc.cpy(tw, ctx.new_tensor(w_type, (70, 24, 5, 1)))
        y = pc.mul_mat_id(tw, ctx.from_numpy(b), ctx.from_numpy(ids))
        pc.compute(y, be, strict=(be == "csimd"))
        outs.append(y.numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_count_equal_counts_over_strided_views():
    _need_available()
    rng = np.random.default_rng(14)
    a = rng.integers(0, 3, size=(2, 3, 5, 7)).astype(np.int32)
    b = rng.integers(0, 3, size=(2, 3, 7, 5)).astype(np.int32)
    outs = []
    for be in ("csimd", "numpy"):
        ctx = pc.Context()
        y = pc.count_equal(ctx.from_numpy(a), pc.transpose(ctx.from_numpy(b)))
        pc.compute(y, be, strict=(be == "csimd"))
        outs.append(int(y.numpy().reshape(-1)[0]))
    assert outs[0] == outs[1] == int(np.count_nonzero(a == np.swapaxes(b, -1, -2)))


def test_prepared_calls_read_changing_values_at_compute_time():
    """A plan binds each node's C call once; values that change between computes (the optimizer's
    hyper-parameters, the loss gradient) are still read when the node runs."""
    _need_available()
    rng = np.random.default_rng(9)
    ctx = pc.Context()
    w0, g0, m0, v0 = (rng.standard_normal((3, 37)).astype(np.float32) for _ in range(4))
    v0 = np.abs(v0)
    w, g, m, v = (ctx.from_numpy(x.copy()) for x in (w0, g0, m0, v0))
    w.set_param()
    hyper = ctx.from_numpy(np.zeros(7, np.float32))
    logits, labels = rng.standard_normal((4, 6)).astype(np.float32), rng.dirichlet(np.ones(6), 4).astype(np.float32)
    dloss = ctx.from_numpy(np.zeros(1, np.float32))
    ce_back = pc.cross_entropy_loss_back(dloss, ctx.from_numpy(logits), ctx.from_numpy(labels))
    graph = pc.Graph().expand(pc.opt_step_adamw(w, g, m, v, hyper))
    graph.expand(ce_back)
    plan = pc.plan(graph, "csimd", strict=True)
    assert all(hasattr(c, "keep") for c in plan.calls)  # every call was prepared, none runs the general path
    wd, md, vd = (x.astype(np.float64) for x in (w0, m0, v0))
    gd = g0.astype(np.float64)
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    for step, (alpha, b1, b2, eps, wdecay, scale) in enumerate([(1e-2, 0.9, 0.999, 1e-8, 0.0, 2.0),
                                                                 (5e-3, 0.5, 0.9, 1e-3, 0.1, -0.5)], 1):
        b1h, b2h = 1 / (1 - b1 ** step), 1 / (1 - b2 ** step)
        hyper.set(np.array([alpha, b1, b2, eps, wdecay, b1h, b2h], np.float32))
        dloss.set(np.array([scale], np.float32))
        plan.compute()
        md = b1 * md + (1 - b1) * gd
        vd = b2 * vd + (1 - b2) * gd * gd
        wd = wd * (1 - alpha * wdecay) - alpha * md * b1h / (np.sqrt(vd * b2h) + eps)
        np.testing.assert_allclose(w.numpy(), wd, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(m.numpy(), md, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(v.numpy(), vd, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(ce_back.numpy(), (softmax - labels) * scale / 4, rtol=1e-5, atol=1e-7)


def test_an_extension_built_from_other_sources_is_refused(monkeypatch):
    """Same function names, other signatures: the interface version says so before any call."""
    _need_available()
    import prism_csimd

    real = prism_csimd._load_module()
    fake_lib = SimpleNamespace(**{f: getattr(real.lib, f) for f in prism_csimd.REQUIRED_FUNCTIONS})
    fake_lib.csimd_abi_version = lambda: prism_csimd.ABI_VERSION - 1
    monkeypatch.setitem(prism_csimd._loaded, "module", SimpleNamespace(lib=fake_lib, ffi=real.ffi, __file__="old.so"))
    ok, reason = pc.backend("csimd").availability()
    assert not ok and "other sources" in reason and "reinstall" in reason, reason


def _on(backend: str, build):
    out = build(pc.Context(), np.random.default_rng(0))
    pc.compute(out, backend, strict=backend != "numpy")
    return out.numpy()


@pytest.mark.parametrize("seed", range(12))
def test_pool_and_im2col_sweep_matches_the_reference(seed):
    """Random windows, strides, padding (up to k - 1), dilation, F16 inputs and NaNs (max pooling lets
    the first NaN through) against the NumPy reference."""
    _need_available()
    rng = np.random.default_rng(seed)
    W, H, C, N = (rng.integers(1, 12, 4) + [4, 3, 0, 0]).tolist()
    k0, k1 = (int(v) for v in rng.integers(1, 5, 2))
    s0, s1 = (int(v) for v in rng.integers(1, 4, 2))
    p0, p1 = int(rng.integers(0, k0)), int(rng.integers(0, k1))
    half = bool(seed % 2)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    x[rng.uniform(size=x.shape) < 0.03] = np.nan

    def leaf(c, r):
        t = c.new_tensor(pc.F16 if half else pc.F32, x.shape[::-1])
        t.set(x.astype(np.float16) if half else x)
        return t
    for op in ("MAX", "AVG"):
        pool2 = lambda c, r, op=op: pc.pool_2d(leaf(c, r), op, k0, k1, s0, s1, p0, p1)  # noqa: E731
        pool1 = lambda c, r, op=op: pc.pool_1d(leaf(c, r), op, k0, s0, p0)  # noqa: E731
        for build in (pool2, pool1):
            np.testing.assert_allclose(_on("csimd", build), _on("numpy", build), rtol=1e-6, atol=1e-6)
    d0, d1 = (int(v) for v in rng.integers(1, 3, 2))
    if (W + 2 * p0 - d0 * (k0 - 1) - 1) < 0 or (H + 2 * p1 - d1 * (k1 - 1) - 1) < 0:
        return
    kernel = np.zeros((C, C, k1, k0), np.float16)
    cols = lambda c, r: pc.im2col(c.from_numpy(kernel, pc.F16), leaf(c, r), s0, s1, p0, p1, d0, d1,  # noqa: E731
                                  dst_type=pc.F16 if seed % 3 == 0 else pc.F32)
    np.testing.assert_array_equal(_on("csimd", cols), _on("numpy", cols))


def test_integer_copies_and_rows_match_the_reference():
    """F32 -> I32 truncates toward zero (NaN and out-of-range give INT32_MIN, as NumPy on x86);
    I32 -> F32/F16/BF16 rounds; I32 rows are gathered exactly, past 2^24 too; I64 row indices."""
    _need_available()
    f = np.array([2.7, -2.7, 0.5, -0.5, 1e9, -1e9, 3e9, -3e9, np.nan, np.inf, -np.inf, 16777217.0], np.float32)
    i = np.array([0, 1, -1, 16777217, -16777219, 70000, 65520, 2**31 - 1, -2**31, 1000, 3, 123456789], np.int32)
    expect_int = np.array([2, -2, 0, 0, 10**9, -10**9] + [-2**31] * 5 + [16777216], np.int32)
    cases = [(lambda c, r: pc.cpy(c.from_numpy(f), c.new_tensor(pc.I32, (12,))), expect_int)]
    for t in (pc.F32, pc.F16, pc.BF16):
        cases.append((lambda c, r, t=t: pc.cpy(c.from_numpy(i), c.new_tensor(t, (12,))), None))
    rows = np.arange(4 * 6, dtype=np.int64).reshape(6, 4).astype(np.int32) + 2**30
    idx = np.array([5, 0, 3, 3], np.int32)
    cases.append((lambda c, r: pc.get_rows(c.from_numpy(rows), c.from_numpy(idx)), rows[idx]))
    src = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    cases.append((lambda c, r: pc.set_rows(c.from_numpy(np.zeros((5, 8), np.float32)), c.from_numpy(src),
                                           c.from_numpy(np.array([4, 0, 2], np.int64))), None))
    for build, expect in cases:
        got, ref = _on("csimd", build), _on("numpy", build)
        np.testing.assert_array_equal(got, ref)
        if expect is not None:
            np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("dst_type", [pc.F16, pc.GGMLType.Q8_0])
def test_a_planned_set_rows_is_prepared_and_still_refuses_a_bad_index_untouched(dst_type):
    """SET_ROWS reads its indices, yet its plan calls C directly (a model writes its KV cache this way
    every step): an index gone out of range at a later compute is refused, naming the range, with the
    destination unchanged, and the next good index is written."""
    _need_available()
    be = pc.backend("csimd")
    ctx = pc.Context()
    dst = ctx.new_tensor(dst_type, (32, 4))
    rows = ctx.from_numpy(np.full((1, 32), 0.5, np.float32))
    idx = ctx.new_tensor(pc.I64, (1,)).set_input()
    out = pc.set_rows(dst, rows, idx)
    p = pc.plan(out, be, strict=True)
    assert getattr(p.calls[-1], "keep", None) is not None, "SET_ROWS has a prepared C call, not the general path"
    for good in (1, 3):
        idx.set(np.array([good], np.int64))
        p.compute()
    before = dst.raw().copy()
    idx.set(np.array([4], np.int64))
    with pytest.raises(pc.InvalidArgument, match=r"row index out of range \[0, 4\)"):
        p.compute()
    np.testing.assert_array_equal(dst.raw(), before)
    idx.set(np.array([0], np.int64))
    p.compute()
    np.testing.assert_allclose(dst.numpy()[[0, 1, 3]], 0.5, rtol=0, atol=1e-3)
    np.testing.assert_array_equal(dst.numpy()[2], 0.0)


@pytest.mark.parametrize("src_type", [pc.F32, pc.GGMLType.Q8_0])
def test_a_planned_get_rows_is_prepared_and_still_refuses_a_bad_index(src_type):
    _need_available()
    ctx = pc.Context()
    table = np.arange(4 * 32, dtype=np.float32).reshape(4, 32) / 64
    src = pc.cpy(ctx.from_numpy(table), ctx.new_tensor(src_type, (32, 4))) if src_type != pc.F32 \
        else ctx.from_numpy(table)
    pc.compute(src, "csimd")
    idx = ctx.new_tensor(pc.I32, (2,)).set_input()
    out = pc.get_rows(src, idx).set_output()
    p = pc.plan(pc.Graph().expand(out), "csimd", strict=True)
    assert getattr(p.calls[-1], "keep", None) is not None, "GET_ROWS has a prepared C call, not the general path"
    want = src.numpy()
    idx.set(np.array([3, 1], np.int32))
    p.compute()
    np.testing.assert_array_equal(out.numpy(), want[[3, 1]])
    for bad in (4, -1):
        idx.set(np.array([0, bad], np.int32))
        with pytest.raises(pc.InvalidArgument, match=r"row index out of range \[0, 4\)"):
            p.compute()
        np.testing.assert_array_equal(out.numpy(), want[[3, 1]])  # nothing written


def test_rows_kernels_are_prepared_whatever_their_index_inputs_hold_at_plan_time():
    """A plan's index inputs are written after planning (a model's KV-cache cells): an out-of-range value
    left in the buffer when the plan is made must not send SET_ROWS/GET_ROWS to the general path for good;
    the values of each compute are still checked."""
    _need_available()
    ctx = pc.Context()
    dst = ctx.new_tensor(pc.F16, (32, 4))
    rows = ctx.from_numpy(np.full((1, 32), 0.25, np.float32))
    cell = ctx.new_tensor(pc.I64, (1,)).set_input()
    table = pc.cpy(ctx.from_numpy(np.arange(128, dtype=np.float32).reshape(4, 32) / 64),
                   ctx.new_tensor(pc.GGMLType.Q8_0, (32, 4)))
    pc.compute(table, "csimd")
    idx = ctx.new_tensor(pc.I32, (1,)).set_input()
    cell.set(np.array([99], np.int64))  # what the buffers hold when the plan is made
    idx.set(np.array([-7], np.int32))
    written = pc.set_rows(dst, rows, cell)
    picked = pc.get_rows(table, idx).set_output()
    p = pc.plan(pc.Graph().expand(written).expand(picked), "csimd", strict=True)
    assert all(getattr(c, "keep", None) is not None for c in p.calls), "every call prepared, none general"
    cell.set(np.array([2], np.int64))
    idx.set(np.array([3], np.int32))
    p.compute()
    np.testing.assert_array_equal(dst.numpy()[2], 0.25)
    np.testing.assert_allclose(picked.numpy().ravel(), np.arange(96, 128) / 64, atol=0.01)
    cell.set(np.array([4], np.int64))
    with pytest.raises(pc.InvalidArgument, match=r"SET_ROWS: row index out of range \[0, 4\)"):
        p.compute()


_GEGLU_SET_ROWS_SCRIPT = r"""
import numpy as np, prism_core as pc
rng = np.random.default_rng(7)
x = (rng.standard_normal((9, 203)) * 6).astype(np.float32)  # past every vector width, with a tail
x[0, :20] = [np.nan, np.inf, -np.inf, 10, -10, 9.999, -9.999, 1e-8, -1e-8, 0, -0.0, 65504, 7e4, -7e4, 1e-5, 6e-8,
             3e-8, -6e-8, 11, -11]  # the table's ends, F16 overflow and subnormals
g = rng.standard_normal((9, 203)).astype(np.float32)
g[1, :4] = [np.nan, np.inf, 0, -np.inf]
kv = np.concatenate([x[0, :20], rng.standard_normal(183).astype(np.float32) * 300]).reshape(1, 203)
outs = []
for be in ("csimd", "numpy"):
    ctx = pc.Context()
    a, b = ctx.from_numpy(x), ctx.from_numpy(g)
    cache = ctx.new_tensor(pc.F16, (203, 5))
    nodes = [pc.geglu_split(a, b), pc.geglu(ctx.from_numpy(np.concatenate([x, g], 1))),
             pc.set_rows(cache, ctx.from_numpy(kv), ctx.from_numpy(np.array([3], np.int64)))]
    graph = pc.Graph()
    for n in nodes:
        graph.expand(n)
    assert pc.compute(graph, be, strict=be == "csimd").fallbacks == []
    outs.append([n.host().copy() for n in nodes])
for got, want in zip(*outs):
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
print("ok")
"""


@pytest.mark.parametrize("isa", ISAS)
def test_geglu_and_f16_set_rows_give_the_reference_bits_on_every_isa_path(isa):
    """GEGLU's vector table read (F16C indices, a gather) and SET_ROWS into F16 rows (F16C) against the
    reference bit for bit, NaN, infinities, the table's ends and F16 overflow included."""
    if isa not in _cpu_isas():
        pytest.skip(f"this CPU cannot run the {isa} path")
    r = subprocess.run([sys.executable, "-c", _GEGLU_SET_ROWS_SCRIPT], env=_env(PRISM_CSIMD_ISA=isa), cwd=RUN_DIR,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-4000:] + r.stderr[-4000:]
