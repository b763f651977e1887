"""pytest plugin (entry point ``pytest11``): run the conformance suite on a backend.

    pytest --pyargs prism_core.conformance --prism-backend NAME [--prism-op OP ...]
           [--prism-random N --prism-seed S] [--prism-timeout SECONDS] [--prism-in-process]
    pytest --pyargs prism_core.conformance -k test_model --prism-backend NAME --prism-model MODEL
           [--prism-prompts N] [--prism-cache-type TYPE ...] [--prism-reference-cache DIR]

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

``--prism-model`` certifies the backends on a model as ``prism conformance --model`` does: ``test_model``
is parametrised over the cache types and built-in prompts, each test asserting the three checks of its
prompt (a failure names the first node out of its op's bounds), in the test process. Without it the
model tests are deselected.
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
    group.addoption("--prism-model", default=None, metavar="MODEL",
                    help="certify the backends on this model (a GGUF path or a catalog name): test_model, one "
                         "test per cache type and built-in prompt (prism conformance --model)")
    group.addoption("--prism-prompts", type=int_at_least(1), default=None, metavar="N",
                    help="with --prism-model: the first N built-in prompts (default 3)")
    group.addoption("--prism-cache-type", action="append", default=[], metavar="TYPE",
                    help="with --prism-model: KV cache types (f16, f32, q8_0; default all three)")
    group.addoption("--prism-reference-cache", default=None, metavar="DIR",
                    help="with --prism-model: where the reference's logits are kept ('none': not kept)")


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
    if "prism_model_case" in metafunc.fixturenames:
        cases = model_cases(metafunc.config)
        metafunc.parametrize("prism_model_case", cases, ids=[f"{c}-prompt{i + 1}" for c, i in cases])
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


# ------------------------------------------------------------------ model certification (--prism-model)
# The fixture prism_model_runner comes from prism_core.models.certify_pytest (entry point pytest11
# prism_model): loading models is above this package.
def model_cases(config: pytest.Config) -> list[tuple[str, int]]:
    """(cache type, prompt index) of each test_model, from the --prism-model options ([] without a model)."""
    from .model_cert import CACHE_TYPES, DEFAULT_PROMPTS, PROMPTS
    if config.getoption("prism_model") is None:
        return []
    n = config.getoption("prism_prompts") or DEFAULT_PROMPTS
    if n > len(PROMPTS):
        raise pytest.UsageError(f"--prism-prompts: at most {len(PROMPTS)} (the built-in prompts), got {n}")
    caches = list(dict.fromkeys(c.lower() for c in config.getoption("prism_cache_type"))) or list(CACHE_TYPES)
    bad = [c for c in caches if c not in CACHE_TYPES]
    if bad:
        raise pytest.UsageError(f"--prism-cache-type: one of {', '.join(CACHE_TYPES)}, got {', '.join(bad)}")
    return [(c, i) for c in caches for i in range(n)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --prism-model, the model tests are deselected rather than shown as skipped."""
    if config.getoption("prism_model") is not None:
        return
    keep = [i for i in items if "prism_model_runner" not in getattr(i, "fixturenames", ())]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


# ------------------------------------------------------------------ the summary table at the end
_MARK = "prism_conformance"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    params = getattr(getattr(item, "callspec", None), "params", {})
    case = params.get("prism_case") or params.get("prism_grad_case")
    name = params.get("prism_backend_name")
    if case is not None and name is not None and (report.when == "call" or report.outcome != "passed"):
        mode = "grad" if "prism_grad_case" in params else "forward"
        report.user_properties.append((_MARK, (name, mode, case.key)))  # survives pytest-xdist


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """An unsupported case is a skip without its bare ``s``: the summary table counts them."""
    if report.skipped and any(k == _MARK for k, _ in getattr(report, "user_properties", ())) and \
            "unsupported on " in str(report.longrepr):
        return "skipped", "", "UNSUPPORTED"
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for k, v in report.user_properties:
        if k == _MODEL_MARK and report.when == "call":
            _model_rows.append(v)
        if k == _MARK:
            word = "unsupported" if report.skipped else "failed" if report.failed else "passed"
            _tallies.setdefault(tuple(v), {}).setdefault(word, 0)
            _tallies[tuple(v)][word] += 1


_tallies: dict[tuple, dict[str, int]] = {}
_MODEL_MARK = "prism_model"  # a test_model row: prism conformance --model's streamed line for its prompt
_model_rows: list[str] = []


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """One row per (backend, mode, op): passed, failed and unsupported cases, as the CLI's table; and the
    model certification's rows, one per backend, cache type and prompt."""
    tr = terminalreporter
    if _model_rows:
        tr.section("prism model conformance")
        for row in sorted(_model_rows):
            tr.write_line(row)
        tr.write_line(f"model {config.getoption('prism_model')}; prism conformance --model prints the bounds")
    if not _tallies:
        return
    tr.section("prism conformance")
    rows = [("op", "backend", "mode", "passed", "failed", "unsupported")]
    for (name, mode, op), c in sorted(_tallies.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        rows.append((op, name, mode, str(c.get("passed", 0)), str(c.get("failed", 0)), str(c.get("unsupported", 0))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        tr.write_line("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    by: dict[str, dict[str, int]] = {}
    for (name, _, _), c in _tallies.items():
        for w, n in c.items():
            by.setdefault(name, {}).setdefault(w, 0)
            by[name][w] += n
    for name, c in by.items():
        tr.write_line(f"{name}: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                      f"{c.get('unsupported', 0)} unsupported cases")
