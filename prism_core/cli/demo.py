"""``prism demo``: an end-to-end run of the framework on a small real graph.

Softmax regression on three Gaussian clusters: the forward graph is built from ops,
``build_backward`` adds the gradients symbolically, one OPT_STEP_ADAMW node per
parameter updates it, and the whole step is planned once and computed on the chosen
backend. The first loss is checked against NumPy written directly.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..autodiff import build_backward, reset
from ..context import Context
from ..graph import Graph
from ..ops import build as B
from ..plan import plan
from ..plugin.registry import backend as get_backend
from ..types import F32


def make_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    y = rng.integers(0, 3, n)
    x = centers[y] + rng.normal(0, 0.8, (n, 2))
    return x.astype(np.float32), np.eye(3, dtype=np.float32)[y]


def main(backend_name: str | None = None, steps: int = 60) -> int:
    be = get_backend(backend_name)
    rng = np.random.default_rng(0)
    x_np, y_np = make_data(256, rng)
    n, d, c = x_np.shape[0], x_np.shape[1], y_np.shape[1]

    ctx = Context()
    x = ctx.from_numpy(x_np, name="x").set_input()             # ggml ne = [2, 256]
    labels = ctx.from_numpy(y_np, name="labels").set_input()   # ne = [3, 256]
    w = ctx.new_tensor(F32, (d, c), "w").set_param()           # mul_mat(w, x): [3, 256]
    b = ctx.new_tensor(F32, (c, 1), "b").set_param()
    w.set(rng.normal(0, 0.1, (c, d)))
    logits = B.add(B.mul_mat(w, x), b)
    loss = B.cross_entropy_loss(logits, labels).set_name("loss")
    correct = B.count_equal(B.argmax(logits), B.argmax(labels))

    graph = Graph().expand(loss.set_loss()).expand(correct.set_output())
    build_backward(graph)                                      # gradients as ordinary op nodes
    opt = ctx.new_tensor(F32, (7,), "adamw params").set_input()
    for p in (w, b):
        m, v = ctx.new_tensor(F32, p.ne), ctx.new_tensor(F32, p.ne)
        graph.expand(B.opt_step_adamw(p, graph.grad(p), m, v, opt))
    reset(graph)
    step = plan(graph, be, keep_grads=False)                   # kernels and memory resolved once

    ref_logits = x_np @ w.numpy().T
    ref_logp = ref_logits - np.log(np.exp(ref_logits).sum(1, keepdims=True))
    ref_loss = float(-(y_np * ref_logp).sum() / n)

    print(f"prism demo on backend '{be.name}': softmax regression, {n} points, {len(graph)} nodes per step")
    print(f"  {step.summary()}")
    alpha, beta1, beta2 = 0.1, 0.9, 0.999
    t0 = time.perf_counter()
    for it in range(1, steps + 1):
        opt.set([alpha, beta1, beta2, 1e-8, 0.0, 1 / (1 - beta1**it), 1 / (1 - beta2**it)])
        step.compute()
        if it == 1:
            got = float(loss.numpy()[0])
            print(f"  step 1: loss {got:.6f} (NumPy written directly: {ref_loss:.6f})")
            if not np.isclose(got, ref_loss, rtol=1e-4):
                print("  MISMATCH against NumPy")
                return 1
            if step.fallbacks:
                print(f"  nodes on the reference backend: {', '.join(f.node.opdef.key for f in step.fallbacks)}")
        if it % 20 == 0:
            print(f"  step {it}: loss {float(loss.numpy()[0]):.4f}, accuracy {int(correct.numpy()[0]) / n:.1%}")
    dt = time.perf_counter() - t0
    acc = int(correct.numpy()[0]) / n
    print(f"  {steps} steps in {dt * 1e3:.1f} ms ({dt / steps / len(graph) * 1e6:.1f} us per node)")
    print(f"  final accuracy {acc:.1%} (needs > 90%): {'OK' if acc > 0.9 else 'FAILED'}")
    return 0 if acc > 0.9 else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="build and run a small graph end to end")
    d.add_argument("--backend", default=None, help="backend name (default: best available)")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    return main(args.backend)
