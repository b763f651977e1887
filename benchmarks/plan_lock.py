"""``python -m benchmarks.plan_lock``: what the compute lock costs a planned compute.

A plan's compute takes its contexts' ``compute_lock`` (see prism_core.schedule.holding). This
times, side by side, ``Plan.compute()`` and the same prepared calls run without the lock, on a
tiny graph (one add, and a chain of 10 tiny nodes) where a fixed per-compute cost shows most.
Best of several runs; printed as microseconds per compute and their ratio.
"""

from __future__ import annotations

import numpy as np

import prism_core as pc

from .__main__ import best_time


def _unlocked(p: pc.Plan):
    def run() -> None:
        for t, storage in p.bindings:
            if t._storage is not storage:
                t._storage = storage
        for call in p.calls:
            call()
    return run


def main() -> None:
    print("## planned compute with and without the compute lock (us per compute; ratio locked / unlocked)")
    for be in [b.backend for b in pc.backends() if b.available]:
        for n_nodes in (1, 10):
            ctx = pc.Context()
            x = ctx.from_numpy(np.ones(4, np.float32))
            y = x
            for _ in range(n_nodes):
                y = pc.add(y, x)
            p = pc.plan(y, be)
            locked = best_time(p.compute, 5) * 1e6
            unlocked = best_time(_unlocked(p), 5) * 1e6
            print(f"{be.name:8s} {n_nodes:3d} node(s): locked {locked:7.2f}  unlocked {unlocked:7.2f}  "
                  f"ratio {locked / unlocked:5.2f}")


if __name__ == "__main__":
    main()
