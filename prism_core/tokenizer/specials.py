"""Special tokens written in the text: split the text into raw pieces and token ids, as llama.cpp's
``tokenizer_st_partition`` does (longest special text first, every occurrence, left to right;
user-defined tokens always, control and unknown ones only with parse_special)."""

from __future__ import annotations

import re

from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab, special_ids

_C_SPACE = " \t\n\x0b\x0c\r"  # C isspace, which llama.cpp strips with
_HEAD = 8  # characters of each occurrence of a rare first character kept by _Probe
_RARE = 4096


class _Probe:
    """A quick, exact-when-negative test of whether a special token may occur in a text: for each
    first character that occurs rarely, the few characters after every occurrence. Vocabularies
    with thousands of control tokens (``<unused123>``...) then cost a set lookup each, not a scan."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.heads: dict[str, set[str] | bool] = {}

    def may_contain(self, piece: str) -> bool:
        c = piece[0]
        heads = self.heads.get(c)
        if heads is None:
            n = self.text.count(c)
            if n == 0 or n > _RARE:
                heads = n > 0
            else:
                t = self.text
                heads = {t[m.start():m.start() + _HEAD] for m in re.finditer(re.escape(c), t)}
            self.heads[c] = heads
        if isinstance(heads, bool):
            return heads
        head = piece[:_HEAD]
        return head in heads if len(head) == _HEAD else any(h.startswith(head) for h in heads)


class SpecialMatcher:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.ids = special_ids(vocab)
        self._always = [i for i in self.ids if not vocab.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """The text as a list of raw strings and special token ids."""
        candidates = self.ids if parse_special else self._always
        if not candidates or not text:
            return [text] if text else []
        probe = _Probe(text)
        tokens, attrs = self.vocab.tokens, self.vocab.attrs
        parts: list[str | int] = [text]
        for tid in candidates:
            piece = tokens[tid]
            if not probe.may_contain(piece) or piece not in text:
                continue
            lstrip, rstrip = attrs[tid] & ATTR_LSTRIP, attrs[tid] & ATTR_RSTRIP
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    out.append(part)
                    continue
                pos = 0
                while True:
                    at = part.find(piece, pos)
                    if at < 0:
                        break
                    left = part[pos:at]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = at + len(piece)
                    if rstrip:
                        while pos < len(part) and part[pos] in _C_SPACE:
                            pos += 1
                if pos < len(part):
                    out.append(part[pos:])
            parts = out
        return parts
