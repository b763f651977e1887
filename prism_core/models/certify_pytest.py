"""pytest plugin (entry point ``pytest11`` ``prism_model``): the session's model certifier for the shipped
``test_model`` (prism_core/conformance/test_backend.py), from the ``--prism-model`` options that
:mod:`prism_core.conformance.pytest_plugin` declares. Here because it loads models."""

from __future__ import annotations

import pytest


class ModelRunner:
    """One certifier for the session: each backend's models are loaded once per cache type."""

    def __init__(self, config: pytest.Config) -> None:
        from ..conformance.model_cert import DEFAULT_PROMPTS
        from ..conformance.reference_cache import default_dir
        from ..plugin.registry import REGISTRY
        from .certify import Certifier, setup
        ref = config.getoption("prism_reference_cache")
        caches = config.getoption("prism_cache_type")
        prompts = config.getoption("prism_prompts") or DEFAULT_PROMPTS
        self.setup = setup(config.getoption("prism_model"), prompts=prompts,
                           **({"cache_types": caches} if caches else {}),
                           reference_dir=None if ref == "none" else (ref or default_dir()))
        self.certifier = Certifier(self.setup, REGISTRY.reference())

    def check(self, backend, case: tuple[str, int]):
        """(the prompt's result, the node sweep's first finding on a failure: "" when none)."""
        cache, index = case
        r = self.certifier.prompt(backend, cache, index)
        findings = self.certifier.locate(backend, cache, index) if not r.passed and not r.error else []
        return r, str(findings[0]) if findings else ""

    def sweep(self, backend) -> list:
        """The nodes out of their op's bounds on the first prompt with the first cache type."""
        return self.certifier.locate(backend, self.setup.cache_types[0], 0)


@pytest.fixture(scope="session")
def prism_model_runner(request: pytest.FixtureRequest):
    runner = ModelRunner(request.config)
    yield runner
    runner.certifier.close()
