"""The conformance suite as a pytest module, shipped inside the package:

    pytest --pyargs prism_core.conformance --prism-backend NAME
"""

from __future__ import annotations

import pytest

from prism_core.conformance.gradcheck import run_grad_case
from prism_core.conformance.runner import FAIL, UNSUPPORTED, run_case


def test_conformance(prism_backend, prism_case) -> None:
    result = run_case(prism_case, prism_backend)
    if result.status == UNSUPPORTED:
        pytest.skip(f"unsupported on {prism_backend.name}: {result.message}")
    assert result.status != FAIL, result.describe()


def test_gradients(prism_backend, prism_grad_case) -> None:
    result = run_grad_case(prism_grad_case, prism_backend)
    if result.status == UNSUPPORTED:
        pytest.skip(f"unsupported on {prism_backend.name}: {result.message}")
    assert result.status != FAIL, result.describe()
