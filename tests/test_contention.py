"""Fewer threads under CPU contention (prism_core/contention.py; csimd runs the same rule in C,
csrc/csimd_threads.h): the rule fed by hand to both implementations, and the property that makes it
safe: no kernel's values depend on how many threads computed them.

The rule, from its description: every 0.1 s (a "look") the share of the time since the last look that
the calling thread waited for a CPU is compared to 10%, and the CPUs' time the process left to others
(the CPUs it may run on, less its own CPU time over all its threads, per second) to half a CPU; above
both, kernels take half the threads (at least 1) for a hold of 1 s, halving again while above; after the
hold every thread is tried for one look; a failed try doubles the hold (at most 8 s), a passed one
resets it to 1 s. Each case below is that rule worked by hand, at times of whole eighths of a second
(exact in binary, so that no interval lands a rounding error short of 0.1 s), on 2 CPUs; unless a case
says otherwise the process runs one CPU's worth, leaving the other to the process that makes it wait.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import prism_core as pc
from prism_core import contention

BUSY = 0.05  # s waited per 0.125 s look: 40%
QUIET = 0.001  # 0.8%
NCPU = 2


def _csimd_lib():
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    if info is None or not info.available:
        pytest.skip(f"csimd unavailable here: {info.reason if info else 'not installed'}")
    from prism_csimd.kernels import _state
    return _state["lib"]


def python_looks(samples, nth):
    w = contention.ThreadWatch(NCPU)
    return [w.look(t, d, cpu, nth) for t, d, cpu in samples]


def c_looks(samples, nth):
    lib = _csimd_lib()
    return [lib.csimd_thread_watch_look(t, d, cpu, NCPU, nth, int(i == 0)) for i, (t, d, cpu) in enumerate(samples)]


@pytest.fixture(params=["python", "csimd"])
def looks(request):
    return python_looks if request.param == "python" else c_looks


def walk(steps):
    """(dt, waited, want) or (dt, waited, CPUs the process used, want) steps from (0 s, 0 s waited, 0 s
    of CPU) -> the samples and the limits they should give; the process uses 1 CPU where not given."""
    t, d, cpu, samples, want = 0.0, 0.0, 0.0, [(0.0, 0.0, 0.0)], [0]
    for step in steps:
        dt, waited, used, limit = step if len(step) == 4 else (step[0], step[1], 1.0, step[2])
        t, d, cpu = t + dt, d + waited, cpu + used * dt
        samples.append((t, d, cpu))
        want.append(limit)
    return samples, want


def test_a_quiet_thread_keeps_every_thread(looks):
    samples, want = walk([(0.125, QUIET, 0), (0.125, QUIET, 0), (10.0, 0.5, 0)])  # 0.8%, 0.8%, 5%
    assert looks(samples, 2) == want


def test_waiting_halves_the_threads_for_the_hold_then_tries_all(looks):
    # 0.125 -> 0.25 s: 40% waited: 1 of 2 threads until 1.25 s
    samples, want = walk([(0.125, QUIET, 0), (0.125, BUSY, 1), (0.25, 0, 1), (0.625, 0, 1), (0.25, 0, 0)])
    assert looks(samples, 2) == want


def test_a_look_sooner_than_the_interval_changes_nothing(looks):
    # the wait seen at 0.1875 s counts at the 0.25 s look, over 0.125 -> 0.25 s (40%)
    samples, want = walk([(0.125, 0, 0), (0.0625, BUSY, 0), (0.0625, 0, 1)])
    assert looks(samples, 2) == want


def test_halving_goes_on_while_the_thread_still_waits(looks):
    # 8 threads: 4, then 2, then 1, each with a fresh hold of 1 s; quiet at 1 it waits out the hold
    samples, want = walk([(0.125, BUSY, 4), (0.125, BUSY, 2), (0.125, BUSY, 1), (0.125, BUSY, 1),
                          (0.75, 0, 1), (0.25, 0, 0)])
    assert looks(samples, 8) == want


def test_failed_tries_double_the_hold_up_to_eight_seconds_and_a_passed_one_resets_it(looks):
    steps = [(0.125, BUSY, 1)]  # limited at 0.125 s for a hold of 1 s
    for hold in (1.0, 2.0, 4.0, 8.0, 8.0):
        steps += [(hold - 0.125, 0, 1),  # still inside the hold
                  (0.25, 0, 0),  # past it: every thread again, the next hold doubled
                  (0.125, BUSY, 1)]  # the try fails
    steps += [(7.875, 0, 1), (0.25, 0, 0),  # the sixth hold was 8 s too
              (0.125, 0, 0),  # a quiet try: the hold is back to 1 s
              (0.125, BUSY, 1), (1.125, 0, 0)]
    samples, want = walk(steps)
    assert looks(samples, 2) == want


def test_a_wait_behind_the_process_own_threads_keeps_every_thread(looks):
    # 40% waited each look, but the process itself ran both CPUs (1.875 and 2.0 CPUs' worth: another
    # library's workers spinning beside the kernel's threads): nobody else took them, every thread stays
    samples, want = walk([(0.125, BUSY, 1.875, 0), (0.125, BUSY, 2.0, 0), (0.25, BUSY, 1.75, 0)])
    assert looks(samples, 2) == want


def test_a_wait_counts_once_other_processes_had_half_a_cpu(looks):
    # 1.625 CPUs used: 0.375 left to others, not enough; 1.5: half a CPU, the wait counts
    samples, want = walk([(0.125, BUSY, 1.625, 0), (0.125, BUSY, 1.5, 1)])
    assert looks(samples, 2) == want


def test_an_outside_process_after_the_own_threads_still_halves(looks):
    # own threads first (no halving), then a busy process takes a CPU: 4 of 8 threads, then 2
    samples, want = walk([(0.125, BUSY, 2.0, 0), (0.125, BUSY, 1.0, 4), (0.125, BUSY, 1.25, 2),
                          (1.0, 0, 2.0, 0)])
    assert looks(samples, 8) == want


def test_the_process_cpu_reading_counts_every_thread_of_it():
    """What the rule reads as the process's CPU time includes its other threads' (here two Python threads
    busy in NumPy's C code, the GIL released, while the calling thread sleeps), so their spinning is
    never taken for another process's; and Python's reading and csimd's agree on the CPUs."""
    lib = _csimd_lib()
    from prism_csimd.kernels import _state
    out = _state["ffi"].new("double[3]")
    if lib.csimd_thread_readings(out) != 0:
        pytest.skip("no scheduler statistics here (not Linux)")
    stop = threading.Event()
    a = np.random.default_rng(0).standard_normal(1 << 16)

    def spin():
        while not stop.is_set():
            np.sort(a)  # releases the GIL

    mine0, proc0 = time.thread_time(), out[1]
    workers = [threading.Thread(target=spin) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.3)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert lib.csimd_thread_readings(out) == 0
    mine = time.thread_time() - mine0
    assert out[1] - proc0 > mine  # the workers' time is in it
    assert out[2] == contention.usable_cpus() >= 1


def test_csimd_refuses_bad_constants():
    lib = _csimd_lib()
    c = (contention.LOOK_S, contention.DELAY_SHARE, contention.OUTSIDE_CPUS, contention.HOLD_MIN_S,
         contention.HOLD_MAX_S)
    for bad in ((0.0, *c[1:]), (c[0], 1.0, *c[2:]), (*c[:2], 0.0, *c[3:]), (*c[:3], 0.0, c[4]), (*c[:4], 0.5)):
        assert lib.csimd_set_adaptive_threads(1, *bad) == -1
    assert lib.csimd_set_adaptive_threads(1, *c) in (0, 1)


def _values(backend: str, build, threads: int, monkeypatch) -> np.ndarray:
    monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
    monkeypatch.setenv(f"PRISM_{backend.upper()}_SERIAL_WORK", "0")  # every node parallel
    ctx = pc.Context()
    y = build(ctx)
    pc.compute(y, backend, strict=True)
    return y.numpy()


def _cancelling_rows(rows: int = 3000, cols: int = 16) -> np.ndarray:
    """Rows whose total depends on the order they are added in: +2**60 in row 0 and -2**60 in row 1800
    swallow every row added to a partial sum they dominate, so a split of the rows between threads
    (at 1500 for two, 1000 and 2000 for three) gives another float32 total than one thread's order."""
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    x[0, 0], x[1800, 0] = 2.0**60, -(2.0**60)
    return x


@pytest.mark.parametrize("backend", ["csimd", "numba"])
@pytest.mark.parametrize("op", ["SUM", "CROSS_ENTROPY_LOSS"])
def test_whole_tensor_sums_give_the_same_bits_at_any_thread_count(op, backend, monkeypatch):
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
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
    got = [_values(backend, build, n, monkeypatch) for n in (1, 2, 3)]
    assert np.isfinite(got[0]).all()
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
