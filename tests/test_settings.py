"""Environment settings: a bad PRISM_NUM_THREADS (or PRISM_ADAPTIVE_THREADS) is refused when a backend is
selected, with a message naming the variable, never a crash or an OverflowError at compute time."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc
from prism_core.settings import MAX_THREADS, env_int, env_values, requested_threads

BAD_THREADS = {  # value -> what the message says
    str(2**31): f"must be at most {MAX_THREADS}",
    "100000": f"must be at most {MAX_THREADS}",
    "513": f"must be at most {MAX_THREADS}",
    "0": "must be at least 1",
    "-4": "must be at least 1",
    "abc": "is not an integer",
    "2.5": "is not an integer",
    "9" * 5000: "is not an integer",  # beyond Python's int-parsing limit: refused, not a traceback
}


@pytest.mark.parametrize("value", list(BAD_THREADS), ids=lambda v: v[:12])
def test_bad_thread_counts_are_refused_with_the_variable_named(monkeypatch, value):
    monkeypatch.setenv("PRISM_NUM_THREADS", value)
    with pytest.raises(pc.InvalidArgument, match=rf"^PRISM_NUM_THREADS=.* {BAD_THREADS[value]}$"):
        requested_threads()


@pytest.mark.parametrize("value, want", [("", None), ("  ", None), ("1", 1), (" 7 ", 7), ("512", 512)])
def test_good_thread_counts(monkeypatch, value, want):
    monkeypatch.setenv("PRISM_NUM_THREADS", value)
    assert requested_threads() == want


def test_env_int_bounds(monkeypatch):
    monkeypatch.setenv("PRISM_TEST_INT", "5")
    assert env_int("PRISM_TEST_INT", None, 0, 5) == 5
    with pytest.raises(ValueError, match="PRISM_TEST_INT='5' must be at most 4"):  # still a ValueError
        env_int("PRISM_TEST_INT", None, 0, 4)
    monkeypatch.delenv("PRISM_TEST_INT")
    assert env_int("PRISM_TEST_INT", 3, 0) == 3


@pytest.mark.parametrize("var, value, says", [
    ("PRISM_NUM_THREADS", str(2**31), "must be at most"), ("PRISM_NUM_THREADS", "100000", "must be at most"),
    ("PRISM_NUM_THREADS", "0", "must be at least"), ("PRISM_ADAPTIVE_THREADS", "2", "must be at most 1"),
    ("PRISM_ADAPTIVE_THREADS", "on", "is not an integer")])
def test_parallel_backends_refuse_a_bad_thread_setting_at_selection(monkeypatch, var, value, says):
    parallel = [i.name for i in pc.backends() if i.available and i.name in ("numba", "csimd")]
    if not parallel:
        pytest.skip("neither numba nor csimd is available here")
    monkeypatch.setenv(var, value)
    pc.REGISTRY.reset()
    try:
        for name in parallel:
            with pytest.raises(pc.BackendUnavailable, match=rf"backend '{name}' is unavailable: "
                                                            rf"{var}='{value}' {says}"):
                pc.backend(name)
        ctx = pc.Context()  # the reference, which has no threads, still computes
        x = ctx.from_numpy(np.array([1.0, 4.0], np.float32))
        y = pc.sqrt(x)
        pc.compute(y, "numpy")
        np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])
    finally:
        monkeypatch.delenv(var)
        pc.REGISTRY.reset()


def test_env_values_reads_what_os_environ_holds(monkeypatch):
    monkeypatch.setenv("PRISM_TEST_A", " x\u20ac ")
    monkeypatch.setenv("PRISM_TEST_EMPTY", "")
    monkeypatch.delenv("PRISM_TEST_UNSET", raising=False)
    names = ("PRISM_TEST_A", "PRISM_TEST_UNSET", "PRISM_TEST_EMPTY")
    assert env_values(names) == (" x\u20ac ", None, "")
    monkeypatch.setenv("PRISM_TEST_UNSET", "1")
    monkeypatch.delenv("PRISM_TEST_A")
    assert env_values(names) == (None, "1", "")
