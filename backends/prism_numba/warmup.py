"""``prism_numba.warm_up()``: compile (first time) or load from the on-disk cache (later
processes) the kernels that common graphs use, so that the first real compute does not pay
for them.

It computes two small graphs on the numba backend, strictly (no fallbacks): an MLP training
step (MUL_MAT, ADD, RELU, CROSS_ENTROPY_LOSS and their gradients, OPT_STEP_ADAMW) and a
transformer block (GET_ROWS, RMS_NORM, ROPE, FLASH_ATTN_EXT, SOFT_MAX with an F16 mask,
SWIGLU, MUL, SCALE, CONT of a permuted view, F16 weights) and a quantized model's hot nodes (GET_ROWS
and MUL_MAT from block types: the compiled decoders), each kernel both as its serial
compilation (small nodes) and its thread-pool compilation (larger nodes). Kernels are compiled
per argument type signature, so graphs with other element types or layouts may still compile
on first use.
"""

from __future__ import annotations

import time

import numpy as np

import prism_core as pc
from prism_core.ops import RopeMode


def _mlp_step(rng: np.random.Generator) -> pc.Graph:
    ctx = pc.Context()
    bs, din, dh, dout = 8, 16, 32, 4
    x = ctx.from_numpy(rng.standard_normal((bs, din)).astype(np.float32)).set_input()
    y = ctx.from_numpy(np.eye(dout, dtype=np.float32)[rng.integers(0, dout, bs)]).set_input()
    params = [ctx.from_numpy(rng.normal(0, 0.1, s).astype(np.float32)).set_param()
              for s in ((dh, din), (dh,), (dout, dh), (dout,))]
    w1, b1, w2, b2 = params
    logits = pc.add(pc.mul_mat(w2, pc.relu(pc.add(pc.mul_mat(w1, x), b1))), b2)
    loss = pc.cross_entropy_loss(logits, y).set_loss()
    g = pc.Graph(capacity=1024).expand(loss)
    pc.build_backward(g)
    hyper = ctx.from_numpy(np.array([1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0, 1.0], np.float32))
    for p in params:
        g.expand(pc.opt_step_adamw(p, g.grad(p), ctx.new_tensor(pc.F32, p.ne), ctx.new_tensor(pc.F32, p.ne), hyper))
    pc.reset(g)
    return g


def _block(rng: np.random.Generator) -> pc.Graph:
    ctx = pc.Context()
    n_tok, d, n_head, vocab = 4, 32, 2, 16
    hd = d // n_head
    emb = ctx.from_numpy(rng.standard_normal((vocab, d)).astype(np.float32))
    ids = ctx.from_numpy(rng.integers(0, vocab, n_tok).astype(np.int32))
    pos = ctx.from_numpy(np.arange(n_tok, dtype=np.int32))
    wq = ctx.from_numpy(rng.standard_normal((d, d)).astype(np.float16))  # F16 weights
    wk = ctx.from_numpy(rng.standard_normal((d, d)).astype(np.float32))
    w_up = ctx.from_numpy(rng.standard_normal((2 * d, d)).astype(np.float32))
    mask = ctx.from_numpy(np.triu(np.full((n_tok, n_tok), -np.inf, np.float16), 1))
    h = pc.rms_norm(pc.get_rows(emb, ids), eps=1e-6)  # [d, n_tok]
    q = pc.rope_ext(pc.reshape_3d(pc.mul_mat(wq, h), hd, n_head, n_tok), pos, n_dims=hd)
    k = pc.rope_ext(pc.reshape_3d(pc.mul_mat(wk, h), hd, n_head, n_tok), pos, n_dims=hd, mode=RopeMode.NEOX)
    qp = pc.cont(pc.permute(q, 0, 2, 1, 3))  # [hd, n_tok, n_head]
    kp = pc.cont(pc.permute(k, 0, 2, 1, 3))
    att = pc.flash_attn_ext(qp, kp, kp, mask, scale=hd ** -0.5)  # [hd, n_head, n_tok]
    kq = pc.soft_max_ext(pc.mul_mat(kp, qp), mask, scale=hd ** -0.5)
    out = pc.add(pc.reshape_2d(att, d, n_tok), h)
    ff = pc.mul(pc.swiglu(pc.mul_mat(w_up, out)), pc.scale(out, 0.5))
    return pc.Graph().expand(ff).expand(pc.sum(kq))


def _quantized(rng: np.random.Generator) -> pc.Graph:
    """A quantized model's hot nodes: GET_ROWS from Q8_0 embeddings, MUL_MAT of a Q4_K weight (32 and
    five activation rows: a prompt and a short one) and of a Q6_K one (one row: decode), all on the
    integer path, which these formats take at every row count. The block format is an argument of the
    compiled kernels, so these compilations serve every format."""
    ctx = pc.Context()
    d, vocab = 256, 32
    emb = ctx.from_numpy(rng.standard_normal((vocab, d)).astype(np.float32), type=pc.GGMLType.Q8_0)
    w = ctx.from_numpy(rng.standard_normal((16, d)).astype(np.float32), type=pc.GGMLType.Q4_K)
    head = ctx.from_numpy(rng.standard_normal((vocab, d)).astype(np.float32), type=pc.GGMLType.Q6_K)
    h = pc.get_rows(emb, ctx.from_numpy(np.arange(32, dtype=np.int32)))  # [d, 32]
    five = pc.view_2d(h, d, 5, h.nb[1], 0)
    one = pc.view_2d(h, d, 1, h.nb[1], 0)
    return pc.Graph().expand(pc.mul_mat(w, h)).expand(pc.mul_mat(w, five)).expand(pc.mul_mat(head, one))


def warm_up() -> dict[str, float]:
    """Compile or load the common kernels; returns ``{"seconds": ..., "kernels": ...}`` (the
    wall time and the number of compiled kernel signatures now held)."""
    from . import kernels

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    be = pc.backend("numba")
    for g in (_mlp_step(rng), _block(rng), _quantized(rng)):
        pc.compute(g, be, strict=True)  # small nodes: the serial compilations
        be._apply_threads()
        for n in g.nodes:  # and the thread-pool compilations that larger nodes of these kinds use
            if n.opdef is not None and not n.opdef.view_only:
                kernels.run_wrapper(n, serial=False)
    j = kernels._jit()
    compiled = sum(len(k.compiled) + (len(k._serial.compiled) if k._serial not in (None, k) else 0)
                   for k in j.KERNELS.values())
    return {"seconds": time.perf_counter() - t0, "kernels": float(compiled)}
