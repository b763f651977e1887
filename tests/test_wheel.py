"""An installable Prism for plugin authors: ``python -m build`` makes a wheel and an sdist, the
wheel installs into a fresh venv, and the conformance suite passes from the installed copy."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_built_wheel_installs_in_a_fresh_venv_and_certifies_numpy(tmp_path):
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (wheel,) = dist.glob("prism_tensor-*.whl")
    (sdist,) = dist.glob("prism_tensor-*.tar.gz")
    assert sdist.stat().st_size > 0
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # prism itself from the local wheel only; its dependencies from the configured index
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--find-links", str(dist), "prism-tensor"],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(env_dir / "bin" / "prism"), "conformance", "--backend", "numpy", "-q"],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "certified: " in r.stdout and "(numpy)" in r.stdout, r.stdout
    where = subprocess.run([str(py), "-c", "import prism_core; print(prism_core.__file__)"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert str(env_dir) in where.stdout, where.stdout  # the installed copy ran, not this checkout
