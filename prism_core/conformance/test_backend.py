"""The conformance suite as a pytest module, shipped inside the package:

    pytest --pyargs prism_core.conformance --prism-backend NAME [-n auto]

Forward cases (``test_conformance``) and gradient cases (``test_gradients``); select one
with ``-k test_conformance`` / ``-k test_gradients``. ``test_model`` (per cache type and prompt)
and ``test_model_sweep`` (the node sweep) certify a model given with ``--prism-model`` (deselected
without it). A case the backend does not support is skipped with the reason; a failure, a
timeout or a crash fails the test with the case, the error against its bound and the worst
element (or the signal and where it happened).
"""

from __future__ import annotations

import pytest

from prism_core.conformance.runner import PASS, UNSUPPORTED


def test_conformance(prism_backend, prism_case, prism_runner) -> None:
    result = prism_runner.forward(prism_backend, prism_case)
    if result.status == UNSUPPORTED:
        pytest.skip(f"unsupported on {prism_backend.name}: {result.message}")
    assert result.status == PASS, result.describe()


def test_gradients(prism_backend, prism_grad_case, prism_runner) -> None:
    result = prism_runner.grad(prism_backend, prism_grad_case)
    if result.status == UNSUPPORTED:
        pytest.skip(f"unsupported on {prism_backend.name}: {result.message}")
    assert result.status == PASS, result.describe()


def test_model(prism_backend, prism_model_case, prism_model_runner, request) -> None:
    from prism_core.conformance.model_report import prompt_row
    r, where = prism_model_runner.check(prism_backend, prism_model_case)
    request.node.user_properties.append(("prism_model", prompt_row(r)))
    failed = r.error or "; ".join(f"{c.kind}: {c.message}" for c in r.checks if not c.passed)
    assert r.passed, failed + (f"; first node out of its op's bounds: {where}" if where else "")


def test_model_sweep(prism_backend, prism_model_runner) -> None:
    """The model's graph node by node from the reference's inputs: every node within its op's bounds."""
    findings = prism_model_runner.sweep(prism_backend)
    assert not findings, f"{len(findings)} nodes out of their op's bounds; the first: {findings[0]}"
