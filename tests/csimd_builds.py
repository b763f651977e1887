"""csimd modules built apart from the installed one (sanitized; without OpenMP, in a wheel), each built once per
test run.

A build takes 35-45 s of CPU and several tests load the same one, in whichever pytest-xdist worker they land:
the first to ask builds it into a folder all workers of the run share, the others wait on a lock and load it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import once_per_run

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "csrc" / "build_csimd.py"


def build_once(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> tuple[Path | None, str]:
    """``csrc/build_csimd.py FLAGS`` built once in this run: (the module's file, or None when the build failed;
    the build's stderr)."""
    def build(root: Path) -> tuple[str, str]:
        # started in tests/: a stale prism_tensor.egg-info in the repository root would shadow the entry points
        r = subprocess.run([sys.executable, str(BUILD_SCRIPT), *flags, "--out", str(root / "out")],
                           cwd=Path(__file__).parent, capture_output=True, text=True, timeout=1800)
        return (r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""), r.stderr
    lib, stderr = once_per_run(tmp_path_factory, "csimd" + "".join(flags).replace("--", "-"), build)
    return (Path(lib) if lib else None), stderr


def serial_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path | None, str]:
    """``python -m build`` of this checkout with ``CSIMD_NO_OPENMP=1`` (a wheel and an sdist in ``dist/``), the
    wheel installed into a fresh venv (``venv/``); once in this run: (their folder, or None when a step failed;
    the steps' output). One C build serves tests/test_wheel.py (the wheel installs and runs) and
    tests/test_csimd_no_openmp.py (its csimd module is serial) instead of one each; the OpenMP build is the one
    ``pip install`` made of this checkout for every other test."""
    def build(root: Path) -> tuple[str, str]:
        env = dict(os.environ, CSIMD_NO_OPENMP="1")
        r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(REPO)], env=env,
                           capture_output=True, text=True, timeout=1800)
        log = r.stdout[-4000:] + r.stderr[-4000:]  # setup.py's warning when the C build failed included
        if r.returncode != 0:
            return "", log
        venv.create(root / "venv", with_pip=True)
        # prism itself from the local wheel only; its dependencies from the configured index
        r = subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--find-links",
                            str(root / "dist"), "prism-tensor"], capture_output=True, text=True, timeout=1800)
        return ("" if r.returncode else str(root)), log + r.stdout[-4000:] + r.stderr[-4000:]
    folder, log = once_per_run(tmp_path_factory, "serial-wheel", build)
    return (Path(folder) if folder else None), log


def sanitizer_runtime() -> tuple[str, str] | None:
    """gcc's libasan and libubsan (to preload into Python), or None when this machine lacks them."""
    cc = shutil.which("gcc")
    if cc is None:
        return None
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        p = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not p or not os.path.isabs(p) or not os.path.exists(p):
            return None
        libs.append(p)
    return libs[0], libs[1]


def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, str]]:
    """The module built with -fsanitize=address,undefined, and the runtimes to preload with it; skips where the
    machine has no sanitizer runtime or cannot build it."""
    rt = sanitizer_runtime()
    if rt is None:
        pytest.skip("no gcc with libasan/libubsan here: the sanitizer runtime is not present")
    pytest.importorskip("cffi")
    lib, stderr = build_once(tmp_path_factory, "--sanitize")
    if lib is None:
        pytest.skip(f"the sanitized build failed here: {stderr[-2000:]}")
    return lib, rt
