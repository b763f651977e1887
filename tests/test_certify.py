"""A certification that cannot pass empty: views count as core, --require, the verdict line."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from helpers import reads_block_types

import prism_core as pc
from prism_core.cli import main as cli
from prism_core.conformance import cases_for


class _AddOnly(pc.Backend):
    version = "test"

    def __init__(self, name: str) -> None:
        self.name = name
        self.kernels = {"ADD": pc.backend("numpy").kernels["ADD"]}


@pytest.fixture
def addonly():
    module = type(sys)("addonly_plugin")
    module.prism_register_backends = pc.hookimpl(lambda: [_AddOnly("addonly")])
    pc.REGISTRY.register(module, "addonly_plugin")
    yield "addonly"
    pc.REGISTRY.unregister("addonly_plugin")


def _verdict(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if re.match(r"(NOT )?certified: ", ln)]
    return line


def test_views_count_as_core_and_the_verdict_counts_own_ops(addonly, capsys):
    assert cli(["conformance", "--backend", addonly, "--op", "ADD", "--op", "RESHAPE", "--op", "MUL", "-q"]) == 0
    out = capsys.readouterr().out
    assert "0 ops ok, 1 partial" in out and "1 unsupported, 1 core views)" in out, out
    add = [c for c in cases_for("ADD") if not reads_block_types(c)]  # block types are never claimed
    unsup = len(cases_for("ADD")) - len(add) + len(cases_for("MUL"))
    assert _verdict(out) == f"certified: {len(add)} cases on 1 ops; {unsup} unsupported (addonly)"


def test_table_marks_views_core(addonly, capsys):
    assert cli(["conformance", "--backend", addonly, "--op", "ADD", "--op", "TRANSPOSE"]) == 0
    *_, row = (ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("TRANSPOSE"))  # the table's
    assert row.split()[1] == "core", row


@pytest.mark.parametrize("flags", [["--require", "mul"], ["--require", "ADD,MUL"], ["--require-all"]])
def test_require_fails_on_an_unsupported_op(addonly, flags, capsys):
    assert cli(["conformance", "--backend", addonly, "--op", "ADD", "--op", "MUL", "-q", *flags]) == 1
    line = _verdict(capsys.readouterr().out)
    assert line.startswith("NOT certified: ") and "required op MUL" in line and "unsupported" in line, line


def test_require_partial_op_fails_and_names_it(addonly, capsys):
    # ADD passes its f32/f16 cases but declines the block types: a requirement asks for all of them
    assert cli(["conformance", "--backend", addonly, "--op", "ADD", "-q", "--require", "ADD"]) == 1
    assert "required op ADD" in _verdict(capsys.readouterr().out)


def test_require_op_outside_the_run_fails(capsys):
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "-q", "--require", "MUL"]) == 1
    assert "required op MUL has no cases in this run" in _verdict(capsys.readouterr().out)


def test_require_met_on_the_reference(capsys):
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "--op", "VIEW", "-q", "--require-all"]) == 0
    line = _verdict(capsys.readouterr().out)
    assert line == f"certified: {len(cases_for('ADD'))} cases on 1 ops; 0 unsupported (numpy)"


def test_nothing_passed_never_exits_zero(addonly, capsys):
    # only views: they pass on any backend, so they certify nothing
    assert cli(["conformance", "--backend", addonly, "--op", "RESHAPE", "--op", "MUL", "-q"]) == 1
    assert _verdict(capsys.readouterr().out).startswith("NOT certified: no case passed")


def test_grad_mode_with_nothing_passed_exits_nonzero(addonly, capsys):
    assert cli(["conformance", "--backend", addonly, "--mode", "grad", "--op", "MUL", "-q"]) == 1
    assert _verdict(capsys.readouterr().out).startswith("NOT certified: no case passed")


def test_unknown_required_op_is_a_clear_error(capsys):
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "--require", "NOPE"]) == 2
    assert "unknown op 'NOPE'" in capsys.readouterr().err


# ------------------------------------------------------------------ conformance that talks while it works
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rows_stream_before_the_table_and_a_bar_on_a_terminal(monkeypatch, capsys):
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "--op", "MUL", "--in-process"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("op "))
    streamed = [ln.split() for ln in lines[:header] if ln.strip()]
    assert streamed == [["ADD", "numpy", "ok", f"{len(cases_for('ADD'))}/{len(cases_for('ADD'))}"],
                        ["MUL", "numpy", "ok", f"{len(cases_for('MUL'))}/{len(cases_for('MUL'))}"]]
    total = len(cases_for("ADD")) + len(cases_for("MUL"))
    assert "conformance: 100%" in err.getvalue() and f"{total}/{total}" in err.getvalue(), err.getvalue()


def test_quiet_streams_no_rows(capsys):
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "-q"]) == 0
    out = capsys.readouterr().out
    assert not any(ln.startswith("ADD ") for ln in out.splitlines()), out


def test_scaffold_pins_the_interface_plugins_md_advises(tmp_path, capsys):
    assert cli(["new-backend", "mine", "--dir", str(tmp_path / "prism-mine")]) == 0
    text = (tmp_path / "prism-mine" / "pyproject.toml").read_text()
    assert '"prism-tensor>=0.1,<0.2"' in text, text
    assert pc.__version__.startswith("0.1."), pc.__version__  # this Prism satisfies the pin it writes


def test_pytest_plugin_ends_with_a_summary_table_not_bare_skips(tmp_path):
    (tmp_path / "addonly_pytest.py").write_text(
        "import prism_core as pc\n"
        "class AddOnly(pc.Backend):\n"
        "    name, version = 'addonly', 'test'\n"
        "    def __init__(self):\n"
        "        self.kernels = {'ADD': pc.backend('numpy').kernels['ADD']}\n"
        "mod = type(pc)('addonly_reg')\n"
        "mod.prism_register_backends = pc.hookimpl(lambda: [AddOnly()])\n"
        "pc.REGISTRY.register(mod, 'addonly_reg')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "addonly_pytest",
                        "--pyargs", "prism_core.conformance", "--prism-backend", "addonly", "--prism-op", "MUL",
                        "--prism-op", "ADD", "-k", "test_conformance"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "s" not in lines[0], lines[0]  # unsupported cases print no bare s
    i = next(k for k, ln in enumerate(lines) if "prism conformance" in ln)
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines[i + 2:i + 4]}
    n_block = sum(map(reads_block_types, cases_for("ADD")))
    assert rows["MUL"] == ["addonly", "forward", "0", "0", str(len(cases_for("MUL")))]
    assert rows["ADD"] == ["addonly", "forward", str(len(cases_for("ADD")) - n_block), "0", str(n_block)]
