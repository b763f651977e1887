"""Replayable failures: every failing or unsupported result carries a stable case id and the
command that re-runs exactly that case, which prints its inputs and both outputs."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import prism_core as pc
from prism_core.cli import main
from prism_core.conformance.cases import case_id, cases_for
from prism_core.conformance.random_cases import random_cases_for
from prism_core.conformance.replay import find_case, replay
from prism_core.conformance.runner import run


def _neg_off_by_one(node):
    node.host()[...] = -node.src[0].host() + np.float32(1)  # a wrong NEG kernel


class WrongNeg(pc.Backend):
    name = "wrongneg"
    version = "0"
    kernels = {"NEG": _neg_off_by_one}


def test_case_ids_are_stable_and_name_exactly_one_case():
    cases = cases_for("SOFT_MAX")
    ids = [case_id(c) for c in cases]
    assert len(set(ids)) == len(ids)
    # the id depends only on the case's own description (CRC-32), not on its position
    c = cases[3]
    assert case_id(c) == f"SOFT_MAX:{zlib.crc32(c.desc.encode()):08x}"
    assert find_case(case_id(c)).name == c.name
    assert find_case(case_id(c).lower()).name == c.name  # the key in any case
    r = random_cases_for("ADD", 3, seed=7)
    assert case_id(r[2]) == "ADD:r7.2" and find_case("ADD:r7.2").name == r[2].name


def test_bad_case_ids_are_clear_errors():
    with pytest.raises(pc.InvalidArgument, match="malformed case id"):
        find_case("SOFT_MAX")
    with pytest.raises(pc.InvalidArgument, match="no case 'ADD:00000000'"):
        find_case("ADD:00000000")
    with pytest.raises(pc.InvalidArgument, match="unknown op"):
        find_case("NOPE:00000000")


def test_a_failure_report_line_replays_to_the_same_failure():
    results = run(WrongNeg(), cases_for("NEG"), timeout=None)
    failed = [r for r in results if r.failed]
    assert failed, "the off-by-one NEG must fail"
    r = failed[0]
    assert f"replay: prism conformance --backend wrongneg --case {r.case_id}" in r.describe()
    assert r.to_dict()["replay"] == f"prism conformance --backend wrongneg --case {r.case_id}"
    text, again = replay(r.case_id, WrongNeg())
    assert again.status == r.status and again.err == pytest.approx(r.err)
    assert "input a:" in text and "expected (numpy):" in text and "actual (wrongneg):" in text
    # the printed actual values are the expected ones plus one (the injected mistake)
    ctx = pc.Context()
    built = find_case(r.case_id).build(ctx, np.random.default_rng(find_case(r.case_id).seed))
    x0 = float(built.out.src[0].numpy().reshape(-1)[0])
    assert f"{-x0 + 1:.6f}"[:7] in text.split("actual (wrongneg):")[1]


def test_cli_replays_one_case_and_lists_unsupported_reasons_with_v(capsys):
    cid = case_id(cases_for("NEG")[0])
    assert main(["conformance", "--backend", "numpy", "--case", cid]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"case {cid}: NEG(") and "verdict:" in out and ": PASS" in out
    assert main(["conformance", "--case", cid]) == 2  # which backend?
    assert "give --backend NAME once" in capsys.readouterr().err


def test_verbose_table_lists_unsupported_cases_with_reasons():
    from prism_core.conformance.report import certificate, table, to_json
    results = {"wrongneg": run(WrongNeg(), cases_for("ABS"), timeout=None)}
    assert all(r.status == "unsupported" for r in results["wrongneg"])
    quiet, loud = table(results, ["ABS"]), table(results, ["ABS"], verbose=True)
    assert "-v lists them" in quiet and "does not support ABS" not in quiet
    r = results["wrongneg"][0]
    assert f"{r.case.name} on wrongneg: UNSUPPORTED: does not support ABS" in loud
    assert f"replay: prism conformance --backend wrongneg --case {r.case_id}" in loud
    cert = json.loads(to_json(certificate(results, ["ABS"], mode="forward")))
    assert cert["backends"][0]["ops"]["ABS"]["unsupported_reasons"]
