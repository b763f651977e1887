"""Codepoint classes as llama.cpp sees them (its own tables, see ``unicode_data``), and the
"collapsed" text the pre-tokenizer regexes run on.

Collapsing keeps ASCII as it is and replaces every other codepoint by one stand-in per class
(whitespace, letter, number, punctuation, accent mark, symbol, other), so a plain regex over
the collapsed string classifies each codepoint by llama.cpp's table rather than by Python's
Unicode database. The collapsed string has one character per codepoint, so match offsets are
offsets into the original text.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import cache

import numpy as np

from .unicode_data import FLAG_RANGES, LOWERCASE, NFD_RANGES, WHITESPACE

UNDEFINED, NUMBER, LETTER, SEPARATOR, ACCENT_MARK, PUNCTUATION, SYMBOL, CONTROL = (1 << i for i in range(8))
CATEGORIES = 0xFF
IS_WHITESPACE = 0x100
MAX_CODEPOINTS = 0x110000


@cache
def flag_table() -> np.ndarray:
    """Every codepoint's flags (2.2 MB, built when a pre-tokenizer or WPM first needs it: SPM never does)."""
    starts = np.array(FLAG_RANGES[0::2], dtype=np.int64)
    values = np.array(FLAG_RANGES[1::2], dtype=np.uint16)
    table = np.repeat(values[:-1], np.diff(starts)).astype(np.uint16)
    table[np.array(WHITESPACE)] |= IS_WHITESPACE
    return table


@cache
def _ascii_flags() -> tuple[int, ...]:
    starts, values, ws = FLAG_RANGES[0::2], FLAG_RANGES[1::2], set(WHITESPACE)
    return tuple(values[bisect_right(starts, c) - 1] | (IS_WHITESPACE if c in ws else 0) for c in range(128))

# stand-ins for non-ASCII codepoints (private-use characters never left in collapsed text)
OTHER, REP_NUMBER, REP_LETTER, REP_PUNCT, REP_MARK, REP_SYMBOL = (chr(0xE000 + i) for i in range(6))
REP_SPACE = "\x0b"  # a whitespace stand-in that is neither \r nor \n, as llama.cpp uses


def _collapse_table() -> np.ndarray:
    flags = flag_table()
    cat = flags & CATEGORIES
    out = np.full(MAX_CODEPOINTS, ord(OTHER), dtype=np.uint32)
    for flag, rep in ((NUMBER, REP_NUMBER), (LETTER, REP_LETTER), (PUNCTUATION, REP_PUNCT),
                      (ACCENT_MARK, REP_MARK), (SYMBOL, REP_SYMBOL)):
        out[cat == flag] = ord(rep)
    out[(flags & IS_WHITESPACE) != 0] = ord(REP_SPACE)
    out[:128] = np.arange(128)
    return out


_COLLAPSE: np.ndarray | None = None  # 4.4 MB, built when a BPE pre-tokenizer first needs it


def codepoints(text: str) -> np.ndarray:
    """The text's codepoints as uint32 (the text must be valid: no lone surrogates)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def collapse(text: str) -> str:
    """One character per codepoint: ASCII kept, others replaced by their class's stand-in."""
    global _COLLAPSE
    if text.isascii():
        return text
    if _COLLAPSE is None:
        _COLLAPSE = _collapse_table()
    return _COLLAPSE[codepoints(text)].tobytes().decode("utf-32-le")


def spaces_to_stand_in(text: str) -> str:
    """Non-ASCII whitespace replaced by the stand-in, everything else kept (llama.cpp's wide-regex path)."""
    if text.isascii():
        return text
    cps = codepoints(text).copy()
    wide_space = (cps > 0x7F) & ((flag_table()[cps] & IS_WHITESPACE) != 0)
    if not wide_space.any():
        return text
    cps[wide_space] = ord(REP_SPACE)
    return cps.tobytes().decode("utf-32-le")


def ascii_members(flag: int) -> str:
    """The ASCII characters whose category is ``flag`` (or, for IS_WHITESPACE, that are whitespace)."""
    flags = _ascii_flags()
    if flag == IS_WHITESPACE:
        return "".join(chr(c) for c in range(128) if flags[c] & IS_WHITESPACE)
    return "".join(chr(c) for c in range(128) if (flags[c] & CATEGORIES) == flag)


def flags_of(cp: int) -> int:
    return int(flag_table()[cp]) if cp < MAX_CODEPOINTS else UNDEFINED


_LOWER = dict(zip(LOWERCASE[0::2], LOWERCASE[1::2]))


def to_lower(cp: int) -> int:
    return _LOWER.get(cp, cp)


_NFD_FIRST = np.array(NFD_RANGES[0::3], dtype=np.int64)
_NFD_LAST = np.array(NFD_RANGES[1::3], dtype=np.int64)
_NFD_TO = np.array(NFD_RANGES[2::3], dtype=np.int64)


def nfd_base(cp: int) -> int:
    """llama.cpp's one-codepoint "NFD": the base codepoint of a precomposed one, else itself."""
    i = int(np.searchsorted(_NFD_FIRST, cp, side="right")) - 1
    return int(_NFD_TO[i]) if _NFD_FIRST[i] <= cp <= _NFD_LAST[i] else cp
