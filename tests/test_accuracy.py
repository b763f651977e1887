"""The per-element check beside NMSE, accuracy grades, and the shipped kernel mutations: every
mutation of the reference must be caught by the suite (each runs only its op's cases)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import prism_core.conformance.runner as runner
from prism_core import F16, F32, I32
from prism_core.conformance.accuracy import EXACT, WITHIN_4_ULP, WITHIN_BOUND, element_bound, ulp_errors
from prism_core.conformance.cases import cases_for
from prism_core.conformance.mutations import MUTATIONS, caught, mutant, mutation_score
from prism_core.conformance.report import certificate, op_grade, table
from prism_core.conformance.runner import PASS, CaseResult, compare, run
from prism_core.ops.table import OPS


def test_ulp_errors_on_hand_worked_values():
    one_ulp = 1 + 2.0 ** -23  # the next float32 after 1
    assert ulp_errors(np.array([one_ulp]), np.array([1.0]), F32)[0] == pytest.approx(1.0)
    assert ulp_errors(np.array([1.0009765625]), np.array([1.0]), F16)[0] == pytest.approx(1.0)  # 1 + 2^-10
    # an element near zero is measured at the output's scale: rms([0, 3, 4]) = 5 / sqrt(3)
    err = ulp_errors(np.array([1e-6, 3.0, 4.0]), np.array([0.0, 3.0, 4.0]), F32)
    assert err[0] == pytest.approx(1e-6 / (2.0 ** -23 * 5 / 3 ** 0.5)) and err[1] == err[2] == 0
    # NaN and infinities are compare()'s business (matched there), not counted here
    assert ulp_errors(np.array([np.nan, np.inf]), np.array([np.nan, np.inf]), F32).tolist() == [0, 0]


def test_one_masked_element_in_a_long_softmax_row_passes_nmse_but_not_the_element_check():
    """A 4103-wide softmax row of spread scores with its median element wrongly masked: NMSE
    stays far under SOFT_MAX's 1e-6 while that element is wrong by all of its value."""
    n = 4103
    x = np.random.default_rng(0).uniform(-8, 8, n)
    ref = np.exp(x) / np.exp(x).sum()
    got = ref.copy()
    got[int(np.argsort(ref)[n // 2])] = 0.0
    got /= got.sum()
    ok, _, err, _ = compare(got.astype(np.float32), ref, OPS["SOFT_MAX"].nmse)
    assert ok and err < 1e-6
    assert ulp_errors(got.astype(np.float32), ref, F32).max() > 1000 > element_bound(OPS["SOFT_MAX"], F32)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_is_caught(m):
    found, why = caught(m)
    assert found, f"{m.name} ({m.what}) slipped through: {why}"


def test_mutation_score():
    assert mutation_score() == (len(MUTATIONS), len(MUTATIONS), [])


@pytest.mark.parametrize("name, pick", [("gelu-tanh-for-erf", lambda c: ",f32," in c.desc),
                                        ("rms-norm-eps-outside-sqrt", lambda c: "eps=0.0001" in c.desc)])
def test_near_misses_nmse_alone_lets_through(name, pick, monkeypatch):
    """On these cases the mutation passes NMSE (ggml's only check) and fails the per-element one."""
    (m,) = [m for m in MUTATIONS if m.name == name]
    cases = [c for c in cases_for(m.key) if pick(c)]
    assert cases
    with_check = run(mutant(m), cases, timeout=None)
    assert all(r.status == "fail" and "ulp off" in r.message for r in with_check), [r.describe() for r in with_check]
    monkeypatch.setattr(runner, "element_bound", lambda *a, **k: None)
    assert all(r.status == PASS for r in run(mutant(m), cases, timeout=None))


def _result(status=PASS, ulp=None, exact=False):
    case = cases_for("ADD")[0]
    return CaseResult(case, "x", status, ulp=ulp, exact=exact)


def test_grades_are_the_worst_over_the_passed_cases():
    assert op_grade([_result(exact=True, ulp=0.0), _result(exact=True, ulp=0.0)]) == EXACT
    assert op_grade([_result(exact=True, ulp=0.0), _result(ulp=3.5)]) == WITHIN_4_ULP
    assert op_grade([_result(ulp=3.5), _result(ulp=7.0)]) == WITHIN_BOUND
    assert op_grade([_result(status="unsupported")]) is None
    results = {"x": [_result(ulp=3.5)]}
    ops = certificate(results, ["ADD"], mode="forward")["backends"][0]["ops"]
    assert json.loads(json.dumps(ops))["ADD"]["grade"] == WITHIN_4_ULP and ops["ADD"]["worst_ulp"] == 3.5
    assert "1 ops within 4 ulp" in table(results, ["ADD"], verbose=True)


def test_block_types_and_integer_results_have_no_element_bound():
    assert element_bound(OPS["MUL_MAT"], F32, reads_blocks=True) is None
    assert element_bound(OPS["ARGMAX"], I32) is None
    assert element_bound(OPS["GELU"], F32) == 8 and element_bound(OPS["GELU"], F16) == 2
