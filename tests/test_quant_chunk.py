"""ggml_quantize_chunk (llama-quantize's quantizers) bit for bit: prism_core.quant.quantize_chunk in C (csimd, on
every ISA path) and in NumPy, against the blocks llama.cpp 0.3.36's own ggml writes
(tests/data/quant_chunk_golden.npz, recorded by tests/data/make_quant_chunk_golden.py), with and without an
importance matrix; the lattice formats (C only) and their refusals; the C reference quantizers of the lattice
formats against the same data; IQ4_NL's all-zero blocks as ggml writes them; a sanitized build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from csimd_builds import sanitized_build

import prism_core as pc
from prism_core import quant
from prism_core.errors import InvalidArgument, ShapeMismatch, Unsupported
from prism_core.types import GGMLType as G

sys.path.insert(0, str(Path(__file__).parent))
from test_csimd_quant import ISAS  # noqa: E402  (CSIMD_ISA_* order)

DATA = Path(__file__).parent / "data"
GOLDEN = np.load(DATA / "quant_chunk_golden.npz")
REF_GOLDEN = np.load(DATA / "quant_golden.npz")
ROOT = Path(__file__).resolve().parents[1]
TYPES = [str(t) for t in GOLDEN["types"]]
GRID = {"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}
RUNS = {"c": ("x", None), "cl": ("x_long", None), "cw": ("x", "w"), "cwh": ("x_huge", "w_huge"),
        "cwl": ("x_long", "w_long")}


def _rows(name: str) -> np.ndarray:
    return REF_GOLDEN[name] if name in REF_GOLDEN else GOLDEN[name]


def _gtype(name: str) -> G:
    return G[name.upper()]


def _cases(types):
    return [(key, t) for t in types for key in RUNS if f"{key}_{t}" in GOLDEN]


def _csimd_available() -> bool:
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    return info is not None and info.available


@pytest.fixture
def numpy_only(monkeypatch):
    monkeypatch.setenv(quant.ENV_QUANT, "python")


@pytest.fixture
def csimd_isa(request, monkeypatch):
    """prism_core.quant through csimd on one ISA path (skipped where the CPU lacks it)."""
    if not _csimd_available():
        pytest.skip("csimd unavailable here")
    monkeypatch.setenv(quant.ENV_QUANT, "csimd")
    from prism_csimd import kernels
    lib = kernels._state["lib"]
    want = ISAS.index(request.param)
    if not lib.csimd_isa_runs(want):
        pytest.skip(f"this CPU does not run the {request.param} path")
    before = lib.csimd_get_isa()
    # the backend sets its path from $PRISM_CSIMD_ISA whenever it is asked for availability (each quantize call)
    monkeypatch.setenv("PRISM_CSIMD_ISA", request.param)
    assert lib.csimd_set_isa(want) == 0
    yield request.param
    assert lib.csimd_get_isa() == want, "the path changed under the test"
    lib.csimd_set_isa(before)


def _check(key: str, t: str, got_of) -> None:
    xname, wname = RUNS[key]
    x = _rows(xname)
    want = GOLDEN[f"{key}_{t}"]
    ok = ~GOLDEN[f"{key}_{t}_aborted"] if f"{key}_{t}_aborted" in GOLDEN else np.ones(len(x), bool)
    for i in np.flatnonzero(ok):  # one row per call, as the golden data were made (each row its own imatrix)
        got = got_of(x[i:i + 1], _gtype(t), None if wname is None else GOLDEN[wname][i])
        assert np.array_equal(got[0], want[i]), (key, t, i, np.flatnonzero(got[0] != want[i])[:8])


@pytest.mark.parametrize("csimd_isa", ISAS, indirect=True)
@pytest.mark.parametrize("key,t", _cases(TYPES), ids=lambda v: str(v))
def test_c_quantize_chunk_equals_ggml(csimd_isa, key, t):
    _check(key, t, lambda x, typ, w: quant.quantize_chunk(x, typ, w, overflow="ggml"))


@pytest.mark.parametrize("key,t", _cases([t for t in TYPES if t not in GRID]), ids=lambda v: str(v))
def test_numpy_quantize_chunk_equals_ggml(numpy_only, key, t):
    _check(key, t, lambda x, typ, w: quant.quantize_chunk(x, typ, w, overflow="ggml"))


def test_c_batches_rows_as_one_chunk():
    """Many rows with one importance matrix in one call give each row's single-row blocks (rows are
    independent in ggml_quantize_chunk; the C side splits them over threads)."""
    if not _csimd_available():
        pytest.skip("csimd unavailable here")
    x, w = GOLDEN["x_long"], GOLDEN["w_long"][3]
    for t in ("q4_0", "q4_K", "iq2_xxs", "iq3_s", "iq1_m", "iq4_nl"):
        whole = quant.quantize_chunk(x, _gtype(t), w, threads=2)
        for i in range(len(x)):
            assert np.array_equal(whole[i], quant.quantize_chunk(x[i:i + 1], _gtype(t), w, threads=1)[0]), (t, i)


@pytest.mark.parametrize("t", ["iq2_s", "iq3_xxs", "iq3_s"])
def test_c_reference_of_the_lattice_formats(t):
    """ggml's quantize_row_<type>_ref of IQ2_S, IQ3_XXS, IQ3_S is its chunk path without weights."""
    if not _csimd_available():
        pytest.skip("csimd unavailable here")
    x = REF_GOLDEN["x"]
    assert np.array_equal(quant.quantize(x, _gtype(t), overflow="ggml"), GOLDEN[f"c_{t}"])


def test_lattice_formats_without_c_are_refused(numpy_only):
    x = REF_GOLDEN["x"][:2]
    for t in (G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_M, G.IQ2_XXS):
        with pytest.raises(Unsupported, match="in C only"):
            quant.quantize_chunk(x, t, np.ones(256, np.float32))
    with pytest.raises(Unsupported, match="in C only"):
        quant.quantize(x, G.IQ3_S)


def test_refusals_name_the_problem():
    x = REF_GOLDEN["x"][:2]
    for t in (G.IQ2_XXS, G.IQ2_XS, G.IQ1_S):
        with pytest.raises(Unsupported, match="needs an importance matrix"):
            quant.quantize_chunk(x, t)
        with pytest.raises(Unsupported, match="needs an importance matrix"):
            quant.quantize(x, t)
    with pytest.raises(Unsupported, match="IQ1_M has no reference"):
        quant.quantize(x, G.IQ1_M)
    with pytest.raises(ShapeMismatch, match="imatrix has 255 values, the rows 256 columns"):
        quant.quantize_chunk(x, G.Q4_K, np.ones(255, np.float32))
    bad = np.ones(256, np.float32)
    bad[7] = np.nan
    with pytest.raises(InvalidArgument, match="non-finite value at column 7"):
        quant.quantize_chunk(x, G.Q4_K, bad)
    with pytest.raises(Unsupported, match="activation format"):
        quant.quantize_chunk(x, G.Q8_K)


def _zero_block_rows() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[0, :32] = 0.0  # a row's first block
    x[1, 64:128] = 0.0  # two after a non-zero one
    x[2] = 0.0
    return x


@pytest.mark.parametrize("backend", ["python", "csimd"])
def test_iq4_nl_reference_zero_blocks_repeat_the_previous_block(backend, monkeypatch):
    """ggml's quantize_row_iq4_nl_ref leaves an all-zero block's indices as its scratch buffer held them: the
    previous block's of the row (as in quant_golden.npz's q_iq4_nl). A row's first block (ggml: uninitialised
    memory) gets index 8 (the entry nearest 0) in every nibble, what ggml_quantize_chunk writes there."""
    if backend == "csimd" and not _csimd_available():
        pytest.skip("csimd unavailable here")
    monkeypatch.setenv(quant.ENV_QUANT, backend)
    x = _zero_block_rows()
    q = quant.quantize(x, G.IQ4_NL, overflow="ggml").reshape(3, 8, 18)
    assert (q[0, 0, 2:] == 0x88).all() and (q[0, 0, :2] == 0).all()
    assert np.array_equal(q[1, 2, 2:], q[1, 1, 2:]) and np.array_equal(q[1, 3, 2:], q[1, 1, 2:])
    assert (q[1, 2, :2] == 0).all() and not (q[1, 1, 2:] == 0x88).all()
    assert (q[2, :, 2:] == 0x88).all()
    gx, gq = REF_GOLDEN["x"], REF_GOLDEN["q_iq4_nl"].reshape(-1, 8, 18)
    mine = quant.quantize(gx, G.IQ4_NL, overflow="ggml").reshape(-1, 8, 18)
    zero = np.abs(gx.reshape(-1, 8, 32)).max(axis=2) < 1e-15
    undefined = np.cumprod(zero, axis=1).astype(bool)  # zero blocks with no non-zero one before them in the row
    assert undefined.any() and (zero & ~undefined).sum() >= 5  # the data hold both kinds
    assert np.array_equal(mine[~undefined], gq[~undefined])  # everything ggml's reference defines


def test_iq4_nl_chunk_zero_blocks():
    x = _zero_block_rows()
    q = quant.quantize_chunk(x, G.IQ4_NL).reshape(3, 8, 18)
    assert (q[2, :, 2:] == 0x88).all() and (q[1, 2, 2:] == 0x88).all() and (q[1, 2, :2] == 0).all()


@pytest.mark.slow
def test_sanitized_build_quantizes_clean(tmp_path_factory):
    """Every quantizer of csimd_q_quantize_rows on the golden rows (with and without weights) in a module built
    with -fsanitize=address,undefined: equal to ggml and no sanitizer report. The quantizers are plain C
    (csimd_quant.h) with x86 vector copies of a few (csimd_quantize_x86.h, on the AVX2 and AVX-512 paths): CI
    runs the CPU's default path, PRISM_FULL_SWEEP=1 every path the CPU runs (about 17 s more each). The build
    (about 37 s of CPU) is shared with test_csimd_backend.py's sanitizer run."""
    from test_csimd_backend import RUN_DIR, _cpu_isas, _env, _need_available
    _need_available()
    lib, rt = sanitized_build(tmp_path_factory)
    env = _env(LD_PRELOAD=" ".join(rt), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", PRISM_CSIMD_LIBRARY=str(lib), PRISM_QUANT="csimd")
    script = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_quant_chunk as t\n"
        "for key, typ in t._cases(t.TYPES):\n"
        "    t._check(key, typ, lambda x, g, w: t.quant.quantize_chunk(x, g, w, overflow='ggml'))\n"
        "print('ok')\n")
    for isa in _cpu_isas() if os.environ.get("PRISM_FULL_SWEEP") == "1" else [None]:
        if isa is not None:
            env["PRISM_CSIMD_ISA"] = isa
        r = subprocess.run([sys.executable, "-c", script], env=env, cwd=RUN_DIR, capture_output=True, text=True,
                           timeout=1800)
        out = r.stdout + r.stderr
        assert "Sanitizer" not in out and "runtime error" not in out, out[-6000:]
        assert r.returncode == 0 and "ok" in r.stdout, out[-4000:]
    assert os.path.exists(lib)
