"""prism conformance --model: model-level certification on a tiny Gemma 3 GGUF (tests/finetune_models.py),
with backends that wrap a real one and get one op wrong, and with correct backends that must pass."""

from __future__ import annotations

import math
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import prism_core as pc
from prism_core.cli import main as cli
from prism_core.conformance import model_cert as mc
from prism_core.types import GGMLType as G

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_models import write_tiny  # noqa: E402

Q8_UNIT = 1 / 254 + 2.0**-11  # half a Q8 step of the block maximum (amax/127/2) plus the fp16 scale's rounding


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny(tmp_path_factory.mktemp("model") / "tiny-gemma3.gguf", "gemma3", weight_type=G.Q8_0))


class Perturbed(pc.Backend):
    """``inner`` with op ``key`` (optionally only where source 0 has type ``src0`` or the batch has ``rows``
    rows) wrong: the first half of each result row scaled by ``factor`` after it computes (not a uniform
    scale, which Gemma's norms after each block would undo). A backend wrong on exactly one op of the model."""

    def __init__(self, name: str, inner: str, key: str | None, factor: float = 1.0, src0: G | None = None,
                 rows: int | None = None) -> None:
        self.name, self.inner = name, pc.backend(inner)
        self.key, self.factor, self.src0, self.rows = key, factor, src0, rows
        self.activation_precision = self.inner.activation_precision
        self.block_types = self.inner.block_types

    def supports(self, node: pc.Tensor) -> bool:
        return self.inner.supports(node)

    def why_unsupported(self, node: pc.Tensor) -> str:
        return self.inner.why_unsupported(node)

    def _hit(self, node: pc.Tensor) -> bool:
        return (node.opdef is not None and node.opdef.key == self.key
                and (self.src0 is None or node.src[0].type == self.src0)
                and (self.rows is None or node.ne[1] == self.rows))

    def prepare(self, node: pc.Tensor):
        call = self.inner.prepare(node) or partial(self.inner.compute, node)
        if not self._hit(node):
            return call

        def wrong() -> None:
            call()
            node.host()[..., : node.ne[0] // 2] *= self.factor
        return wrong

    def compute(self, node: pc.Tensor) -> None:
        self.prepare(node)()


@pytest.fixture
def register():
    names = []

    def add(b: pc.Backend) -> str:
        module = type(sys)(f"{b.name}_plugin")
        module.prism_register_backends = pc.hookimpl(lambda: [b])
        pc.REGISTRY.register(module, f"{b.name}_plugin")
        names.append(f"{b.name}_plugin")
        return b.name
    yield add
    for n in names:
        pc.REGISTRY.unregister(n)


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = cli(["conformance", *args])
    out = capsys.readouterr()
    return rc, out.out + out.err


def _verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if "certified on " in line]


# ------------------------------------------------------------------ the bounds and checks, by hand
def test_bounds_from_the_declared_precision():
    b = mc.Bounds("q8", 100)
    assert b.unit == Q8_UNIT
    assert b.rms == pytest.approx(2 * Q8_UNIT * 10)  # K u sqrt(n), K = 2
    assert b.element == pytest.approx(6 * 2 * Q8_UNIT * 10)
    assert mc.Bounds("f32", 4).rms == pytest.approx(2 * 64 * 2.0**-24 * 2)
    assert mc.Bounds("f64", 1).rms < 1e-12


def test_relative_errors_by_hand():
    ref = np.array([[3.0, -4.0], [0.0, 0.0]])  # rms over all: sqrt(25/4) = 2.5; row 0 rms sqrt(12.5)
    got = np.array([[3.0, -3.0], [0.0, 0.0]])
    rms, rel, mx = mc.relative_errors(got, ref)
    assert rms == pytest.approx(math.sqrt(1 / 4) / 2.5)
    assert rel == pytest.approx(1 / math.sqrt(12.5)) and mx == 1.0
    assert mc.relative_errors(np.array([[np.nan, 0.0]]), np.array([[1.0, 0.0]]))[0] == math.inf


def test_greedy_accepts_only_near_ties():
    b = mc.Bounds("q8", 1)  # a disagreement is a near tie when within 2 * 6 * 2 * Q8_UNIT of the row's rms
    row = np.zeros(8)
    row[[2, 5]] = [10.0, 10.0 - 0.05]  # rms = sqrt(199.0025 / 8) = 4.99; near tie bound about 0.53
    assert mc.greedy([5], row[None], b).passed  # 0.05 apart: within
    far = row.copy()
    far[5] = 5.0  # 5 apart: no tie
    c = mc.greedy([5], far[None], b)
    assert not c.passed and c.agree == 0 and "leads by 5" in c.message
    assert mc.greedy([2], far[None], b).agree == 1


# ------------------------------------------------------------------ the command on a tiny model
def test_correct_backends_are_certified(tiny, tmp_path, capsys):
    rc, out = _run(capsys, "--model", tiny, "--backend", "csimd", "--backend", "numpy", "--prompts", "2",
                   "--reference-cache", str(tmp_path))
    assert rc == 0, out
    v = _verdicts(out)
    assert len(v) == 2 and all(line.startswith("certified on tiny-gemma3.gguf: 18 checks (2 prompts x 3 cache types)")
                               for line in v), v
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines() if line.startswith("teacher-forced logits")}
    assert set(rows) == {f"teacher-forced logits ({c})" for c in ("f16", "f32", "q8_0")}
    assert all("exact 2/2" in r for r in rows.values())  # numpy against itself
    assert "csimd: activation precision q8" in out and "numpy: activation precision f64" in out
    assert "reference: 6 token sequences computed by numpy" in out  # 2 prompts x 3 caches (same tokens)
    rc, out = _run(capsys, "--model", tiny, "--backend", "csimd", "--prompts", "2", "--reference-cache", str(tmp_path))
    assert rc == 0 and "reference: 0 token sequences computed by numpy" in out  # all read back from disk


@pytest.mark.parametrize("inner", ["csimd", "numpy"])
def test_a_wrong_rms_norm_fails_with_the_op_named(tiny, inner, register, capsys):
    name = register(Perturbed(f"badnorm_{inner}", inner, "RMS_NORM", 1.25))
    rc, out = _run(capsys, "--model", tiny, "--backend", name, "--prompts", "1", "--cache-type", "f16",
                   "--reference-cache", "none")
    assert rc == 1, out
    (v,) = _verdicts(out)
    assert v.startswith("NOT certified on tiny-gemma3.gguf") and "first node out of bound: RMS_NORM node #" in v, v
    assert "before blk.0.attn_norm.weight" in out  # the first RMS_NORM of the graph, the attention's input norm


def test_a_wrong_q8_0_product_is_named_and_a_subtle_one_caught_at_f64(tiny, register, capsys):
    name = register(Perturbed("badq8", "csimd", "MUL_MAT", 1.2, src0=G.Q8_0))
    rc, out = _run(capsys, "--model", tiny, "--backend", name, "--prompts", "1", "--cache-type", "f32",
                   "--reference-cache", "none")
    assert rc == 1 and "first node out of bound: MUL_MAT node #" in _verdicts(out)[0], out
    # 1e-5 relative on every GEGLU: inside a q8 backend's model bounds, far outside an exact one's
    name = register(Perturbed("subtle", "numpy", "GEGLU", 1 + 1e-5))
    rc, out = _run(capsys, "--model", tiny, "--backend", name, "--prompts", "1", "--cache-type", "f16",
                   "--reference-cache", "none")
    assert rc == 1 and "first node out of bound: GEGLU node #" in _verdicts(out)[0], out


def test_decode_rows_that_differ_from_the_batch_fail_the_batch_check(tiny, register, capsys):
    name = register(Perturbed("baddecode", "csimd", "MUL_MAT", 1.5, src0=G.Q8_0, rows=1))  # one-token batches only
    rc, out = _run(capsys, "--model", tiny, "--backend", name, "--prompts", "1", "--cache-type", "f16",
                   "--reference-cache", "none")
    assert rc == 1, out
    row = next(line for line in out.splitlines() if line.startswith("decode vs batch (f16)"))
    assert "FAIL 1/1" in row
    tf = next(line for line in out.splitlines() if line.startswith("teacher-forced logits (f16)"))
    assert "ok 1/1" in tf  # the batched pass is right: only decoding is wrong
    (v,) = _verdicts(out)  # and the sweep of a decode step names the product
    assert "first node out of bound: MUL_MAT node #" in v and " in a decode step, before blk.0.attn_q.weight" in v, v


@pytest.mark.parametrize("args, message", [
    (["--op", "ADD"], "--op: options of the op suite, not of --model"),
    (["--prompts", "9"], "prompts must be an int in [1, 8]"),
    (["--cache-type", "q4_0"], "cache types must be among f16, f32, q8_0, got q4_0"),
])
def test_model_usage_errors_exit_2(tiny, args, message, capsys):
    rc, out = _run(capsys, "--model", tiny, "--backend", "numpy", *args)
    assert rc == 2 and message in out, out


def test_model_only_options_need_a_model_and_a_model_must_exist(capsys):
    rc, out = _run(capsys, "--backend", "numpy", "--prompts", "2")
    assert rc == 2 and "--prompts certify a model: give --model MODEL with them" in out
    rc, out = _run(capsys, "--model", "/nonexistent/m.gguf", "--backend", "numpy")
    assert rc == 2 and "no model file '/nonexistent/m.gguf'" in out


def test_pytest_plugin_certifies_a_model(tiny, tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                        "prism_core.conformance", "-k", "test_model", "--prism-backend", "csimd",
                        "--prism-model", tiny, "--prism-prompts", "2", "--prism-reference-cache", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "7 passed" in r.stdout  # 2 prompts x 3 cache types, and the node sweep
    rows = [line for line in r.stdout.splitlines() if "  csimd  teacher-forced ok" in line]
    assert "prism model conformance" in r.stdout and len(rows) == 6 and rows[-1].startswith("q8_0  prompt 2")


def test_a_q8_product_is_judged_by_its_activation_rounding():
    """Heavy-tailed activations (one outlier per Q8_K block, as a model's FFN has): csimd's product is
    outside MUL_MAT's NMSE bound of 5e-4 because its Q8_K rounding is coarse, yet within what that
    rounding allows; 10% off on half the outputs is not."""
    from prism_core.conformance.model_nodes import q8_product_verdict
    from prism_core.conformance.runner import judge
    r = np.random.default_rng(0)
    w = r.standard_normal((64, 512)).astype(np.float32)
    x = r.standard_normal((3, 512)).astype(np.float32)
    x[:, ::256] = 60.0  # each block's step becomes 60/127: the other values round coarsely

    def product(backend: str) -> tuple[pc.Tensor, np.ndarray]:
        ctx = pc.Context(mem_size=1 << 24)
        y = pc.mul_mat(ctx.from_numpy(w, type=G.Q4_K), ctx.from_numpy(x)).set_output()
        pc.plan(y, pc.backend(backend), strict=True).compute()
        return y, y.numpy().copy()
    y, got = product("csimd")
    _, ref = product("numpy")
    assert not judge(y, y, got, ref).ok  # NMSE 1.2e-3 against the op's 5e-4
    assert q8_product_verdict(y, got, ref).ok
    bad = got.copy()
    bad[..., :32] *= 1.1
    v = q8_product_verdict(y, bad, ref)
    assert not v.ok and "times the error quantizing the activations to q8_K allows" in v.message, v


def test_an_op_wrong_within_the_model_bounds_is_caught_by_the_sweep(tiny, register, capsys):
    """1e-5 relative on half of every GEGLU row of a q8 backend: the logits stay within the q8 bounds, but
    the node sweep (on by default) finds GEGLU 80 ulp off, beyond its 8 ulp; --no-sweep does not look."""
    name = register(Perturbed("slightgeglu", "csimd", "GEGLU", 1 + 1e-5))
    args = ("--model", tiny, "--backend", name, "--prompts", "1", "--cache-type", "f16", "--reference-cache", "none")
    rc, out = _run(capsys, *args)
    assert rc == 1, out
    assert "teacher-forced logits (f16)  ok 1/1" in out  # the model-level checks pass
    (v,) = _verdicts(out)
    assert "first node out of bound: GEGLU node #" in v, v
    sweep_row = next(line for line in out.splitlines() if line.startswith("node sweep"))
    assert sweep_row.split()[-2:] == ["GEGLU", "x4"]  # 2 layers, in the batched pass and the decode step
    rc, out = _run(capsys, *args, "--no-sweep")
    assert rc == 0 and next(line for line in out.splitlines() if line.startswith("node sweep")).endswith("not run")


def test_model_reports_and_quiet(tiny, tmp_path, capsys):
    import json
    rc, out = _run(capsys, "--model", tiny, "--backend", "numpy", "--prompts", "1", "--cache-type", "f32", "-q",
                   "--reference-cache", "none", "--report", "json", str(tmp_path / "m.json"),
                   "--report", "markdown", str(tmp_path / "m.md"))
    assert rc == 0 and "teacher-forced logits" not in out and len(_verdicts(out)) == 1, out  # -q: no table
    cert = json.loads((tmp_path / "m.json").read_text())
    (b,) = cert["backends"]
    assert cert["mode"] == "model" and b["certified"] and b["bounds"]["precision"] == "f64"
    (p,) = b["prompts"]
    assert p["cache"] == "f32" and [c["kind"] for c in p["checks"]] == ["teacher-forced", "batch", "greedy"]
    assert all(c["exact"] for c in p["checks"][:2]) and b["sweep"] == {"ran": True, "out_of_bounds": {},
                                                                       "text": b["sweep"]["text"]}
    assert "| " not in (md := (tmp_path / "m.md").read_text()) and "teacher-forced logits (f32)" in md


def test_an_unreadable_reference_file_is_computed_again(tiny, tmp_path, capsys):
    args = ("--model", tiny, "--backend", "csimd", "--prompts", "1", "--cache-type", "f16", "--no-sweep", "-q",
            "--reference-cache", str(tmp_path))
    rc, out = _run(capsys, *args)
    assert rc == 0 and "reference: 1 token sequences computed" in out
    (file,) = tmp_path.glob("*.npy")
    file.write_bytes(b"not an array")
    rc, out = _run(capsys, *args)
    assert rc == 0 and "reference: 1 token sequences computed" in out
    rc, out = _run(capsys, *args)
    assert rc == 0 and "reference: 0 token sequences computed" in out
