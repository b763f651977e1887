"""The tokenizer: text <-> token ids with llama.cpp's behaviour (``llama_tokenize`` / ``llama_detokenize``)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .bpe import CHAR_TO_BYTE, BpeModel
from .specials import SpecialMatcher
from .spm import SPACE, SpmModel
from .ugm import UgmModel
from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
)
from .vocab import from_metadata as vocab_from_metadata
from .wpm import WpmModel

_MODELS = {"spm": SpmModel, "bpe": BpeModel, "wpm": WpmModel, "ugm": lambda v: UgmModel(v, v.charsmap)}


def _as_text(text: str | bytes) -> str:
    if isinstance(text, bytes | bytearray | memoryview):
        try:
            return bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"text is not valid UTF-8: byte 0x{e.object[e.start]:02X} at offset {e.start} "
                                  f"({e.reason})") from None
    if not isinstance(text, str):
        raise InvalidArgument(f"text must be str or UTF-8 bytes, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"text holds a lone surrogate U+{ord(text[e.start]):04X} at index {e.start}: "
                              "not encodable as UTF-8") from None
    return text


class Tokenizer:
    """A vocabulary's tokenizer. ``encode`` and ``decode`` follow llama.cpp's llama_tokenize and
    llama_detokenize; ``piece`` is llama_token_to_piece."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._model = _MODELS[vocab.kind](vocab)
        self._specials = SpecialMatcher(vocab)
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        if not isinstance(meta, Mapping):
            raise InvalidArgument(f"from_metadata: meta must be a mapping of GGUF metadata keys (a loaded file's "
                                  f".meta), got {type(meta).__name__}")
        return cls(vocab_from_metadata(meta))

    # -- facts ------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.size

    @property
    def kind(self) -> str:
        """spm, bpe, wpm or ugm."""
        return self.vocab.kind

    @property
    def bos(self) -> int | None:
        return self.vocab.bos

    @property
    def eos(self) -> int | None:
        return self.vocab.eos

    def is_eog(self, token: int) -> bool:
        """Whether generation ends at this token (llama.cpp's end-of-generation set)."""
        return token in self.vocab.eog

    def token_text(self, token: int) -> str:
        """The token's text as stored in the vocabulary (``▁`` and GPT-2 byte characters as they are)."""
        return self.vocab.tokens[self._check_id(token)]

    # -- encode -----------------------------------------------------------------------------
    def encode(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``. add_special: the BOS/EOS (and for BERT the SEP) the vocabulary asks for;
        parse_special: control tokens written in the text are recognised (user-defined ones always are)."""
        text = _as_text(text)
        v = self.vocab
        out: list[int] = []
        parts = self._specials.partition(text, parse_special)
        if add_special and (v.add_bos or v.kind == "wpm"):
            out.append(self._required(v.bos, "bos_token_id"))
        prev_special = True
        for part in parts:
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if v.kind == "spm":
                if v.add_space_prefix and prev_special:
                    part = " " + part
                part = part.replace(" ", SPACE)
                prev_special = False
            elif v.kind == "bpe" and v.escape_whitespaces:
                part = part.replace(" ", SPACE)
            self._model.encode(part, out)
        if add_special:
            if v.kind == "wpm":
                out.append(self._required(v.sep, "seperator_token_id"))
            elif v.add_eos:
                out.append(self._required(v.eos, "eos_token_id"))
        return out

    def _required(self, token: int | None, key: str) -> int:
        if token is None:
            raise InvalidArgument(f"the vocabulary asks for a special token but tokenizer.ggml.{key} is not set")
        return token

    # -- decode -----------------------------------------------------------------------------
    def _check_id(self, token: int) -> int:
        """The id as an int (numpy integers accepted), or InvalidArgument when it names no token."""
        try:
            t = operator.index(token)
        except TypeError:
            t = None
        if t is None or isinstance(token, bool | np.bool_) or not 0 <= t < self.vocab.size:
            raise InvalidArgument(f"token id {token!r} is not in the vocabulary (0 <= id < {self.vocab.size})")
        return t

    def piece_bytes(self, token: int, special: bool = True) -> bytes:
        """The bytes a token stands for (llama_token_to_piece); control and unknown tokens give
        their text only when ``special``."""
        token = self._check_id(token)
        attr = self.vocab.attrs[token]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = self._piece(token, attr)
        return p

    def _piece(self, token: int, attr: int) -> bytes:
        v = self.vocab
        text = v.tokens[token]
        raw = text.encode("utf-8", errors="surrogateescape")
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return raw
        if attr & ATTR_NORMAL:
            if v.kind != "bpe" or v.escape_whitespaces:
                return raw.replace(SPACE.encode(), b" ")
            out = bytearray()
            for ch in text:
                b = CHAR_TO_BYTE.get(ch)
                if b is not None:
                    out.append(b)
                else:  # llama.cpp's marker for a character outside GPT-2's byte map
                    out += b"[UNK_BYTE_0x" + ch.encode("utf-8", errors="surrogateescape").hex().encode() + raw + b"]"
            return bytes(out)
        if attr & ATTR_BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise InvalidArgument(f"byte token {token} has text {text!r}, not <0xNN> "
                                      "(tokenizer.ggml.tokens / token_type)") from None
        return b""

    def piece(self, token: int, special: bool = True) -> str:
        """The token's piece as text (bytes that are not whole UTF-8 characters shown as U+FFFD)."""
        return self.piece_bytes(token, special).decode("utf-8", errors="replace")

    def pieces(self, ids: Iterable[int], special: bool = True) -> list[str]:
        return [self.piece(i, special) for i in ids]

    def decode_bytes(self, ids: Iterable[int], special: bool = True, remove_special: bool = False) -> bytes:
        """llama_detokenize: the pieces joined, the first one's space prefix removed where the vocabulary
        adds one, and (for vocabularies that ask for it) llama.cpp's clean-up of spaces before punctuation."""
        if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Iterable):
            raise InvalidArgument(f"decode: ids must be an iterable of token ids, got {ids!r:.60} "
                                  f"({type(ids).__name__}); one token's text is piece(id)")
        ids = [self._check_id(t) for t in ids]
        v = self.vocab
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and ids and ids[0] == v.bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and v.add_eos and ids and ids[-1] == v.eos:
            ids = ids[:-1]
        parts = []
        for t in ids:
            p = self.piece_bytes(t, special)
            if remove_space and p.startswith(b" "):
                p = p[1:]
            remove_space = False
            parts.append(p)
        text = b"".join(parts)
        return _clean_spaces(text) if v.clean_spaces else text

    def decode(self, ids: Iterable[int], special: bool = True, remove_special: bool = False) -> str:
        """The text of ``ids`` (see decode_bytes); bytes that do not form UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, special, remove_special).decode("utf-8", errors="replace")


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three passes: drop the space in " ?", " !", " .", " ,"; in " ' " drop both spaces;
    drop the space in " 's", " 'm", " 're", " 've" (not " 't", " 'd", " 'll")."""
    if not text:
        return text
    buf = bytearray(text)
    out = bytearray(buf[:1])
    for i in range(1, len(buf)):
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    buf, out = out, bytearray(out[:1])
    n = len(buf)
    i = 1
    while i < n:
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            out.pop()
            i += 1
            buf[i] = 0  # llama.cpp overwrites the skipped space in place, and a later look-back sees it
        out.append(x)
        i += 1
    buf, out = out, bytearray(out[:1])
    n = len(buf)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                out.pop()
            elif x1 not in b"td" and i + 2 < n:
                x2 = buf[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):
                    out.pop()
        out.append(x)
    return bytes(out)
