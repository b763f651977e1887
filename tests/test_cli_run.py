"""``prism run`` follows llama-cli: the prompt echoed (``--no-display-prompt``), ``-f FILE``, ``-n -1`` until
end-of-generation bounded by the context, ``-c``/``-s``, defaults in ``--help``, an empty prompt (BOS alone).
On the tiny character-vocabulary model of tests/finetune_models.py (BOS is id 1, EOS id 2)."""

from __future__ import annotations

import json

import pytest
from finetune_models import write_tiny

from prism_core.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny(tmp_path_factory.mktemp("run") / "tiny.gguf"))


class Scripted:
    """A sampler that emits a fixed list of ids, then keeps repeating the last one."""

    def __init__(self, script):
        self.script, self.i = list(script), 0

    def __call__(self, logits, history=()):
        tok = self.script[min(self.i, len(self.script) - 1)]
        self.i += 1
        return tok


def run_json(capsys, *argv):
    assert main(["run", *argv, "--backend", "numpy", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_prompt_is_echoed_unless_no_display_prompt(tiny, capsys):
    text = run_json(capsys, tiny, "-p", "the cat", "-n", "4", "--temp", "0")["text"]
    assert main(["run", tiny, "-p", "the cat", "-n", "4", "--temp", "0", "--backend", "numpy"]) == 0
    assert capsys.readouterr().out == "the cat" + text + "\n"
    assert main(["run", tiny, "-p", "the cat", "-n", "4", "--temp", "0", "--backend", "numpy",
                 "--no-display-prompt"]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_a_prompt_file_is_the_same_as_the_prompt(tiny, capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a dog ran", encoding="utf-8")
    by_file = run_json(capsys, tiny, "-f", str(f), "-n", "3", "--temp", "0")
    by_flag = run_json(capsys, tiny, "-p", "a dog ran", "-n", "3", "--temp", "0")
    assert by_file["prompt_ids"] == by_flag["prompt_ids"] and by_file["ids"] == by_flag["ids"]
    assert main(["run", tiny, "-f", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # -p and -f together: a usage error
        main(["run", tiny, "-f", str(f), "-p", "x"])


def test_n_minus_one_generates_until_the_context_is_full_or_end_of_generation(tiny, capsys, monkeypatch):
    # "ab": BOS, "▁", "a", "b" (ids 1, 4, 5, 6: the vocabulary has single letters only); a context of 12
    # leaves 8 tokens
    monkeypatch.setattr("prism_core.models.Sampler", lambda **kw: Scripted([5]))
    out = run_json(capsys, tiny, "-p", "ab", "-n", "-1", "-c", "12")
    assert out["prompt_ids"] == [1, 4, 5, 6] and out["ids"] == [5] * 8
    monkeypatch.setattr("prism_core.models.Sampler", lambda **kw: Scripted([5, 6, 2]))  # 2 is EOS
    assert run_json(capsys, tiny, "-p", "ab", "-n", "-1", "-c", "12")["ids"] == [5, 6]
    with pytest.raises(SystemExit):
        main(["run", tiny, "-p", "ab", "-n", "-2"])


def test_an_empty_prompt_is_the_bos_token_alone(tiny, capsys):
    out = run_json(capsys, tiny, "-p", "", "-n", "2", "--temp", "0")
    assert out["prompt_ids"] == [1] and len(out["ids"]) <= 2


def test_short_flags_are_the_long_ones(tiny, capsys):
    short = run_json(capsys, tiny, "-p", "the", "-n", "6", "-s", "7", "-c", "32", "--temp", "1.5")
    long_ = run_json(capsys, tiny, "-p", "the", "-n", "6", "--seed", "7", "--ctx-size", "32", "--temp", "1.5")
    assert short["ids"] == long_["ids"]
    # -c bounds the context: the prompt (5 ids) and 40 tokens do not fit in 32
    assert main(["run", tiny, "-p", "the", "-n", "40", "-c", "32", "--backend", "numpy"]) == 2  # a usage error
    assert "context" in capsys.readouterr().err


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in (("-n", "64"), ("--temp", "0.8"), ("--top-k", "40"), ("--top-p", "0.95"),
                          ("--min-p", "0.05"), ("--cache-type", "f16")):
        assert f"(default: {default})" in out, flag
    assert "--no-display-prompt" in out and "-f FILE" in out


def test_compiling_while_loading_counts_as_compiling_not_load(tiny, capsys, monkeypatch):
    """A JIT backend compiles its weight-preparing kernels while the model loads (numba, cold cache: the load
    read 133 s of which 131 were compiling): that time is reported as compile, apart from the load time. Here
    the backend's compile clock says an hour passed compiling during the load, more than the whole load took,
    so all of the load counts as compiling and none as loading."""
    import prism_core as pc
    monkeypatch.setattr(type(pc.backend("numpy")), "compile_seconds", lambda self: 3600.0)
    rep = run_json(capsys, tiny, "-p", "the cat", "-n", "2", "--temp", "0")
    assert rep["load_s"] == 0.0 and rep["compile_s"] > 0.0
    assert main(["run", tiny, "-p", "the cat", "-n", "2", "--temp", "0", "--backend", "numpy"]) == 0
    err = capsys.readouterr().err
    assert "; load 0.00 s;" in err, err  # (the tiny model loads in less than the 0.05 s a compile line needs)
