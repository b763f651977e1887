"""pytest plugin (entry point ``pytest11``): run the conformance suite on a backend.

    pytest --pyargs prism_core.conformance --prism-backend NAME [--prism-op OP ...]

Any test that takes the ``prism_case`` (``prism_grad_case``) fixture is parametrised
over the forward (gradient) cases and
``prism_backend`` over the backends named with ``--prism-backend`` (``all`` for every
available one). Unsupported cases are skipped with the reason, never passed.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prism", "Prism conformance")
    group.addoption("--prism-backend", action="append", default=[], metavar="NAME",
                    help="backend to certify (repeatable; 'all' = every available backend)")
    group.addoption("--prism-op", action="append", default=[], metavar="OP",
                    help="restrict the conformance cases to these op keys (repeatable)")


def _backend_names(config: pytest.Config) -> list[str]:
    from ..registry import backends
    names = config.getoption("prism_backend") or []
    if "all" in names:
        return [b.name for b in backends() if b.available]
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "prism_case" in metafunc.fixturenames:
        from .cases import all_cases
        cases = all_cases(metafunc.config.getoption("prism_op") or None)
        metafunc.parametrize("prism_case", cases, ids=[c.name for c in cases])
    if "prism_grad_case" in metafunc.fixturenames:
        from .gradcheck import grad_cases
        cases = grad_cases(metafunc.config.getoption("prism_op") or None)
        metafunc.parametrize("prism_grad_case", cases, ids=[c.name for c in cases])
    if "prism_backend_name" in metafunc.fixturenames:
        names = _backend_names(metafunc.config)
        metafunc.parametrize("prism_backend_name", names, ids=names)


@pytest.fixture
def prism_backend(prism_backend_name: str):
    from ..registry import backend
    return backend(prism_backend_name)
