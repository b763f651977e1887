"""``prism chat``: the chat template over stdin's lines, the conversation kept in the KV cache between
turns (a turn computes only its new tokens), the output equal to a fresh generation over the whole
conversation. On the tiny character-vocabulary model (ids: 2 EOS, 4 "▁", 5.. the letters a..z)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from finetune_models import char_vocabulary, write_tiny

import prism_core as pc
from prism_core.cli import main
from prism_core.models import Sampler, load

# every role a word of letters; the assistant's turn opens as the generation prompt does (as Gemma's)
TEMPLATE = "{% for m in messages %}{{ 'model' if m['role'] == 'assistant' else m['role'] }} {{ m['content'] }} " \
           "{% endfor %}{% if add_generation_prompt %}model {% endif %}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from test_models import tiny, to_tensors
    d = tmp_path_factory.mktemp("chat")
    meta, w = tiny("llama", 0)
    meta = {"general.architecture": "llama", "general.file_type": 0,
            **{k: v for k, v in meta.items() if k != "general.architecture"}, **char_vocabulary(),
            "tokenizer.chat_template": TEMPLATE}
    pc.gguf.save(d / "chat.gguf", to_tensors(w), meta)
    return str(d / "chat.gguf"), str(write_tiny(d / "plain.gguf"))


class ScriptThenGreedy:
    def __init__(self, script):
        self.script = list(script)

    def __call__(self, logits, history=()):
        return self.script.pop(0) if self.script else int(np.argmax(logits))


def test_turns_reuse_the_cache_and_equal_a_fresh_generation(models, monkeypatch, capsys):
    path = models[0]
    monkeypatch.setattr("prism_core.models.Sampler", lambda **kw: ScriptThenGreedy([4, 5, 6, 2]))  # " ab", EOS
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nthe cat\n"))
    assert main(["chat", path, "--backend", "numpy", "-n", "5", "-c", "128"]) == 0
    out, err = capsys.readouterr()
    first, second = out.split("\n")[:2]
    assert first == " ab"
    # turn 2: "user hi model  ab user the cat model " after the cached "user hi model  ab": the 20
    # characters of " user the cat model " (each one token) are all that is computed
    assert "[20 prompt tokens computed" in err.splitlines()[1]
    m = load(path, backend="numpy", n_ctx=128)
    want = "".join(t.text for t in m.generate("user hi model  ab user the cat model ", 5, Sampler.greedy()))
    assert second == want


def test_a_model_without_a_template_is_refused_unless_a_builtin_is_named(models, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", models[1], "--backend", "numpy"]) == 1
    assert "tokenizer.chat_template" in capsys.readouterr().err
    assert main(["chat", models[1], "--backend", "numpy", "--chat-template", "chatml"]) == 0
    assert main(["chat", models[1], "--backend", "numpy", "--chat-template", "nope"]) == 1
    assert "unknown chat template 'nope'" in capsys.readouterr().err
