"""csimd built without OpenMP (what a compiler without it, such as Apple's clang, gives: setup.py retries
without -fopenmp, and ``CSIMD_NO_OPENMP=1`` asks for it): the kernels then run on the calling thread,
any thread count a caller asks for included, and give the results the tests expect.

One build (about 30 s on 2 busy cores, hence ``slow``: the wheel of tests/test_wheel.py, whose csimd module is
built with ``CSIMD_NO_OPENMP=1`` for both), then the quantized matrix products (every x86
path this CPU runs, thread counts 1 and 2 asked for) in a subprocess that loads it through
PRISM_CSIMD_LIBRARY; ``PRISM_FULL_SWEEP=1`` adds the conformance suite on the best path this CPU runs.
The arm64 build of tests/test_arm64_qemu.py is serial too, and runs the conformance suite by default.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from csimd_builds import build_once, serial_wheel

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def serial_build(tmp_path_factory) -> Path:
    if importlib.util.find_spec("build") is None:  # no wheel to take it from: the module alone
        lib, log = build_once(tmp_path_factory, "--no-openmp")
    else:  # the csimd module of tests/test_wheel.py's wheel, built with CSIMD_NO_OPENMP=1 once in the run
        root, log = serial_wheel(tmp_path_factory)
        libs = list(root.glob("venv/lib/python*/site-packages/prism_csimd/_csimd*.so")) if root else []
        lib = libs[0] if len(libs) == 1 else None
    if lib is None and "error: command" in log and "failed: No such file" in log:
        pytest.skip(f"no C compiler here: {log[-300:]}")
    assert lib is not None, log[-4000:]
    assert lib.is_file(), lib
    return lib


def _env(lib: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PRISM_CSIMD_ISA", "PRISM_BACKEND")}
    env["PRISM_CSIMD_LIBRARY"] = str(lib)
    return env


def test_serial_build_reports_one_thread(serial_build):
    code = ("import prism_core as pc\n"
            "info = next(i for i in pc.backends() if i.name == 'csimd')\n"
            "from prism_csimd import kernels\n"
            "print(info.available, kernels._state['lib'].csimd_has_openmp(), pc.backend('csimd').threads)\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(serial_build), cwd=REPO / "tests",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.split() == ["True", "0", "1"]


def test_serial_build_quantized_products(serial_build):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_csimd_quant.py",
                        "-k", "mul_mat_priority_formats or vec_dot_against_float64"],
                       env=_env(serial_build), cwd=REPO / "tests", capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.skipif(os.environ.get("PRISM_FULL_SWEEP", "") in ("", "0"), reason="full sweep: set PRISM_FULL_SWEEP=1")
def test_serial_build_conformance(serial_build):
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "csimd", "-q"],
                       env=_env(serial_build), cwd=REPO / "tests", capture_output=True, text=True, timeout=1200)
    summary = next((ln for ln in r.stdout.splitlines() if ln.startswith("csimd:")), "")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert " 0 failed, 0 unsupported cases, 0 timed out" in summary, summary
