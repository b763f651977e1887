"""Special tokens written in the text: split the text into raw pieces and token ids, as llama.cpp's
``tokenizer_st_partition`` does (longest special text first, every occurrence, left to right;
user-defined tokens always, control and unknown ones only with parse_special)."""

from __future__ import annotations

from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab, special_ids

_C_SPACE = " \t\n\x0b\x0c\r"  # C isspace, which llama.cpp strips with


class SpecialMatcher:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.ids = special_ids(vocab)
        self._always = [i for i in self.ids if not vocab.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]
        # a cheap pre-filter: a special token can occur only if its first character does
        self._first_chars = {vocab.tokens[i][0] for i in self.ids}

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """The text as a list of raw strings and special token ids."""
        candidates = self.ids if parse_special else self._always
        if not candidates or not text:
            return [text] if text else []
        present = {c for c in self._first_chars if c in text}
        if not present:
            return [text]
        tokens, attrs = self.vocab.tokens, self.vocab.attrs
        parts: list[str | int] = [text]
        for tid in candidates:
            piece = tokens[tid]
            if piece[0] not in present or piece not in text:
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
