"""Helpers shared by the project's tests (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import fcntl
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import prism_core as pc


def verifier() -> tuple[set[str], Callable]:
    """A module's set of op-table keys verified independently, and the decorator that
    records them (test_reference_ops.py checks that the union covers the op table)."""
    keys: set[str] = set()

    def verifies(*ks: str):
        def deco(f):
            keys.update(ks)
            return f
        return deco
    return keys, verifies


def run(t: pc.Tensor) -> pc.Tensor:
    """Compute ``t`` on the reference backend."""
    pc.compute(t, "numpy", strict=True)
    return t


def full(t: pc.Tensor) -> np.ndarray:
    """Values as a 4-dim array (ne3, ne2, ne1, ne0)."""
    return t.numpy().reshape(tuple(reversed(t.ne)))


def round_sig(x: float, bits: int) -> float:
    """``x`` rounded to the nearest float with ``bits`` significant bits, ties to even
    (frexp + Python's round): an independent model of F16/BF16 rounding."""
    if x == 0.0 or not math.isfinite(x):
        return x
    m, e = math.frexp(x)
    return math.ldexp(round(m * 2 ** bits), e - bits)


def snapshot(ctx: pc.Context, graph: pc.Graph | None = None) -> tuple:
    state = (len(ctx.tensors), ctx.used, [id(t) for t in ctx.tensors])
    if graph is None:
        return state, None
    return state, ([id(n) for n in graph.nodes], [id(leaf) for leaf in graph.leafs])


@contextmanager
def refused(cls: type[Exception], match: str, ctx: pc.Context,
            graph: pc.Graph | None = None) -> Iterator[pytest.ExceptionInfo]:
    """The body must raise exactly ``cls`` (not merely a subclass or base) with a
    message matching ``match``, leaving ``ctx`` and ``graph`` as they were."""
    before = snapshot(ctx, graph)
    with pytest.raises(cls, match=match) as info:
        yield info
    assert info.type is cls, f"expected exactly {cls.__name__}, got {info.type.__name__}: {info.value}"
    assert isinstance(info.value, pc.PrismError)
    assert snapshot(ctx, graph) == before, "a refused call changed the context or the graph"


def available_backend(name: str) -> str:
    """name, or the test skipped with why that backend is unavailable here."""
    info = next((i for i in pc.backends() if i.name == name), None)
    if info is None or not info.available:
        pytest.skip(f"{name} unavailable here: {info.reason if info else 'not registered'}")
    return name


def slow_on_numba(backends) -> list:
    """Backend names for a parametrize, numba's marked slow: with a cold cache its run compiles every kernel the
    test reaches (tens of seconds of CPU)."""
    return [pytest.param(b, marks=pytest.mark.slow) if b == "numba" else b for b in backends]


def reads_block_types(case) -> bool:
    """Whether a conformance case's node reads or writes a block (quantized) type."""
    out = case.build(pc.Context(), np.random.default_rng(0)).out
    return any(t is not None and t.traits.is_quantized for t in (out, *out.src))


def one_per_op_and_family(cases: list) -> list:
    """Each op's first case and its first case on a block (quantized) type, where it has one: about one
    signature per kernel, the subset the tests that send every node to numba's thread pool share (what one
    of them compiles from a cold cache, the next loads from the on-disk cache)."""
    from prism_core.conformance.cases import Case
    seen: set = set()
    out = []
    for c in cases:
        family = (c.key, isinstance(c, Case) and reads_block_types(c))
        if family not in seen:
            seen.add(family)
            out.append(c)
    return out


def write_plugin(root, module: str, source: str, *, entry: str | None = None, dist: str | None = None) -> None:
    """Install plugin module ``module`` (``source``) into folder ``root`` as distribution ``dist``
    (METADATA and entry_points.txt declaring it under ``prism.backends`` as ``entry``), the way
    a third-party backend is installed: with ``root`` on ``sys.path``, importlib.metadata finds it."""
    root = Path(root)
    dist = dist or f"{module.replace('_', '-')}-plugin"
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{pc.plugin.registry.ENTRY_POINT_GROUP}]\n{entry or module} = {module}\n")


def default_sigint() -> None:
    """A ``preexec_fn`` giving a child Ctrl-C's default handling: a test of what Ctrl-C does must not
    inherit SIGINT ignored (as a shell's background jobs have it), or Python never sees the signal."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run that every worker sees (xdist gives each worker a base temp beside the others')."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 make: Callable[[Path], tuple[str, str]]) -> tuple[str, str]:
    """``make(folder)`` run once in this run, in a folder every worker shares: (what it returned, a string such as
    a path, or "" when it failed; its log). A second worker waits on a lock for the first one's result."""
    root = run_dir(tmp_path_factory) / name
    root.mkdir(exist_ok=True)
    done, log = root / "built", root / "stderr.txt"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            result, text = make(root)
            log.write_text(text)
            done.write_text(result)
    return done.read_text(), log.read_text()
