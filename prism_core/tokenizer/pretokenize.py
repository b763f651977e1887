"""BPE pre-tokenizers: each ``tokenizer.ggml.pre`` value's splitting steps, as in llama.cpp.

A value names a list of steps; each step splits every piece the previous one left into
smaller pieces (text a step does not match stays a piece of its own). A step is either one of
llama.cpp's hand-written splitters (gpt2, llama3, qwen2, qwen35, newlines: written here as
regexes whose classes are llama.cpp's codepoint classes) or one of its std::regex patterns,
translated to Python's ``re`` the way llama.cpp runs it: over the collapsed text when the
pattern names a ``\\p{..}`` class, else over the text with non-ASCII whitespace replaced by a
stand-in (ECMAScript ``\\s`` is ASCII only there).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidArgument
from . import unicode as uc

# llama.cpp's pre-tokenizer patterns (llama-vocab.cpp, llm_tokenizer_bpe), as data
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_DEEPSEEK_LLM_LETTERS = (  # non-ASCII written as escapes: the exact codepoints, safe from normalisation
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+")
_DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CI = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_CASED = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+@CI@|"
          "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*@CI@|")
_WS_TAIL = "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

# step lists; a name in CUSTOM is a hand-written splitter, anything else a std::regex pattern
PRE_STEPS: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": ("llama3",),
    "deepseek-llm": ("[\r\n]", _DEEPSEEK_LLM_LETTERS, _DEEPSEEK_LLM_PUNCT, "\\s+$", _CJK, "\\p{N}+"),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"),
    "falcon": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "starcoder": ("\\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "qwen2": ("qwen2",),
    "qwen35": ("qwen35",),
    "gemma4": ("newlines",),
    "sarvam-moe": ("newlines",),
    "poro": (_PORO,),
    "viking": (_PORO, "\\p{N}"),
    "ufakzeka": ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" + _WS_TAIL,),
    "seed-coder": (_CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
                   + _WS_TAIL,),
    "laguna": ("newlines", "qwen2"),
    "minicpm5": ("\\p{N}{1,3}",
                 _CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" + _WS_TAIL),
    "bailingmoe": ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                   " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "jais-2": (_CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
               + "|".join(f"\\s{{{k}}}(?!\\S)" for k in (512, 256, 128, 64, 32, 16, 8, 4, "1,2")) + "|\\s{1}",),
    "gpt-4o": (_CASED.replace("@CI@", _CI + "?") + "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" + _WS_TAIL,),
    "tekken": (_CASED.replace("@CI@", "") + "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|" + _WS_TAIL,),
}

# the llama.cpp pattern each hand-written splitter stands for (llama.cpp picks them by this text)
CUSTOM_SOURCE = {
    "llama3": _CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" + _WS_TAIL,
    "qwen2": _CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" + _WS_TAIL,
    "qwen35": _CI + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
              + _WS_TAIL,
    "newlines": "[^\\n]+|[\\n]+",
}

# tokenizer.ggml.pre value -> (step list, options), from llama.cpp's vocabulary loader
_NO_CLEAN = {"clean_spaces": False}
PRE_TYPES: dict[str, tuple[str, dict[str, bool]]] = {
    "default": ("default", {}),
    **{k: ("llama3", {"ignore_merges": True, "add_bos": True}) for k in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    "deepseek-llm": ("deepseek-llm", _NO_CLEAN),
    "deepseek-coder": ("deepseek-coder", _NO_CLEAN),
    "falcon": ("falcon", {}),
    "mpt": ("gpt2", {}),
    "starcoder": ("starcoder", {}),
    "refact": ("starcoder", {}),
    "command-r": ("starcoder", _NO_CLEAN),
    "smollm": ("starcoder", _NO_CLEAN),
    "codeshell": ("starcoder", {}),
    "exaone": ("starcoder", {}),
    "mellum2": ("starcoder", {}),
    **{k: ("gpt2", {}) for k in (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "exaone4", "olmo", "jais")},
    **{k: ("gpt2", {"add_sep": True}) for k in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    **{k: ("qwen2", _NO_CLEAN) for k in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2")},
    "stablelm2": ("qwen2", {}),
    "qwen35": ("qwen35", _NO_CLEAN),
    "gemma4": ("gemma4", {"escape_whitespaces": True, "byte_encode": False}),
    "granite-embed-multi-311m": ("gemma4", {"escape_whitespaces": True, "byte_encode": False}),
    "sarvam-moe": ("sarvam-moe", {"escape_whitespaces": True, "byte_encode": False, "clean_spaces": False}),
    **{k: ("llama3", {}) for k in ("dbrx", "smaug-bpe")},
    "megrez": ("qwen2", {}),
    **{k: ("qwen2", _NO_CLEAN) for k in ("hunyuan", "solar-open", "grok-2")},
    **{k: ("gpt2", _NO_CLEAN) for k in ("trillion", "granite-docling")},
    "minerva-7b": ("starcoder", {}),
    **{k: ("gpt-4o", _NO_CLEAN) for k in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    "poro-chat": ("poro", _NO_CLEAN),
    "bloom": ("poro", {}),
    "gpt3-finnish": ("poro", {}),
    "viking": ("viking", _NO_CLEAN),
    "ufakzeka": ("ufakzeka", _NO_CLEAN),
    "seed-coder": ("seed-coder", _NO_CLEAN),
    "laguna": ("laguna", _NO_CLEAN),
    "minicpm5": ("minicpm5", {"ignore_merges": True}),
    **{k: ("bailingmoe", _NO_CLEAN) for k in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "jais-2": ("jais-2", {}),
    "tekken": ("tekken", {"clean_spaces": False, "ignore_merges": True, "add_bos": True}),
}


# values llama.cpp knows whose splitters are not ported yet (they need its other hand-written code,
# digit grouping, or options beyond these)
NOT_PORTED = frozenset({
    "chameleon", "chatglm-bpe", "glm4", "glm5", "deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4", "spark2_5",
    "youtu", "kimi-k2", "afmoe", "superbpe", "tiny_aya", "cohere2moe", "granite-embed-multi-97m", "exaone-moe",
    "whitespace"})


@dataclass(frozen=True)
class _Step:
    pattern: re.Pattern[str]
    collapsed: bool  # run over uc.collapse(text), else over uc.spaces_to_stand_in(text)


def _class(members: str) -> str:
    return "".join(re.escape(c) for c in members)


# class bodies (without brackets) by llama.cpp's tables
_WS = _class(uc.ascii_members(uc.IS_WHITESPACE)) + re.escape(uc.REP_SPACE)
_L = _class(uc.ascii_members(uc.LETTER)) + uc.REP_LETTER
_N = _class(uc.ascii_members(uc.NUMBER)) + uc.REP_NUMBER
_M = uc.REP_MARK
_P = _class(uc.ascii_members(uc.PUNCTUATION)) + uc.REP_PUNCT
_S = _class(uc.ascii_members(uc.SYMBOL)) + uc.REP_SYMBOL
_UCAT = {"N": _N, "L": _L, "P": _P, "M": _M, "S": _S, "Lu": _L, "Ll": _L, "Lt": _L, "Lm": _L, "Lo": _L}

_CONTRACTIONS_CI = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_TAIL = f"[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
CUSTOM: dict[str, str] = {
    "llama3": f"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}| ?[^{_WS}{_L}{_N}]+[\r\n]*|{_TAIL}",
    "qwen2": f"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]| ?[^{_WS}{_L}{_N}]+[\r\n]*|{_TAIL}",
    "qwen35": f"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}{_M}]+|[{_N}]| ?[^{_WS}{_L}{_M}{_N}]+[\r\n]*|{_TAIL}",
    "newlines": "[^\n]+|\n+",
}
# llama.cpp's gpt2 splitter is its own code, selected by the pattern text itself
CUSTOM_BY_PATTERN = {
    _GPT2: f"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_WS}{_L}{_N}]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+",
}


def translate(pattern: str) -> _Step:
    """llama.cpp's std::regex pattern as a Python pattern over the text llama.cpp would run it on."""
    uses_ucat = re.search(r"\\p\{(N|L|P|M|S|Lu|Ll|Lt|Lm|Lo)\}", pattern) is not None
    out: list[str] = []
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "p" and pattern.startswith("{", i + 2):
                end = pattern.index("}", i + 3)
                name = pattern[i + 3:end]
                if name not in _UCAT:
                    raise InvalidArgument(f"pre-tokenizer pattern {pattern!r}: class \\p{{{name}}} is not known")
                out.append(_UCAT[name] if inside else f"[{_UCAT[name]}]")
                i = end + 1
                continue
            if nxt in "sS":
                body = _WS if uses_ucat else _class(" \t\n\x0b\x0c\r")
                out.append(body if inside and nxt == "s" else f"[{'^' if nxt == 'S' else ''}{body}]")
                i += 2
                continue
            if nxt == "d":
                out.append("0-9" if inside else "[0-9]")
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            out.append(r"\Z")  # ECMAScript $ (no multiline): the end of the piece only
            i += 1
            continue
        out.append(c)
        i += 1
    return _Step(re.compile("".join(out)), uses_ucat)


def _custom(source: str) -> _Step:
    return _Step(re.compile(source), True)


def compile_steps(pre: str) -> list[_Step]:
    steps = []
    for s in PRE_STEPS[pre]:
        if s in CUSTOM:
            steps.append(_custom(CUSTOM[s]))
        elif s in CUSTOM_BY_PATTERN:
            steps.append(_custom(CUSTOM_BY_PATTERN[s]))
        else:
            steps.append(translate(s))
    return steps


def make_splitter(pre: str) -> Callable[[str], list[str]]:
    """A function text -> pieces (str slices of text) for a step list of PRE_STEPS."""
    steps = compile_steps(pre)

    def split(text: str) -> list[str]:
        if not text:
            return []
        bounds = [0, len(text)]
        views: dict[bool, str] = {}
        for step in steps:
            view = views.get(step.collapsed)
            if view is None:
                view = views[step.collapsed] = uc.collapse(text) if step.collapsed else uc.spaces_to_stand_in(text)
            finditer = step.pattern.finditer
            new = [0]
            for a, b in zip(bounds, bounds[1:]):
                for m in finditer(view, a, b):
                    s, e = m.span()
                    if s == e:
                        continue
                    if s > new[-1]:
                        new.append(s)
                    new.append(e)
                if b > new[-1]:
                    new.append(b)
            bounds = new
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]

    return split
