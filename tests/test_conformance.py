"""The conformance suite itself: coverage of the op table, and that it catches bad backends."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers import reads_block_types, slow_on_numba

import prism_core as pc
from prism_core.cli import main as cli
from prism_core.conformance import FAIL, PASS, UNSUPPORTED, all_cases, cases_for, run, run_case
from prism_core.conformance.runner import compare, nmse


def test_every_op_has_reference_kernel_and_cases():
    ref = pc.backend("numpy")
    for key, d in pc.OPS.items():
        assert cases_for(key), f"{key} has no conformance cases"
        if not d.view_only:
            assert key in ref.kernels, f"{key} has no reference kernel"


def test_cases_cover_f16_non_contiguous_and_inplace():
    names = [c.name for c in all_cases()]
    assert any("f16" in n for n in names)
    assert any("permuted" in n for n in names) and any("rowgap" in n for n in names)
    for key, d in pc.OPS.items():
        if d.inplace:
            assert any("inplace" in c.desc for c in cases_for(key)), f"{key}: no in-place case"


# ggml (prism_ggml) is a peer, not a port: its differences from the reference are documented in
# docs/backends/ggml.md and checked case by case in tests/test_ggml_backend.py
@pytest.mark.parametrize("name", slow_on_numba(b.name for b in pc.backends() if b.available and b.name != "ggml"))
def test_installed_backend_passes_every_case(name):
    results = run(pc.backend(name), all_cases())
    failures = [r.describe() for r in results if r.status == FAIL]
    assert not failures, "\n".join(failures[:20])
    if pc.backend(name).is_reference:
        assert all(r.status == PASS for r in results)


def test_nmse_matches_definition():
    a, b = np.array([1.0, 2.0, 2.0]), np.array([1.0, 2.0, 3.0])
    assert nmse(a, b) == pytest.approx(1.0 / 9.0)  # sum (a-b)^2 / sum a^2, a = backend under test
    assert nmse(np.zeros(3), np.zeros(3)) == 0.0
    assert not compare(np.array([np.nan]), np.array([1.0]), 1.0)[0]
    assert not compare(np.array([np.inf]), np.array([-np.inf]), 1.0)[0]
    assert compare(np.array([-np.inf, 1.0]), np.array([-np.inf, 1.0]), 0.0)[0]


# ------------------------------------------------------------------ bad backends are caught
class _Faulty(pc.Backend):
    version = "test"

    def __init__(self, name, add_kernel):
        self.name = name
        self.kernels = {"ADD": add_kernel}


def _sub_instead(node):
    node.host()[...] = node.src[0].host() - node.src[1].host()  # the wrong op


def _overrun(node):
    buf = node.storage()
    raw = np.ndarray((buf.size + 8,), np.uint8, buffer=buf.base, offset=node.ctx.guard_bytes)
    raw[-4:] = 0  # scribble just past the end of the output
    node.host()[...] = node.src[0].host() + node.src[1].host()


def _raises(node):
    raise ZeroDivisionError("boom")


def _claims_then_refuses(node):
    raise pc.Unsupported("not this layout")


@pytest.mark.parametrize("kernel,expect", [(_sub_instead, "bound"), (_overrun, "outside its output"),
                                           (_raises, "ZeroDivisionError"), (_claims_then_refuses, "claimed support")])
def test_faulty_kernels_fail_their_cases(kernel, expect):
    case = next(c for c in cases_for("ADD") if c.desc.startswith("a=[10,5,4,3],b=[10,5,4,3],f32/f32"))
    result = run_case(case, _Faulty("faulty", kernel))
    assert result.status == FAIL and expect in result.describe(), result.describe()


def test_partial_backend_reports_unsupported_not_pass():
    be = _Faulty("addonly", pc.backend("numpy").kernels["ADD"])
    results = run(be, cases_for("ADD") + cases_for("MUL"))
    by = {(r.case.key, r.status, reads_block_types(r.case)) for r in results}
    # its ADD kernel never claims block types: a backend must declare block_types to get them
    assert by == {("ADD", PASS, False), ("ADD", UNSUPPORTED, True), ("MUL", UNSUPPORTED, False)}


# ------------------------------------------------------------------ CLI and pytest plugin
def test_cli_conformance_table_and_exit_code(capsys):
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "--op", "soft_max"]) == 0
    out = capsys.readouterr().out
    assert "ADD" in out and "SOFT_MAX" in out and "numpy:" in out and "0 failed" in out


def test_cli_conformance_exits_nonzero_on_failure(capsys):
    module = type(sys)("faulty_plugin")
    module.prism_register_backends = pc.hookimpl(lambda: [_Faulty("faulty", _sub_instead)])
    pc.REGISTRY.register(module, "faulty_plugin")
    try:
        assert cli(["conformance", "--backend", "all", "--op", "ADD", "--op", "MUL"]) == 1
        out = capsys.readouterr().out
        assert "FAIL" in out and "unsupported" in out and "Failures:" in out
    finally:
        pc.REGISTRY.unregister("faulty_plugin")


def test_cli_unknown_backend_is_a_clear_error(capsys):
    assert cli(["conformance", "--backend", "nope"]) == 2
    assert "no backend named 'nope'" in capsys.readouterr().err


def test_cli_info_lists_backends(capsys):
    assert cli(["info"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "available" in out and "reference" in out


def test_shipped_pytest_plugin_runs_the_suite():
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                        "prism_core.conformance", "--prism-backend", "numpy", "--prism-op", "ADD"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    from prism_core.conformance.gradcheck import grad_cases
    assert f"{len(cases_for('ADD')) + len(grad_cases(['ADD']))} passed" in r.stdout  # forward and gradient


def test_cli_add_only_plugin_passes_add_and_shows_the_rest_unsupported(capsys):
    module = type(sys)("addonly_plugin")
    module.prism_register_backends = pc.hookimpl(lambda: [_Faulty("addonly", pc.backend("numpy").kernels["ADD"])])
    pc.REGISTRY.register(module, "addonly_plugin")
    try:
        # 1 only for ggml's documented differences (a peer, see the note above), 0 without it
        ggml = any(b.name == "ggml" and b.available for b in pc.backends())
        assert cli(["conformance", "--backend", "all"]) == (1 if ggml else 0)
        rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
        # columns: backends best first; addonly has priority 0, so it is last
        assert rows["op"][-1] == "addonly" and "numpy" in rows["op"]
        n_add = len(cases_for("ADD"))
        n_block = sum(map(reads_block_types, cases_for("ADD")))
        assert n_block > 0 and rows["ADD"][-4:] == ["ok", f"{n_add - n_block}/{n_add},", str(n_block), "unsup"]
        assert rows["MUL"][-1:] == ["unsupported"] and rows["SOFT_MAX"][-1:] == ["unsupported"]
        # view ops compute nothing, so they pass on any backend
        views = [c for k, d in pc.OPS.items() if d.view_only for c in cases_for(k)]
        assert rows["RESHAPE"][-2:] == ["core", "1/1"]
        n_pass = n_add - n_block + len(views)
        assert rows["addonly:"][:6] == [str(n_pass), "passed,", "0", "failed,",
                                        str(len(all_cases()) - n_pass), "unsupported"]
    finally:
        pc.REGISTRY.unregister("addonly_plugin")


def test_the_references_own_warnings_do_not_appear_in_a_run(monkeypatch):
    """A warning the reference raises while computing the expected values is not shown as if
    the backend under test caused it; the same warning from the tested backend still is."""
    import warnings

    import prism_numpy.kernels as ref_kernels

    from prism_core.conformance.cases import cases_for
    from prism_core.conformance.runner import run_case

    original = ref_kernels.KERNELS["SIN"]

    def noisy(n):
        warnings.warn("reference kernel warning", RuntimeWarning, stacklevel=1)
        return original(n)

    monkeypatch.setitem(ref_kernels.KERNELS, "SIN", noisy)
    case = cases_for("SIN")[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ref = pc.backend("numpy")
        r = run_case(case, ref, ref, timeout=None)  # the reference checked against itself
    assert r.status == "pass", r.describe()
    messages = [str(w.message) for w in seen]
    # once, from the side under test; never from computing the expected values
    assert messages.count("reference kernel warning") == 1, messages
