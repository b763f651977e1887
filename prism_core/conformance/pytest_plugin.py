"""pytest plugin (entry point ``pytest11``): run the conformance suite on a backend.

    pytest --pyargs prism_core.conformance --prism-backend NAME [--prism-op OP ...]
           [--prism-random N --prism-seed S] [--prism-timeout SECONDS]

Any test that takes the ``prism_case`` (``prism_grad_case``) fixture is parametrised
over the forward (gradient) cases and
``prism_backend`` over the backends named with ``--prism-backend`` (``all`` for every
available one). Unsupported cases are skipped with the reason, never passed.
``--prism-random N`` replaces the fixed forward cases by N random cases per op (see
:mod:`prism_core.conformance.random_cases`); ``--prism-timeout`` is the per-case limit
(default 120 s, 0 for none).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prism", "Prism conformance")
    group.addoption("--prism-backend", action="append", default=[], metavar="NAME",
                    help="backend to certify (repeatable; 'all' = every available backend)")
    group.addoption("--prism-op", action="append", default=[], metavar="OP",
                    help="restrict the conformance cases to these op keys (repeatable)")
    group.addoption("--prism-random", type=int, default=None, metavar="N",
                    help="instead of the fixed forward cases, N random cases per op (elementwise, matmul, "
                         "softmax and norm families)")
    group.addoption("--prism-seed", type=int, default=0, metavar="S", help="seed of --prism-random (default 0)")
    group.addoption("--prism-timeout", type=float, default=None, metavar="SECONDS",
                    help="per-case time limit for the backend under test (default 120; 0: none)")


def _backend_names(config: pytest.Config) -> list[str]:
    from ..registry import backends
    names = config.getoption("prism_backend") or []
    if "all" in names:
        return [b.name for b in backends() if b.available]
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    ops = metafunc.config.getoption("prism_op") or None
    if "prism_case" in metafunc.fixturenames:
        n = metafunc.config.getoption("prism_random")
        if n is not None:
            from .random_cases import random_cases
            cases = random_cases(ops, n, metafunc.config.getoption("prism_seed"))
        else:
            from .cases import all_cases
            cases = all_cases(ops)
        metafunc.parametrize("prism_case", cases, ids=[c.name for c in cases])
    if "prism_grad_case" in metafunc.fixturenames:
        from .gradcheck import grad_cases
        cases = grad_cases(ops)
        metafunc.parametrize("prism_grad_case", cases, ids=[c.name for c in cases])
    if "prism_backend_name" in metafunc.fixturenames:
        names = _backend_names(metafunc.config)
        metafunc.parametrize("prism_backend_name", names, ids=names)


@pytest.fixture
def prism_backend(prism_backend_name: str):
    from ..registry import backend
    return backend(prism_backend_name)


@pytest.fixture
def prism_timeout(request: pytest.FixtureRequest) -> float | None:
    """The per-case time limit in seconds (None: run in the test's own thread)."""
    from .runner import DEFAULT_TIMEOUT
    t = request.config.getoption("prism_timeout")
    return DEFAULT_TIMEOUT if t is None else (t or None)
