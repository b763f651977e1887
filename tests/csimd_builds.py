"""csimd modules built apart from the installed one (sanitized, without OpenMP), each built once per test run.

A build takes 30-45 s of CPU and several tests load the same one, in whichever pytest-xdist worker they land:
the first to ask builds it into a folder all workers of the run share, the others wait on a lock and load it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "csrc" / "build_csimd.py"


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every worker sees (xdist gives each worker a base temp beside the others')."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> tuple[Path | None, str]:
    """``csrc/build_csimd.py FLAGS`` built once in this run: (the module's file, or None when the build failed;
    the build's stderr)."""
    root = run_dir(tmp_path_factory) / ("csimd" + "".join(flags).replace("--", "-"))
    root.mkdir(exist_ok=True)
    done, log = root / "built", root / "stderr.txt"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits here for the first one's build
        if not done.exists():
            # started in tests/: a stale prism_tensor.egg-info in the repository root would shadow the entry points
            r = subprocess.run([sys.executable, str(BUILD_SCRIPT), *flags, "--out", str(root / "out")],
                               cwd=Path(__file__).parent, capture_output=True, text=True, timeout=1800)
            log.write_text(r.stderr)
            done.write_text(r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else "")
    lib = done.read_text()
    return (Path(lib) if lib else None), log.read_text()


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
