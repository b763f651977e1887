"""The order of a run under pytest-xdist (README and .ci/run: ``-n auto --dist worksteal``).

worksteal gives each worker one contiguous share of the collection, then lets a worker that runs out take
half of another's remaining queue. So that the workers finish together and numba compiles each kernel once:

* every worker's share starts with tests marked ``slow`` (a minute-long test started last would keep one
  worker busy alone; started first, the other worker's short tests fill the time);
* the first share starts with the slow tests that compile numba kernels into the shared on-disk cache (a
  numba parameter or module): one after another in one process, each loads what the earlier ones compiled
  (tests/test_numba_qdot.py's variants compile in caches of their own, so they count as the other kind);
* the other shares start with the remaining slow tests (sanitized and serial csimd builds, wheel, llama.cpp
  peers...), dealt in turn.

Only the order changes: nothing is skipped or deselected. Without xdist (``-n 0``) the slow tests just run first.
"""

from __future__ import annotations

import os

import pytest


def _compiles_numba(item: pytest.Item) -> bool:
    if item.path.name == "test_numba_qdot.py":  # its slow tests compile afresh in private caches
        return False
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return (item.path.name.startswith("test_numba") or "numba" in item.name
            or any(isinstance(v, str) and v == "numba" for v in params))


def ordered(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` in the order above for ``workers`` contiguous shares."""
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    rest = [i for i in items if i.get_closest_marker("slow") is None]
    if workers < 2:
        return slow + rest
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    heads[0] = [i for i in slow if _compiles_numba(i)]
    for k, item in enumerate(i for i in slow if not _compiles_numba(i)):
        heads[1 + k % (workers - 1)].append(item)
    share = len(items) // workers  # worksteal's first shares; the last one takes the remainder
    out: list[pytest.Item] = []
    for head in heads:
        fill = max(0, share - len(head))
        out += head + rest[:fill]
        rest = rest[fill:]
    return out + rest


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a pytest without xdist (the arm64 tree's) runs too
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per CPU this process may use, and one more where there are several. A dozen tests
    wait on a child (a plugin probe's or a hung worker's time limit, a server's stream): about a minute in all
    while their worker's core would idle; the extra worker fills it."""
    from prism_core.contention import usable_cpus
    cpus = usable_cpus()
    return cpus + 1 if cpus > 1 else 1


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = ordered(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
