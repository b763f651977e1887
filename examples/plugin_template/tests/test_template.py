"""The template's own tests. Run with the package installed:

    pytest examples/plugin_template/tests
    pytest --pyargs prism_core.conformance --prism-backend template   # the shipped suite
"""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc
from prism_core.conformance import FAIL, PASS, UNSUPPORTED, all_cases, cases_for, run

IMPLEMENTED = {"ADD", "SUB", "MUL", "DIV", "MUL_MAT"}


@pytest.fixture(scope="module")
def be():
    return pc.backend("template")


def test_registered_through_the_entry_point(be):
    (info,) = [i for i in pc.backends() if i.name == "template"]
    assert info.available and info.plugin == "template (prism_template)"
    assert info.interface_version == pc.INTERFACE_VERSION
    assert pc.backend().name != "template"  # priority 5: never the default over the reference


def test_broadcast_add_and_fallback(be):
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = ctx.from_numpy(np.array([10, 20, 30], np.float32))
    y = pc.sqrt(pc.add(a, b))  # SQRT is not the template's: it falls back to the reference
    report = pc.compute(y, be)
    assert report.fell_back == ["SQRT"]
    np.testing.assert_allclose(y.numpy(), np.sqrt(np.arange(6).reshape(2, 3) + [10, 20, 30]), rtol=1e-6)


def test_mul_mat_of_a_transposed_view(be):
    ctx = pc.Context()
    w = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    x = ctx.from_numpy(np.ones((4, 2), np.float32))
    y = pc.mul_mat(w, pc.transpose(x))  # x^T is a strided view: no copy is made
    assert pc.compute(y, be).fallbacks == []
    np.testing.assert_allclose(y.numpy(), np.ones((2, 4)) @ np.arange(12).reshape(3, 4).T)


def test_certified_for_exactly_what_it_implements(be):
    results = run(be, all_cases())
    assert not [r.describe() for r in results if r.status == FAIL]
    passed = {r.case.key for r in results if r.status == PASS and not pc.OPS[r.case.key].view_only}
    assert passed == IMPLEMENTED
    for key in IMPLEMENTED:
        bf16 = [r for r in results if r.case.key == key and "bf16" in r.case.desc]
        assert bf16 and all(r.status == UNSUPPORTED for r in bf16)  # narrowed by supports()
    assert all(r.status == UNSUPPORTED for r in results if r.case.key == "SOFT_MAX")
    assert len(cases_for("ADD")) > 10
