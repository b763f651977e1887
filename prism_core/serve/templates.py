"""Chat templates: the file's ``tokenizer.chat_template`` (HF/llama.cpp's jinja convention: ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``) rendered in jinja2's immutable
sandbox, or a built-in one by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidArgument

TEMPLATE_KEY = "tokenizer.chat_template"

BUILTIN: dict[str, str] = {
    "chatml": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "gemma": ("{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
              "{% set first = messages[0]['content'] + '\\n\\n' %}{% set msgs = messages[1:] %}"
              "{% else %}{% set first = '' %}{% set msgs = messages %}{% endif %}"
              "{% for m in msgs %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
              "{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + m['content'] | trim"
              " + '<end_of_turn>\\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"),
    "llama3": ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
               " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
}


class TemplateError(InvalidArgument):
    """A template that is missing, unknown, or raised while rendering."""


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused the messages: {message}")


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._t = env.from_string(source)
        except TemplateSyntaxError as e:
            raise TemplateError(f"the chat template does not parse: {e}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError as JinjaError
        try:
            return self._t.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                                  bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError:
            raise
        except (JinjaError, TypeError, ValueError, KeyError, IndexError) as e:
            raise TemplateError(f"the chat template failed on these messages: {e}") from None


def for_model(model: Any, name: str | None = None) -> ChatTemplate | None:
    """The model's template (or the built-in ``name``); None when the file has none and no name is given."""
    if name is not None:
        if name not in BUILTIN:
            raise TemplateError(f"unknown chat template {name!r}; built-in: {', '.join(sorted(BUILTIN))}")
        source = BUILTIN[name]
    else:
        source = model.meta.get(TEMPLATE_KEY)
        if not source:
            return None
    tok = model.tokenizer
    bos = tok.token_text(tok.bos) if getattr(tok, "bos", None) is not None else ""
    eos = tok.token_text(tok.eos) if getattr(tok, "eos", None) is not None else ""
    return ChatTemplate(str(source), bos, eos)
