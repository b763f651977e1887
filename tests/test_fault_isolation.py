"""Fault isolation of the conformance suite: faulty in-process plugins next to the real backends.

One plugin module registers one backend per fault, each implementing ADD badly (and
nothing else). A single ``prism conformance --backend all`` run (in-process, through
``prism_core.cli.main``) must report every fault on its own backend and case, keep the
real backends' results exactly as in a clean run, and leave the host process working.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import types

import numpy as np
import pytest
from helpers import reads_block_types

import prism_core as pc
from prism_core.cli import main as cli
from prism_core.conformance import cases_for
from prism_core.conformance.runner import FAIL, PASS, TIMEOUT, abandoned_threads, run

RELEASE = threading.Event()  # set at teardown: lets the hung kernel's thread finish
HANG_LIMIT = 2  # the hanging backend's per-case limit: it blocks until RELEASE, so it always overruns this
GENEROUS = 120  # every other backend's: no busy machine makes a real ADD case that slow


def _add(node):
    node.host()[...] = node.src[0].host() + np.tile(
        node.src[1].host(), tuple(x // y for x, y in zip(node.host().shape, node.src[1].host().shape)))


def _raises(node):
    raise RuntimeError("kernel exploded")


def _replaces_memory(node):
    node.base._storage = np.zeros(node.nbytes, np.uint8)  # a new buffer instead of writing the old one


def _changes_metadata(node):
    _add(node)
    node.ne = (node.ne[0] // 2, *node.ne[1:])


def _wrong_shape(node):
    node.host()[...] = np.zeros(node.host().shape[::-1], node.host().dtype)  # transposed: cannot broadcast


def _wrong_layout(node):
    a, b = node.src[0].host(), node.src[1].host()
    res = a + np.tile(b, tuple(x // y for x, y in zip(a.shape, b.shape)))
    node.host()[...] = res.reshape(-1)[::-1].reshape(res.shape)  # right shape, elements in the wrong place


def _overruns(node):
    _add(node)
    buf = node.storage()
    raw = np.ndarray((buf.size + 8,), np.uint8, buffer=buf.base, offset=node.ctx.guard_bytes)
    raw[-4:] = 0  # just past the end of the output


def _writes_input(node):
    _add(node)
    node.src[1].host()[...] = 0


def _hangs(node):
    RELEASE.wait()  # set only after the run: it cannot finish within any limit, however slow the machine


def _claims_then_refuses(node):
    raise pc.Unsupported("not this layout after all")


def _exits(node):
    raise SystemExit(3)  # must fail the case, not end the host


def _returns(node):
    return node.src[0].host() + node.src[1].host()  # a return value is ignored: the output stays zero


FAULTS = {  # backend name -> (kernel, what the failure message says)
    "f_raises": (_raises, "raised RuntimeError: kernel exploded"),
    "f_replaces": (_replaces_memory, "replaced the memory of"),
    "f_metadata": (_changes_metadata, "changed the metadata of"),
    "f_shape": (_wrong_shape, "raised ValueError"),
    "f_values": (_wrong_layout, "output exceeds the bound"),
    "f_overrun": (_overruns, "wrote outside its output"),
    "f_input": (_writes_input, "wrote into its input"),
    "f_hangs": (_hangs, f"did not finish within {HANG_LIMIT} s"),
    "f_refuses": (_claims_then_refuses, "claimed support, then raised Unsupported: not this layout"),
    "f_exits": (_exits, "raised SystemExit: 3"),
    "f_returns": (_returns, "left all zeros"),
}


class _Faulty(pc.Backend):
    version = "fault"

    def __init__(self, name, kernel):
        self.name = name
        self.kernels = {"ADD": kernel}


class _SupportsRaises(pc.Backend):
    name = "f_supports"
    version = "fault"
    kernels = {"ADD": _add}

    def supports(self, node):
        raise KeyError("supports() exploded")


def _faulty_backends() -> list[pc.Backend]:
    return [_Faulty(n, k) for n, (k, _) in FAULTS.items()] + [_SupportsRaises()]


def _plugin() -> types.ModuleType:
    """A module built in memory: a worker process cannot load it, so the CLI runs its backends
    in-process (worker threads)."""
    mod = types.ModuleType("prism_test_faults")
    mod.prism_register_backends = pc.hookimpl(_faulty_backends)
    return mod


class FaultsPlugin:
    """The same plugin as a picklable object (its class is importable from this test module):
    the CLI runs its backends in worker processes."""

    @pc.hookimpl
    def prism_register_backends(self) -> list[pc.Backend]:
        return _faulty_backends()


PLUGIN_FORMS = {"in-process": _plugin, "worker-process": FaultsPlugin}


@pytest.fixture
def faulty(monkeypatch):
    monkeypatch.delenv(pc.plugin.registry.ENV_BACKEND, raising=False)
    RELEASE.clear()
    pc.REGISTRY.register(_plugin(), "prism_test_faults")
    yield
    pc.REGISTRY.unregister("prism_test_faults")
    RELEASE.set()


def _real_backends() -> list[str]:
    # ggml is a peer whose documented differences fail some cases (docs/backends/ggml.md): not a port that stands
    return [i.name for i in pc.backends() if i.available and i.name != "ggml"]


def _report(tmp_path, argv) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    rc = cli(["conformance", *argv, "--report", "json", str(path), "--report", "markdown", str(tmp_path / "r.md")])
    return rc, json.loads(path.read_text())


@pytest.mark.parametrize("form", list(PLUGIN_FORMS))
def test_every_fault_is_reported_per_case_and_the_real_backends_stand(faulty, tmp_path, capsys, form):
    pc.REGISTRY.unregister("prism_test_faults")  # a clean run first, for comparison
    real = _real_backends()
    rc, clean = _report(tmp_path, ["--backend", "all", "--op", "ADD", "--op", "MUL"])
    assert rc in (0, 1)
    pc.REGISTRY.register(PLUGIN_FORMS[form](), "prism_test_faults")
    capsys.readouterr()

    rc, rep = _report(tmp_path, ["--backend", "all", "--op", "ADD", "--op", "MUL", "--timeout", str(GENEROUS),
                                 "--timeout", f"f_hangs={HANG_LIMIT}"])
    out = capsys.readouterr().out
    assert rc == 1
    assert ("running f_raises in this process" in out) == (form == "in-process")
    by = {b["name"]: b for b in rep["backends"]}
    assert set(by) - {"ggml"} == set(real) | set(FAULTS) | {"f_supports"}  # ggml: see _real_backends
    assert rep["timeout_s"] == GENEROUS and by["f_hangs"]["timeout_s"] == HANG_LIMIT
    assert by["numpy"]["timeout_s"] == GENEROUS
    for name in real:  # the real backends' results are exactly those of the clean run
        (before,) = [b for b in clean["backends"] if b["name"] == name]
        assert by[name]["ops"] == before["ops"] and by[name]["failures"] == before["failures"]
    n_add = len(cases_for("ADD"))
    n_plain = sum(not reads_block_types(c) for c in cases_for("ADD"))  # the faulty backends claim no block types
    n_unsup = n_add - n_plain + len(cases_for("MUL"))
    for name, (_, expect) in FAULTS.items():
        b = by[name]
        assert b["ops"]["MUL"]["status"] == "unsupported", name  # only ADD is claimed
        assert b["ops"]["ADD"]["status"] == "fail", name
        assert b["ops"]["ADD"]["passed"] == 0, name
        first = b["failures"][0]
        assert first["op"] == "ADD" and expect in first["message"], (name, first["message"])
        assert "nb=" in first["detail"], name  # the case's strides are part of the report
        assert f"{first['name']} on {name}: " in out
    hung = by["f_hangs"]
    assert hung["summary"]["timeout"] == n_plain and hung["summary"]["failed"] == 0
    assert all(f["message"].startswith("not run: an earlier case of ADD") for f in hung["failures"][1:])
    values = by["f_values"]["failures"][0]  # a metric failure names the error, bound and worst element
    assert values["nmse"] > values["bound"] and len(values["worst"]["index"]) == 4
    assert values["worst"]["expected"] != values["worst"]["got"]
    assert by["f_supports"]["failures"][0]["message"].startswith("supports() raised KeyError")
    assert f"f_hangs: 0 passed, 0 failed, {n_unsup} unsupported cases, {n_plain} timed out" in out
    assert f"FAIL {n_plain}/{n_add} ({n_plain} timeout)" in out
    md = (tmp_path / "r.md").read_text()
    assert re.search(r"^\| ADD \|.* ok \d+/\d+", md, re.M)  # a real backend's cell
    assert f"**FAIL** {n_plain}/{n_add}" in md and "| f_hangs | fault |" in md
    assert f"**f_values** `{values['name']}`: FAIL nmse " in md and "worst element [" in md

    # the host is intact: the real backends still pass everything, in this very process
    RELEASE.set()
    for name in real:
        plain = [c for c in cases_for("ADD") + cases_for("SOFT_MAX") if "+f32" not in c.desc]  # no block types
        results = run(pc.backend(name), plain)
        assert all(r.status == PASS for r in results), name
    for t in abandoned_threads():
        t.join(GENEROUS)  # released: the hung kernel returns and its abandoned worker exits
    assert not abandoned_threads()


def test_hang_does_not_block_the_next_backend(faulty):
    results = run(pc.backend("f_hangs"), cases_for("ADD")[:2], timeout=0.3)  # blocked until RELEASE: always late
    assert [r.status for r in results] == [TIMEOUT, TIMEOUT]
    assert "abandoned thread" in results[0].message and results[1].message.startswith("not run")
    after = run(pc.backend("numpy"), cases_for("ADD")[:2], timeout=GENEROUS)
    assert [r.status for r in after] == [PASS, PASS]


def test_run_case_describes_each_fault(faulty):
    from prism_core.conformance.runner import run_case
    case = cases_for("ADD")[0]
    for name, (_, expect) in FAULTS.items():
        if name == "f_hangs":
            continue
        r = run_case(case, pc.backend(name), timeout=GENEROUS)
        assert r.status == FAIL and expect in r.describe(), r.describe()
        assert r.case.name in r.describe() and "src0: f32 ne=[10,5,4,3]" in r.describe()


def test_timeout_zero_runs_in_the_calling_thread(faulty):
    seen = []

    class Here(pc.Backend):
        name = "here"
        kernels = {"ADD": lambda n: (seen.append(threading.current_thread()), _add(n))}

    assert run(Here(), cases_for("ADD")[:1], timeout=0)[0].status == PASS
    assert seen == [threading.current_thread()]
    assert run(Here(), cases_for("ADD")[:1])[0].status == PASS  # default: a worker thread
    assert seen[-1] is not threading.current_thread()


# ---------------------------------------------------------------- interface versions
def _future_plugin(calls: list) -> types.ModuleType:
    class Future(pc.Backend):
        name = "future"
        version = "9.0"
        priority = 99
        interface_version = pc.INTERFACE_VERSION + 998

        def availability(self):
            calls.append("availability")
            return True, ""

        def supports(self, node):
            calls.append("supports")
            return True

    mod = types.ModuleType("prism_test_future")
    mod.prism_register_backends = pc.hookimpl(lambda: [Future()])
    return mod


def test_incompatible_interface_is_reported_not_half_loaded(monkeypatch, capsys):
    monkeypatch.delenv(pc.plugin.registry.ENV_BACKEND, raising=False)
    calls: list = []
    pc.REGISTRY.register(_future_plugin(calls), "prism_test_future")
    try:
        want = f"built for plugin interface {pc.INTERFACE_VERSION + 998}, this Prism has {pc.INTERFACE_VERSION}"
        assert cli(["info"]) == 0
        out = capsys.readouterr().out
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("future")]
        assert f"UNAVAILABLE: {want}" in line and f"interface={pc.INTERFACE_VERSION + 998}" in line
        assert f"(plugin interface {pc.INTERFACE_VERSION})" in out.splitlines()[0]
        (info,) = [i for i in pc.backends() if i.name == "future"]
        assert info.interface_version == pc.INTERFACE_VERSION + 998 and not info.available

        assert cli(["conformance", "--backend", "all", "--op", "ADD"]) in (0, 1)  # 1: a real backend failing ADD
        out = capsys.readouterr().out
        assert f"skipping future: unavailable ({want})" in out
        assert "future" not in out.splitlines()[1]  # no column for it
        assert cli(["conformance", "--backend", "future", "--op", "ADD"]) == 1  # unavailable here: not a usage error
        assert f"backend 'future' is unavailable: {want}" in capsys.readouterr().err
        assert pc.backend().name != "future"
        assert calls == []  # neither availability() nor supports() of a mismatched backend ever ran
    finally:
        pc.REGISTRY.unregister("prism_test_future")
    assert "future" not in [i.name for i in pc.backends()]
    assert sys.modules.get("prism_test_future") is None


def test_in_process_run_stops_at_the_deadline(faulty):
    import time

    from prism_core.conformance.runner import NOT_RUN
    cases = cases_for("ADD")[:3]
    results = run(pc.backend("numpy"), cases, deadline=time.monotonic() - 1)
    assert [r.status for r in results] == [NOT_RUN] * 3 and results[0].failed
    assert results[0].message == "not run: the overall budget ran out"
