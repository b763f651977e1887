"""``prism new-backend``: the package it writes installs (as a distribution with its entry
point) and certifies as written: its own tests pass and `prism conformance` finds the backend,
passes its two ops and reports the rest unsupported."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import prism_core as pc
from prism_core.cli import main
from prism_core.scaffold import names, write_backend

ROOT = Path(__file__).resolve().parents[1]


def _install(src: Path, target: Path) -> None:
    """pip when it can build offline here, else the distribution laid out by hand (what pip would
    leave: the package and a .dist-info with METADATA and entry_points.txt)."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--disable-pip-version-check", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return
    meta = tomllib.loads((src / "pyproject.toml").read_text())["project"]
    (module,) = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    shutil.copytree(src / module, target / module)
    info = target / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    eps = meta["entry-points"]["prism.backends"]
    (info / "entry_points.txt").write_text("[prism.backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))


def test_scaffold_installs_and_certifies_as_written(tmp_path, capsys):
    pkg = tmp_path / "pkg"
    assert main(["new-backend", "sketch", "--dir", str(pkg)]) == 0
    assert "wrote the sketch backend package" in capsys.readouterr().out
    files = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*") if p.is_file())
    assert files == ["README.md", "prism_sketch/__init__.py", "prism_sketch/kernels.py", "pyproject.toml",
                     "tests/test_conformance.py"]
    assert 'sketch = "prism_sketch"' in (pkg / "pyproject.toml").read_text()
    site = tmp_path / "site"
    site.mkdir()
    _install(pkg, site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(ROOT / "backends")])}
    env.pop("PRISM_BACKEND", None)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")],
                           capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "2 passed" in tests.stdout
    conf = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "sketch", "-q"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert conf.returncode == 0, conf.stdout[-3000:] + conf.stderr[-2000:]
    (summary,) = [ln for ln in conf.stdout.splitlines() if ln.startswith("sketch:")]
    assert ", 0 failed," in summary and "0 failing" in summary


def test_bad_names_and_targets_are_refused_before_anything_is_written(tmp_path):
    for bad in ("Torch", "1x", "my-backend", "numpy", "all", "class", ""):
        with pytest.raises(pc.InvalidArgument):
            names(bad)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(pc.InvalidArgument, match="not an empty directory"):
        write_backend("ok", tmp_path / "full")
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["x"]
    assert main(["new-backend", "numpy", "--dir", str(tmp_path / "n")]) == 2
    assert not (tmp_path / "n").exists()


def test_templates_are_package_data_of_the_wheel():
    """Every template file matches a package-data glob of pyproject.toml, so the wheel ships it."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["prism_core.scaffold"]
    root = ROOT / "prism_core" / "scaffold"
    templates = [str(p.relative_to(root)) for p in root.rglob("*.tmpl")]
    assert len(templates) == 5
    for t in templates:
        assert any(fnmatch.fnmatch(t, g) and t.count("/") == g.count("/") for g in patterns), t
