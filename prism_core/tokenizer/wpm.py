"""WordPiece (``tokenizer.ggml.model = bert``), as llama.cpp's WPM session: normalise (llama.cpp's
one-codepoint NFD and accent stripping, lowercasing), split on whitespace and around
punctuation, ASCII symbols and CJK ideographs, then cover each ``▁``-prefixed word greedily with
the longest vocabulary tokens; a word that cannot be covered becomes the unknown token."""

from __future__ import annotations

from ..errors import InvalidArgument
from . import unicode as uc
from .spm import SPACE
from .vocab import Vocab

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # as llama.cpp (and HF), 0x2B920 included


def _is_cjk(cp: int) -> bool:
    return any(a <= cp <= b for a, b in _CJK)


class WpmModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.max_len = vocab.max_token_len
        self._cache: dict[str, list[int]] = {}

    def words(self, text: str) -> list[str]:
        v = self.vocab
        words: list[str] = []
        word: list[str] = []  # the word being read, joined once at its end: += on a list's str copies it
        for ch in text:
            cp = ord(ch)
            if v.strip_accents:
                cp = uc.nfd_base(cp)
            f = uc.flags_of(cp)
            if f & uc.IS_WHITESPACE:
                if word:
                    words.append("".join(word))
                    word.clear()
                continue
            if cp == 0 or cp == 0xFFFD or f & uc.CONTROL:
                continue
            if v.strip_accents and f & uc.ACCENT_MARK:
                continue
            s = chr(uc.to_lower(cp) if v.lowercase else cp)
            if f & uc.PUNCTUATION or (cp < 0x7F and f & uc.SYMBOL) or _is_cjk(cp):
                if word:
                    words.append("".join(word))
                    word.clear()
                words.append(s)
            else:
                word.append(s)
        if word:
            words.append("".join(word))
        return words

    def encode(self, text: str, out: list[int]) -> None:
        for word in self.words(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(self._cache) < 1 << 18:
                    self._cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> list[int]:
        ids = self.vocab.token_to_id
        w = SPACE + word
        n = len(w)
        out: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + self.max_len + 1), i, -1):
                tid = ids.get(w[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:
                out = []
                break
        if not out:
            if self.vocab.unk is None:
                raise InvalidArgument(f"word {word!r} is not covered by the vocabulary and "
                                      "tokenizer.ggml.unknown_token_id is not set")
            out = [self.vocab.unk]
        return out
