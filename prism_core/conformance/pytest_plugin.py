"""pytest plugin (entry point ``pytest11``): run the conformance suite on a backend.

    pytest --pyargs prism_core.conformance --prism-backend NAME [--prism-op OP ...]
           [--prism-random N --prism-seed S] [--prism-timeout SECONDS] [--prism-in-process]

Any test that takes the ``prism_case`` (``prism_grad_case``) fixture is parametrised
over the forward (gradient) cases and
``prism_backend`` over the backends named with ``--prism-backend`` (``all`` for every
available one). Unsupported cases are skipped with the reason, never passed.
``--prism-random N`` replaces the fixed forward cases by N random cases per op (see
:mod:`prism_core.conformance.random_cases`); ``--prism-timeout`` is the per-case limit
(default 120 s, 0 for none).

The shipped tests compute each case in a worker process kept for the session
(``prism_runner``, see :mod:`prism_core.conformance.workers`): a backend that crashes
fails that test as CRASHED and a new worker takes the next one; a hung case is killed
after the timeout and the rest of its op fails at once. Every test is independent of the
others, so pytest-xdist (``-n auto``) spreads the suite over processes as usual.
``--prism-in-process`` computes in the test process instead (for debugging a kernel).
"""

from __future__ import annotations

import pytest

from ..cli.args import int_at_least, seconds_arg


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prism", "Prism conformance")
    group.addoption("--prism-backend", action="append", default=[], metavar="NAME",
                    help="backend to certify (repeatable; 'all' = every available backend)")
    group.addoption("--prism-op", action="append", default=[], metavar="OP",
                    help="restrict the conformance cases to these op keys (repeatable)")
    group.addoption("--prism-random", type=int_at_least(1), default=None, metavar="N",
                    help="instead of the fixed forward cases, N random cases per op (elementwise, matmul, "
                         "softmax and norm families)")
    group.addoption("--prism-seed", type=int_at_least(0), default=0, metavar="S",
                    help="seed of --prism-random (default 0)")
    group.addoption("--prism-timeout", type=seconds_arg, default=None, metavar="SECONDS",
                    help="per-case time limit for the backend under test (default 120; 0: none)")
    group.addoption("--prism-in-process", action="store_true",
                    help="compute the cases in the test process (no protection from crashes and hangs)")


def _backend_names(config: pytest.Config) -> list[str]:
    from ..plugin.registry import backends
    names = config.getoption("prism_backend") or []
    if "all" in names:
        return [b.name for b in backends() if b.available]
    return list(dict.fromkeys(names))


def _ops(config: pytest.Config) -> tuple[str, ...] | None:
    ops = config.getoption("prism_op")
    return tuple(ops) if ops else None


def forward_suite(config: pytest.Config):
    from .workers import Suite
    return Suite("forward", _ops(config), config.getoption("prism_random"), config.getoption("prism_seed"))


def grad_suite(config: pytest.Config):
    from .workers import Suite
    return Suite("grad", _ops(config))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "prism_case" in metafunc.fixturenames:
        cases = forward_suite(metafunc.config).cases()
        metafunc.parametrize("prism_case", cases, ids=[c.name for c in cases])
    if "prism_grad_case" in metafunc.fixturenames:
        cases = grad_suite(metafunc.config).cases()
        metafunc.parametrize("prism_grad_case", cases, ids=[c.name for c in cases])
    if "prism_backend_name" in metafunc.fixturenames:
        names = _backend_names(metafunc.config)
        metafunc.parametrize("prism_backend_name", names, ids=names)


@pytest.fixture
def prism_backend(prism_backend_name: str):
    from ..plugin.registry import backend
    return backend(prism_backend_name)


@pytest.fixture
def prism_timeout(request: pytest.FixtureRequest) -> float | None:
    """The per-case time limit in seconds (None: none)."""
    from .runner import DEFAULT_TIMEOUT
    t = request.config.getoption("prism_timeout")
    return DEFAULT_TIMEOUT if t is None else (t or None)


class _Runner:
    """What the shipped tests call: each case in the session's worker for its backend, or in
    this process for ``--prism-in-process`` and backends a worker cannot load."""

    def __init__(self, config: pytest.Config, timeout: float | None) -> None:
        from .workers import SessionRunner
        self.config = config
        self.timeout = timeout
        self.session = SessionRunner(timeout)
        self._local: dict[str, bool] = {}

    def _in_process(self, name: str) -> bool:
        if name not in self._local:
            from .workers import in_process_only
            self._local[name] = bool(self.config.getoption("prism_in_process") or in_process_only([name]))
        return self._local[name]

    def forward(self, backend, case):
        if self._in_process(backend.name):
            from .runner import run_case
            return run_case(case, backend, timeout=self.timeout)
        return self.session.result(backend.name, forward_suite(self.config), case)

    def grad(self, backend, case):
        if self._in_process(backend.name):
            from .runner import run_grad
            (r,) = run_grad(backend, [case], timeout=self.timeout)
            return r
        return self.session.result(backend.name, grad_suite(self.config), case)


@pytest.fixture(scope="session")
def prism_runner(request: pytest.FixtureRequest):
    from .runner import DEFAULT_TIMEOUT
    t = request.config.getoption("prism_timeout")
    runner = _Runner(request.config, DEFAULT_TIMEOUT if t is None else (t or None))
    yield runner
    runner.session.close()
