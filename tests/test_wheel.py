"""An installable Prism for plugin authors: ``python -m build`` makes a wheel and an sdist, the
wheel installs into a fresh venv, and the conformance suite passes from the installed copy."""

from __future__ import annotations

import os
import subprocess

import pytest
from csimd_builds import serial_wheel


@pytest.mark.slow
def test_built_wheel_installs_in_a_fresh_venv_and_certifies_numpy(tmp_path, tmp_path_factory):
    """The wheel is built without OpenMP (tests/csimd_builds.py: tests/test_csimd_no_openmp.py loads its csimd
    module, so the run compiles it once); the OpenMP build is the one this checkout's own install made."""
    pytest.importorskip("build")
    root, log = serial_wheel(tmp_path_factory)
    assert root is not None, log
    (_wheel,) = (root / "dist").glob("prism_tensor-*.whl")
    (sdist,) = (root / "dist").glob("prism_tensor-*.tar.gz")
    assert sdist.stat().st_size > 0
    env_dir = root / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(env_dir / "bin" / "prism"), "conformance", "--backend", "numpy", "-q"],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "certified: " in r.stdout and "(numpy)" in r.stdout, r.stdout
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import prism_core; print(prism_core.__file__)"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert str(env_dir) in where.stdout, where.stdout  # the installed copy ran, not this checkout
