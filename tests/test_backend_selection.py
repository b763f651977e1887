"""Selecting a backend for a whole program: pc.use_backend (process default) and
pc.using_backend (a with block, this thread only); pc.backend(name) only looks one up."""

from __future__ import annotations

import threading

import pytest

import prism_core as pc


def _used() -> str:
    ctx = pc.Context()
    x = ctx.from_numpy([1.0, 2.0])
    return pc.compute(pc.add(x, x)).backend


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("PRISM_BACKEND", raising=False)
    yield
    pc.use_backend(None)


def _other() -> str:
    """An available backend that is not the best one (the reference is always available)."""
    best = pc.backend().name
    return "numpy" if best != "numpy" else next(
        (i.name for i in pc.backends() if i.available and i.name != "numpy"), "numpy")


def test_backend_by_name_selects_nothing():
    best = pc.backend().name
    pc.backend(_other())
    assert _used() == best


def test_use_backend_sets_the_process_default_in_every_thread():
    other = _other()
    assert pc.use_backend(other).name == other
    assert _used() == other and pc.backend().name == other
    seen = []
    t = threading.Thread(target=lambda: seen.append(_used()))
    t.start()
    t.join()
    assert seen == [other]
    assert pc.use_backend(None) is None
    assert _used() == pc.backend().name


def test_using_backend_is_scoped_nested_and_restored_after_errors(monkeypatch):
    monkeypatch.setenv("PRISM_BACKEND", "numpy")
    pc.use_backend("numpy")
    other = _other()
    with pc.using_backend(other) as be:
        assert be.name == other and _used() == other
        with pc.using_backend("numpy"):
            assert _used() == "numpy"
        assert _used() == other
        seen = []
        t = threading.Thread(target=lambda: seen.append(_used()))
        t.start()
        t.join()
        assert seen == ["numpy"], "another thread keeps the process default"
    with pytest.raises(ZeroDivisionError):
        with pc.using_backend(other):
            raise ZeroDivisionError("inside the block")
    assert _used() == "numpy"
    # an explicit backend always wins
    with pc.using_backend(other):
        ctx = pc.Context()
        x = ctx.from_numpy([1.0])
        assert pc.compute(pc.neg(x), "numpy").backend == "numpy"


def test_bad_choices_are_refused_at_once():
    with pytest.raises(pc.UnknownBackend, match="no backend named 'nope'"):
        pc.use_backend("nope")
    with pytest.raises(pc.UnknownBackend):
        with pc.using_backend("nope"):
            pass
    with pytest.raises(pc.InvalidArgument, match="expected a Backend or a backend name"):
        pc.use_backend(3)
    assert pc.REGISTRY.default is None
