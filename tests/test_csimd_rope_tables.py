"""csimd keeps ROPE's per-pair tables (inverse frequencies, YaRN mix) of the first parameter sets it meets
(csrc/csimd.c, rope_tables) and builds the others per call: every parameter set, kept or not, must give
the reference's rotation, and the same bits on every call."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc

# more parameter sets than csimd keeps (16), so that some take the per-call path; each set differs from
# the others in one table parameter only (base, YaRN's ext_factor or correction range, mode)
PARAMS = ([dict(freq_base=1000.0 + 37.5 * i, mode=m) for i in range(10) for m in (0, 2)]
          + [dict(freq_base=5000.0, ext_factor=e, beta_fast=bf, n_ctx_orig=64, freq_scale=0.5, mode=2)
             for e in (0.25, 1.0) for bf in (8.0, 32.0)])


def _rope(backend: str, x: np.ndarray, pos: np.ndarray, params: dict) -> np.ndarray:
    ctx = pc.Context()
    y = pc.rope_ext(ctx.from_numpy(x), ctx.from_numpy(pos), n_dims=x.shape[-1], **params)
    pc.compute(y, backend, strict=True)
    return y.numpy()


def test_every_parameter_set_rotates_as_the_reference_on_every_call():
    if "csimd" not in {b.name for b in pc.backends() if b.available}:
        pytest.skip("csimd is not available here")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 64)).astype(np.float32)  # ggml [64, 2 heads, 3 tokens]
    pos = np.array([0, 7, 4000], np.int32)
    first = [_rope("csimd", x, pos, p) for p in PARAMS]
    for p, got in zip(PARAMS, first):
        np.testing.assert_allclose(got, _rope("numpy", x, pos, p), rtol=1e-5, atol=1e-5, err_msg=str(p))
    for p, got in zip(PARAMS, first):  # again, in the same order: the kept tables and the per-call ones
        np.testing.assert_array_equal(_rope("csimd", x, pos, p), got, err_msg=str(p))
