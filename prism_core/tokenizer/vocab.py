"""A vocabulary read from GGUF metadata (``tokenizer.ggml.*``), with llama.cpp's defaults and
its fix-ups of token attributes (control-looking tokens made control, phi-3's rstrip, ...)."""

from __future__ import annotations

import weakref
from array import array
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgument, Unsupported
from .pretokenize import NOT_PORTED, PRE_TYPES
from .token_table import TokenTable

# token types stored in tokenizer.ggml.token_type (gguf / llama.cpp's llama_token_type)
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

# token attributes (llama.cpp's llama_token_attr bits)
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = (1 << i for i in range(6))
ATTR_LSTRIP, ATTR_RSTRIP = 1 << 7, 1 << 8
_TYPE_TO_ATTR = {TYPE_NORMAL: ATTR_NORMAL, TYPE_UNKNOWN: ATTR_UNKNOWN, TYPE_CONTROL: ATTR_CONTROL,
                 TYPE_USER_DEFINED: ATTR_USER_DEFINED, TYPE_UNUSED: ATTR_UNUSED, TYPE_BYTE: ATTR_BYTE}

KEY = "tokenizer.ggml."

# tokenizer.ggml.model -> (kind, default special ids bos, eos, unk, sep, pad)
MODELS: dict[str, tuple[str, tuple[int | None, ...]]] = {
    "llama": ("spm", (1, 2, 0, None, None)),
    "bert": ("wpm", (101, None, 100, 102, 0)),
    "gpt2": ("bpe", (11, 11, None, None, None)),
    "gemma4": ("bpe", (None, None, None, None, None)),
    "t5": ("ugm", (None, 1, 2, None, 0)),
}
_LATER = {"rwkv": "RWKV", "plamo2": "PLaMo2", "hybriddna": "hybriddna BPE",
          "whitespace": "whitespace BPE", "no_vocab": "no vocabulary", "none": "no vocabulary"}

# names llama.cpp treats as end-of-generation and makes control tokens (llama-vocab.cpp, as data)
EOT_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
             "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
EOM_NAMES = ("<|eom_id|>",)
FIM_NAMES = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
     "<|prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
     "<|suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
     "<|middle|>"),
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
EOG_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
             "<｜end▁of▁sentence｜>", "[e~[")
USER_DEFINED_NAMES = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


@dataclass
class Vocab:
    kind: str                    # spm, bpe, wpm, ugm
    model: str                   # tokenizer.ggml.model
    pre: str                     # the step-list name of pretokenize.PRE_STEPS (bpe), else "default"
    tokens: TokenTable
    scores: np.ndarray
    attrs: MutableSequence[int]
    token_to_id: Mapping[str, int]  # tokens.index
    merges: dict[str, int] = field(default_factory=dict)  # "left right" -> rank
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    sep: int | None = None
    pad: int | None = None
    eot: int | None = None
    eom: int | None = None
    eog: frozenset[int] = frozenset()
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    escape_whitespaces: bool = False
    byte_encode: bool = True
    ignore_merges: bool = False
    remove_extra_whitespaces: bool = False
    treat_whitespace_as_suffix: bool = False
    charsmap: bytes | None = None
    lowercase: bool = True
    strip_accents: bool = True
    max_token_len: int = 0

    @property
    def size(self) -> int:
        return len(self.tokens)


def _string_list(meta: Mapping[str, Any], key: str) -> list[str]:
    v = meta[key]
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence | np.ndarray):
        raise InvalidArgument(f"{key}: expected an array of strings, got {type(v).__name__}")
    out = []
    for i, s in enumerate(v):
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="surrogateescape")
        elif not isinstance(s, str):
            raise InvalidArgument(f"{key}[{i}]: expected a string, got {type(s).__name__}")
        out.append(s)
    return out


_TABLES: dict[int, tuple[weakref.ref, TokenTable]] = {}  # id(Metadata) -> (it, its table): Mappings don't hash


def token_table(meta: Mapping[str, Any]) -> TokenTable:
    """``tokenizer.ggml.tokens`` as a :class:`TokenTable`: read from the file without decoding a
    ``list[str]`` when ``meta`` is a GGUF file's Metadata (and kept, one per file), else from the list."""
    key = KEY + "tokens"
    lazy = meta.undecoded_strings(key) if hasattr(meta, "undecoded_strings") else None
    if lazy is None:
        return TokenTable.from_strings(_string_list(meta, key))
    held = _TABLES.get(id(meta))
    if held is not None and held[0]() is meta:
        return held[1]
    table = TokenTable.from_gguf_strings(lazy.buf, lazy.start, lazy.lengths)
    key_id = id(meta)
    _TABLES[key_id] = (weakref.ref(meta, lambda _: _TABLES.pop(key_id, None)), table)
    return table


def _numbers(meta: Mapping[str, Any], key: str, n: int, dtype: type) -> np.ndarray | None:
    if key not in meta:
        return None
    v = meta[key]
    if isinstance(v, (str, bytes)):
        raise InvalidArgument(f"{key}: expected a numeric array, got a string")
    try:  # a file's array keeps its dtype when it converts exactly (no float64 copy of a vocabulary)
        arr = v if isinstance(v, np.ndarray) and np.can_cast(v.dtype, dtype) else np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{key}: expected a numeric array ({e})") from None
    if arr.ndim != 1:
        raise InvalidArgument(f"{key}: expected a 1-d array, got shape {arr.shape}")
    if len(arr) != n:
        raise InvalidArgument(f"{key} has {len(arr)} entries but {KEY}tokens has {n}: the arrays must agree in length")
    return arr.astype(dtype, copy=False)


def _byte_array(meta: Mapping[str, Any], key: str) -> bytes:
    v = meta[key]
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.size and (arr.min() < -128 or arr.max() > 255)):
        raise InvalidArgument(f"{key}: expected an array of bytes (int8/uint8), got {arr.dtype} of shape {arr.shape}")
    return (arr.astype(np.int16) & 0xFF).astype(np.uint8).tobytes()


def _flag(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    if key not in meta:
        return default
    v = meta[key]
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise InvalidArgument(f"{key}: expected a bool, got {v!r}")


def _text(meta: Mapping[str, Any], key: str) -> str | None:
    if key not in meta:
        return None
    v = meta[key]
    if isinstance(v, bytes):
        v = v.decode("utf-8", errors="replace")
    if not isinstance(v, str):
        raise InvalidArgument(f"{key}: expected a string, got {type(v).__name__}")
    return v


def from_metadata(meta: Mapping[str, Any]) -> Vocab:
    """Build a vocabulary from GGUF metadata (strings as str, string arrays as lists, numbers as arrays)."""
    model = _text(meta, KEY + "model")
    if model is None:
        raise InvalidArgument(f"{KEY}model is missing: the metadata holds no tokenizer")
    if model not in MODELS:
        if model in _LATER:
            raise Unsupported(f"{KEY}model = {model!r} ({_LATER[model]}) is not supported yet")
        raise InvalidArgument(f"{KEY}model = {model!r} is not a known tokenizer model (known: {sorted(MODELS)})")
    kind, (bos, eos, unk, sep, pad) = MODELS[model]
    if KEY + "tokens" not in meta:
        raise InvalidArgument(f"{KEY}tokens is missing")
    tokens = token_table(meta)
    n = len(tokens)
    if n == 0:
        raise InvalidArgument(f"{KEY}tokens is empty")
    scores = _numbers(meta, KEY + "scores", n, np.float32)
    types = _numbers(meta, KEY + "token_type", n, np.int64)

    v = Vocab(kind=kind, model=model, pre="default", tokens=tokens,
              scores=scores if scores is not None else np.zeros(n, np.float32), attrs=array("I"),
              token_to_id=tokens.index)
    pre = _text(meta, KEY + "pre")
    if model == "gemma4":
        pre = "gemma4"
    if kind == "bpe":
        v.clean_spaces = True
        if pre is None:
            pre = "default"
        if pre in NOT_PORTED:
            raise Unsupported(f"{KEY}pre = {pre!r}: llama.cpp's pre-tokenizer for it is not ported yet")
        if pre not in PRE_TYPES:
            raise InvalidArgument(f"{KEY}pre = {pre!r} is not a known pre-tokenizer (known: {sorted(PRE_TYPES)})")
        v.pre, opts = PRE_TYPES[pre]
        for name, value in opts.items():
            setattr(v, name, value)
        if KEY + "merges" not in meta:
            raise InvalidArgument(f"{KEY}merges is missing: a BPE vocabulary ({model!r}) needs its merges")
        for rank, m in enumerate(_string_list(meta, KEY + "merges")):
            if m.find(" ", 1) > 0:
                v.merges.setdefault(m, rank)  # the first of a repeated merge keeps its rank, as in llama.cpp
    elif kind == "spm":
        v.add_space_prefix, v.clean_spaces, v.add_bos, v.add_eos = True, False, True, False
    elif kind == "wpm":
        v.clean_spaces, v.add_bos, v.add_eos, v.add_sep = True, True, False, True
    elif kind == "ugm":
        v.add_bos, v.add_eos, v.escape_whitespaces = False, True, True
        if KEY + "precompiled_charsmap" in meta:
            v.charsmap = _byte_array(meta, KEY + "precompiled_charsmap")
    v.remove_extra_whitespaces = _flag(meta, KEY + "remove_extra_whitespaces", False)
    v.add_space_prefix = _flag(meta, KEY + "add_space_prefix", v.add_space_prefix)

    if empty := tokens.empty_ids():  # llama.cpp names empty tokens so that each text is unique
        texts = list(tokens)
        for i in empty:
            texts[i] = f"[EMPTY_{i}]"
        v.tokens = tokens = TokenTable.from_strings(texts)
        v.token_to_id = tokens.index  # a repeated text maps to its last id, as in llama.cpp
    if types is None:
        v.attrs = array("I", [ATTR_NORMAL]) * n
    else:  # one C int per token, not a list of int objects
        lut = np.zeros(max(_TYPE_TO_ATTR) + 1, np.uint32)
        for t, a in _TYPE_TO_ATTR.items():
            lut[t] = a
        known = (types >= 0) & (types < len(lut))
        v.attrs = array("I", np.where(known, lut[np.clip(types, 0, len(lut) - 1)], 0).astype(np.uint32).tobytes())
    v.max_token_len = tokens.max_nbytes

    specials = {"bos": bos, "eos": eos, "unk": unk, "sep": sep, "pad": pad, "eot": None, "eom": None}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                      ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
                      ("pad", "padding_token_id")):
        if specials[name] is not None and specials[name] >= n:
            specials[name] = None
        if KEY + key in meta:
            raw = meta[KEY + key]
            if not isinstance(raw, (int, np.integer)) or isinstance(raw, bool):
                raise InvalidArgument(f"{KEY}{key}: expected an integer token id, got {raw!r}")
            if 0 <= int(raw) < n:
                specials[name] = int(raw)
    for name, value in specials.items():
        setattr(v, name, value)
    v.add_bos = _flag(meta, KEY + "add_bos_token", v.add_bos)
    v.add_eos = _flag(meta, KEY + "add_eos_token", v.add_eos)
    v.add_sep = _flag(meta, KEY + "add_sep_token", v.add_sep)
    if v.pre == "gemma4":
        v.add_bos = True
    v.lowercase = _flag(meta, KEY + "normalizer.lowercase", True)
    v.strip_accents = _flag(meta, KEY + "normalizer.strip_accents", v.lowercase)
    _fix_attrs(v, meta)
    return v


def _fix_attrs(v: Vocab, meta: Mapping[str, Any]) -> None:
    """llama.cpp's load-time attribute fix-ups, in its order."""
    ids = v.token_to_id
    attrs = v.attrs

    def make_control(i: int) -> None:
        attrs[i] |= ATTR_CONTROL

    def first_of(names: Sequence[str]) -> int | None:
        # llama.cpp walks its token map in hash order; with several candidates present the first listed wins here
        for name in names:
            if name in ids:
                return ids[name]
        return None

    if v.eot is None and (i := first_of(EOT_NAMES)) is not None:
        v.eot = i
        make_control(i)
    if v.eom is None and (i := first_of(EOM_NAMES)) is not None:
        v.eom = i
        make_control(i)
    for names in FIM_NAMES:
        if (i := first_of(names)) is not None:
            make_control(i)
    fim_eog = [i for names in FIM_NAMES[3:] if (i := first_of(names)) is not None]
    for i in np.flatnonzero(np.frombuffer(attrs, np.uint32) & ATTR_CONTROL).tolist():
        t = v.tokens[i]
        if "unused" in t and ids[t] == i:  # of a repeated text, llama.cpp's map holds the last id
            attrs[i] |= ATTR_UNUSED
    eog = set(fim_eog)
    for name in EOG_NAMES:
        if name in ids:
            eog.add(ids[name])
            make_control(ids[name])
    for name in USER_DEFINED_NAMES:
        if name in ids:
            attrs[ids[name]] = ATTR_USER_DEFINED
    for i in (v.eos, v.eot, v.eom):
        if i is not None:
            eog.add(i)
    texts = {v.tokens[i]: i for i in eog}
    if "<|end|>" in texts and (("<|return|>" in texts and any(c in texts for c in ("<|call|>", "<|calls|>")))
                               or ("<|flush|>" in texts and any(c in texts for c in ("<|call|>", "<|calls|>")))):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    v.eog = frozenset(eog)

    name = (_text(meta, "general.name") or "").lower()
    arch = _text(meta, "general.architecture") or ""
    pre = _text(meta, KEY + "pre") or ""
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in ids:
            attrs[ids["<mask>"]] |= ATTR_LSTRIP
    elif "phi-3" in name or "phi3" in name:
        for i in special_ids(v):
            attrs[i] |= ATTR_RSTRIP
        for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if t in ids:
                attrs[ids[t]] = attrs[ids[t]] | ATTR_RSTRIP if on else attrs[ids[t]] & ~ATTR_RSTRIP
    elif "modern-bert" in name and "[MASK]" in ids:
        attrs[ids["[MASK]"]] |= ATTR_LSTRIP


def special_ids(v: Vocab) -> list[int]:
    """Control, user-defined and unknown tokens, longest text first (the order llama.cpp matches them in)."""
    ids = [i for i, a in enumerate(v.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
    ids.sort(key=lambda i: -len(v.tokens[i].encode("utf-8", errors="surrogateescape")))
    return ids
