"""The conformance suite as a pytest module, shipped inside the package:

    pytest --pyargs prism_core.conformance --prism-backend NAME [-n auto]

Forward cases (``test_conformance``) and gradient cases (``test_gradients``); select one
with ``-k test_conformance`` / ``-k test_gradients``. A case the backend does not support
is skipped with the reason; a failure, a timeout or a crash fails the test with the case,
the error against its bound and the worst element (or the signal and where it happened).
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
