"""Issue 26, items 3 and 6: every new entry point refuses bad input with a PrismError naming the argument,
and the leftovers of round two (a backend name that is not a str, bools and floats as enum params, None as
ROPE's n_dims, the gradient of a zero-extent MEAN)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import refused
from test_models import _spm_vocabulary, tiny, to_tensors

import prism_core as pc
from prism_core import InvalidArgument, tokenizer
from prism_core.cli import exit_status, main
from prism_core.models import Model, Sampler, load


@pytest.fixture(scope="module")
def model() -> Model:
    meta, w = tiny("llama", seed=5)
    return Model(to_tensors(w), {**meta, **_spm_vocabulary(50)}, backend="numpy", n_ctx=64)


# ---------------------------------------------------------------- item 3: entry points
def test_generate_refuses_a_sampler_that_is_not_one_and_the_model_stays_usable(model):
    for bad in ("greedy", 0.0, {"temperature": 0}):
        with pytest.raises(InvalidArgument, match=r"sampler must be a Sampler"):
            list(model.generate([1, 7], 4, sampler=bad))
    greedy = [t.id for t in model.generate([1, 7], 3)]
    assert greedy == [t.id for t in model.generate([1, 7], 3, sampler=Sampler.greedy())] and len(greedy) <= 3


@pytest.mark.parametrize("bad", [None, 5, ["gemma3-270m"]])
def test_load_refuses_what_is_not_a_path_or_a_name(bad):
    with pytest.raises(InvalidArgument, match=r"model must be a GGUF path or a known model name"):
        load(bad)


def test_decode_and_from_metadata_refuse_what_is_not_ids_or_metadata(model):
    tok = model.tokenizer
    for bad in (None, 5, "t8", b"\x08"):
        with pytest.raises(InvalidArgument, match=r"decode: ids must be an iterable of token ids"):
            tok.decode(bad)
    assert tok.decode(np.array([8, 9])) == tok.decode([8, 9]) == "t8 t9"  # SPM: the first space removed
    for bad in (None, [("tokenizer.ggml.model", "llama")], "llama"):
        with pytest.raises(InvalidArgument, match=r"from_metadata: meta must be a mapping"):
            tokenizer.from_metadata(bad)


def test_a_sampler_is_immutable_and_a_changed_copy_is_checked():
    s = Sampler(temperature=1.0, seed=3)
    for name, value in (("temperature", -1.0), ("top_k", -5), ("top_p", 7.0), ("repeat_penalty", 0.0)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(s, name, value)
        with pytest.raises(InvalidArgument, match=f"sampler: {name}"):
            dataclasses.replace(s, **{name: value})
    assert s.temperature == 1.0 and s.top_k == 40
    z = np.array([0.0, 5.0, 4.0, -1.0, 4.5])
    assert dataclasses.replace(s, temperature=0.0)(z) == 1  # greedy: the argmax
    with pytest.raises(InvalidArgument, match=r"repeat_penalty must be a number in \(0.0"):
        Sampler(repeat_penalty=0.0)


def test_gguf_items_must_be_a_count(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["gguf", str(tmp_path / "x.gguf"), "--items", "-1"])
    assert e.value.code == 2 and "--items" in capsys.readouterr().err


def test_usage_errors_exit_2_and_failures_of_the_work_1():
    for e in (pc.InvalidArgument("x"), pc.BoundExceeded("x"), pc.MalformedFile("x"), pc.UnknownBackend("x"),
              pc.Unsupported("x"), pc.models.ModelConfigError("x")):
        assert exit_status(e) == 2, type(e).__name__
    from prism_core.finetune import TrainingDiverged
    for e in (pc.BackendUnavailable("x"), pc.PluginError("x"), TrainingDiverged("x")):
        assert exit_status(e) == 1, type(e).__name__


def test_prism_run_refusing_a_sampler_exits_2(capsys):
    assert main(["run", "no-such-model.gguf", "-p", "x", "--top-p", "7"]) == 2
    assert "top_p must be a number in (0.0, 1.0]" in capsys.readouterr().err


# ---------------------------------------------------------------- item 6: leftovers of round two
@pytest.mark.parametrize("bad", [[], 3, ("numpy",)])
def test_a_backend_name_must_be_a_str(bad):
    with pytest.raises(InvalidArgument, match=r"a backend name must be a str"):
        pc.backend(bad)


@pytest.mark.parametrize("bad", [None, False, True, 4.0])
def test_rope_n_dims_must_be_an_int(bad):
    ctx = pc.Context()
    a = ctx.new_tensor(pc.F32, (4, 1, 2))  # ggml ne: rows of 4, 1 head, 2 tokens
    pos = ctx.from_numpy(np.arange(2, dtype=np.int32))
    with refused(InvalidArgument, r"ROPE: parameter 'n_dims' must be an int", ctx):
        pc.rope(a, pos, n_dims=bad)
    assert pc.rope(a, pos, n_dims=0).params["n_dims"] == 4  # 0: the whole row, as documented


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), 1.0])
def test_enum_params_refuse_bools_and_floats(bad):
    ctx = pc.Context()
    a = ctx.new_tensor(pc.F32, (4,))
    with refused(InvalidArgument, r"ARGSORT: parameter 'order' must be one of \['ASC', 'DESC'\]", ctx):
        pc.argsort(a, order=bad)
    assert pc.argsort(a, order=1).params["order"] == pc.SortOrder.DESC
    assert pc.argsort(a, order=np.int32(0)).params["order"] == pc.SortOrder.ASC


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_the_gradient_of_a_zero_extent_mean_is_empty(backend):
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    ctx = pc.Context()
    a = ctx.new_tensor(pc.F32, (0, 3)).set_param()  # ggml ne [0, 3]: 3 rows of 0 elements
    m = pc.mean(a)
    loss = pc.sum(m).set_loss()
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g, backend=backend)
    assert np.isnan(m.numpy()).all() and m.numpy().shape == (3, 1)  # 0 / 0, as ggml's sum / ne00
    assert g.grad(a).numpy().shape == (3, 0)  # no element, no derivative
