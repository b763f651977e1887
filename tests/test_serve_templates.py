"""prism serve's pieces without a server: the built-in chat templates render as their models' own
(HF's Gemma 3, ChatML, Llama 3 formats, written out by hand), the sandbox refuses escapes, a template's
raise_exception is a clean error, stop strings are matched across token boundaries."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2")

from prism_core.errors import InvalidArgument  # noqa: E402
from prism_core.serve.schemas import StopMatcher  # noqa: E402
from prism_core.serve.templates import BUILTIN, ChatTemplate  # noqa: E402

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


def test_builtins_render_their_formats():
    gemma = ChatTemplate(BUILTIN["gemma"], "<bos>", "<eos>").render(MSGS)
    assert gemma == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                     "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    chatml = ChatTemplate(BUILTIN["chatml"]).render(MSGS[1:3], add_generation_prompt=False)
    assert chatml == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    llama3 = ChatTemplate(BUILTIN["llama3"], "<|begin_of_text|>").render(MSGS[1:2])
    assert llama3 == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_raise_exception_and_sandbox_escapes_are_clean_errors():
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
                     "{% endif %}ok")
    assert t.render(MSGS[1:]) == "ok"
    with pytest.raises(InvalidArgument, match="first must be user"):
        t.render(MSGS)
    with pytest.raises(InvalidArgument):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render(MSGS)
    with pytest.raises(InvalidArgument, match="does not parse"):
        ChatTemplate("{% for %}")


@pytest.mark.parametrize("pieces, stops, want, stopped", [
    (["Hel", "lo, wor", "ld"], ["o, w"], "Hell", True),  # across two pieces
    (["a", "b", "c"], ["bc"], "a", True),
    (["ab", "x"], ["bc"], "abx", False),  # a held-back prefix that does not complete goes out
    (["one two"], [], "one two", False),
    (["xy", "STOP", "z"], ["TOP", "STOP"], "xy", True),  # the earliest match wins
])
def test_stop_strings_across_pieces(pieces, stops, want, stopped):
    m = StopMatcher(stops)
    out = ""
    for p in pieces:
        out += m.feed(p)
        if m.stopped:
            break
    out += m.flush()
    assert (out, m.stopped) == (want, stopped)
