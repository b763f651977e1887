"""csimd's thread count under CPU contention (csrc/csimd_threads.h): the policy, fed by hand, and the
property that makes it safe: no kernel's values depend on how many threads computed them.

The policy, from its description: every 0.1 s (a "look") the rate of involuntary context switches per
thread asked for is compared to 200 a second; above it, parallel kernels take one thread for a hold of
1 s, then every thread again for one look; a failed try doubles the hold (at most 8 s), a passed one
resets it to 1 s. Each case below is that rule worked by hand, at times of whole eighths of a second
(exact in binary, so that no interval lands a rounding error short of 0.1 s).
"""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc

NTH = 2


@pytest.fixture(scope="module")
def lib():
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    if info is None or not info.available:
        pytest.skip(f"csimd unavailable here: {info.reason if info else 'not installed'}")
    from prism_csimd.kernels import _state
    return _state["lib"]


def looks(lib, samples, nth=NTH):
    """The limit after each (time s, involuntary switches so far) look, from a fresh policy."""
    out = [lib.csimd_thread_policy_look(*samples[0], nth, 1)]
    return out + [lib.csimd_thread_policy_look(t, n, nth, 0) for t, n in samples[1:]]


def test_a_quiet_process_keeps_every_thread(lib):
    # 120 switches a second at 2 threads: 60 per thread, under 200
    assert looks(lib, [(0.0, 0), (0.125, 15), (0.25, 30), (0.375, 45), (10.0, 1200)]) == [0, 0, 0, 0, 0]


def test_contention_takes_one_thread_for_the_hold_then_tries_all(lib):
    # 0.125 -> 0.25 s: 75 switches = 300 a second per thread: one thread until 1.25 s
    assert looks(lib, [(0.0, 0), (0.125, 5), (0.25, 80), (0.5, 80), (1.125, 80), (1.375, 85)]) == [0, 0, 1, 1, 1, 0]


def test_a_look_sooner_than_the_interval_changes_nothing(lib):
    # the burst at 0.1875 s is counted at the 0.25 s look, over 0.125 -> 0.25 s (400 a second per thread)
    assert looks(lib, [(0.0, 0), (0.125, 0), (0.1875, 100), (0.25, 100)]) == [0, 0, 0, 1]


def test_the_rate_is_per_thread_asked_for(lib):
    # 1000 switches a second: 250 per thread at 4 threads (over 200), 125 at 8 (under)
    assert looks(lib, [(0.0, 0), (0.125, 125)], nth=4) == [0, 1]
    assert looks(lib, [(0.0, 0), (0.125, 125)], nth=8) == [0, 0]


def test_failed_tries_double_the_hold_up_to_eight_seconds_and_a_passed_one_resets_it(lib):
    busy = 100  # switches per 0.125 s look: 400 a second per thread
    t, n, samples, want = 0.0, 0, [(0.0, 0)], [0]

    def look(dt, dn, limit):
        nonlocal t, n
        t, n = t + dt, n + dn
        samples.append((t, n))
        want.append(limit)

    look(0.125, busy, 1)  # limited at 0.125 s for a hold of 1 s
    for hold in (1.0, 2.0, 4.0, 8.0, 8.0):
        look(hold - 0.125, 0, 1)  # still inside the hold
        look(0.25, 0, 0)  # past it: every thread again, the next hold doubled
        look(0.125, busy, 1)  # the try fails
    look(7.875, 0, 1)
    look(0.25, 0, 0)  # the sixth hold was 8 s too
    look(0.125, 0, 0)  # a quiet try: the hold is back to 1 s
    look(0.125, busy, 1)
    look(1.125, 0, 0)
    assert looks(lib, samples) == want


def _csimd_values(build, threads: int, monkeypatch) -> np.ndarray:
    monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
    monkeypatch.setenv("PRISM_CSIMD_SERIAL_WORK", "0")
    ctx = pc.Context()
    y = build(ctx)
    pc.compute(y, "csimd", strict=True)
    return y.numpy()


def _cancelling_rows(rows: int = 3000, cols: int = 16) -> np.ndarray:
    """Rows whose total depends on the order they are added in: +2**60 in row 0 and -2**60 in row 1800
    swallow every row added to a partial sum they dominate, so a split of the rows between threads
    (at 1500 for two, 1000 and 2000 for three) gives another float32 total than one thread's order."""
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    x[0, 0], x[1800, 0] = 2.0**60, -(2.0**60)
    return x


@pytest.mark.parametrize("op", ["SUM", "CROSS_ENTROPY_LOSS"])
def test_whole_tensor_sums_give_the_same_bits_at_any_thread_count(lib, op, monkeypatch):
    x = _cancelling_rows()
    if op == "SUM":
        def build(ctx):
            return pc.sum(ctx.from_numpy(x))
    else:  # row losses of ~1 each, and +-1e18 in rows 0 and 1800 (a logit of 1e18 against a label of +-1)
        logits = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
        labels = np.zeros_like(logits)
        labels[:, 1] = 1.0
        logits[0, 0], logits[1800, 0], labels[1800, 1] = 1e18, 1e18, -1.0

        def build(ctx):
            return pc.cross_entropy_loss(ctx.from_numpy(logits), ctx.from_numpy(labels))
    got = [_csimd_values(build, n, monkeypatch) for n in (1, 2, 3)]
    assert np.isfinite(got[0]).all()
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
