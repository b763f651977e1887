"""The peer suite: llama.cpp's own tokenizer tests (test-tokenizer-0 and test-tokenizer-1-spm) on
its vocabulary-only GGUF files, from the llama-cpp-python 0.3.36 sdist (see llamacpp_sdist.py).

Skipped, with the reason, only when the package index cannot be reached; a file that does not
parse or a wrong id fails. Known failures would be listed in XFAIL with their reasons (strict:
a listed vocabulary that starts passing fails too); today the list is empty.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from llamacpp_sdist import RegistryUnreachable, llama_cpp_dir, read_cases, vocab_names

from prism_core.tokenizer import Tokenizer, from_gguf, read_metadata

# every vocabulary of the sdist with test files (test_vocabulary_list_is_complete keeps this honest)
VOCABS = ["bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
          "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
XFAIL: dict[str, str] = {}  # vocabulary -> why its encode test is expected to fail


@cache
def _llama_cpp() -> Path | str:
    try:
        return llama_cpp_dir()
    except RegistryUnreachable as e:
        return str(e)


def llama_cpp() -> Path:
    d = _llama_cpp()
    if isinstance(d, str):
        pytest.skip(f"llama.cpp's test suite not available: {d}")
    return d


@cache
def tokenizer(name: str) -> Tokenizer:
    return from_gguf(llama_cpp() / "models" / f"ggml-vocab-{name}.gguf")


def cases(name: str) -> list[tuple[str, list[int]]]:
    return read_cases(llama_cpp() / "models" / f"ggml-vocab-{name}.gguf")


def _marks(name: str) -> list:
    return [pytest.mark.xfail(reason=XFAIL[name], strict=True)] if name in XFAIL else []


def test_vocabulary_list_is_complete():
    assert vocab_names(llama_cpp() / "models") == VOCABS


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in VOCABS])
def test_encode_matches_llama_cpp(name, record_property):
    """test-tokenizer-0: every test string encodes (add_special=False, parse_special=False) to
    llama.cpp's ids."""
    tok = tokenizer(name)
    results = [(s, want, tok.encode(s, add_special=False, parse_special=False)) for s, want in cases(name)]
    wrong = [(s, want, got) for s, want, got in results if got != want]
    record_property("passed", f"{len(results) - len(wrong)}/{len(results)}")
    assert not wrong, (f"{name}: {len(results) - len(wrong)}/{len(results)} strings match; first wrong: "
                       + "; ".join(f"{s!r}: want {w} got {g}" for s, w, g in wrong[:3]))


def _cleaned(s: str) -> str:
    """What llama.cpp's detokenizer makes of s in a vocabulary that cleans spaces, written as regexes
    (independently of the byte loop in tokenizer._clean_spaces): no space before ? ! . , ; " ' "
    loses both spaces; the space before 's 'm 're 've goes."""
    s = re.sub(r" ([?!.,])", r"\1", s)
    s = re.sub(r" ' ", "'", s)
    return re.sub(r" '(s|m|re|ve)", r"'\1", s)


@pytest.mark.parametrize("name", [n for n in VOCABS if n != "bert-bge"])
def test_decode_round_trip(name):
    """decode(encode(s)) gives s back, or in vocabularies that clean spaces (llama.cpp's
    clean_spaces) s with those spaces removed. BERT is left out: its normaliser lowercases, strips
    accents and drops whitespace, so llama.cpp does not give the text back either."""
    tok = tokenizer(name)
    for s, want in cases(name):
        expect = _cleaned(s) if tok.vocab.clean_spaces else s
        assert tok.decode(tok.encode(s, add_special=False)) == expect, s
        assert tok.decode(want) == expect, s  # llama.cpp's own ids decode the same way


def test_spm_round_trip_every_token_and_codepoint():
    """test-tokenizer-1-spm on llama-spm: each token's text, and each codepoint (llama.cpp's range,
    U+2581 excepted), encodes with parse_special and decodes back to itself. Byte tokens whose
    byte is no UTF-8 on its own are left out: encode takes text, and refuses invalid UTF-8."""
    tok = tokenizer("llama-spm")
    for i in range(tok.n_vocab):
        b = tok.decode_bytes([i])
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert tok.decode_bytes(tok.encode(s, add_special=False, parse_special=True)) == b, i
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or 0x40000 <= cp <= 0xE0000 or cp == 0x2581:
            continue
        s = chr(cp)
        assert tok.decode(tok.encode(s, add_special=False, parse_special=True)) == s, hex(cp)


def test_add_special_and_parse_special():
    """BOS/EOS as the vocabularies ask (llama-spm: BOS 1 only; bert: CLS ... SEP; gpt-2: none), and
    control tokens in the text only with parse_special."""
    spm = tokenizer("llama-spm")
    assert spm.encode("Hello") == [1, *spm.encode("Hello", add_special=False)]
    assert spm.encode("</s>", add_special=False, parse_special=True) == [2]
    assert 2 not in spm.encode("</s>", add_special=False)
    bert = tokenizer("bert-bge")
    assert bert.encode("hello") == [101, *bert.encode("hello", add_special=False), 102]
    gpt2 = tokenizer("gpt-2")
    assert gpt2.encode("Hello") == gpt2.encode("Hello", add_special=False)
    assert gpt2.encode("<|endoftext|>", add_special=False, parse_special=True) == [50256]
    assert 50256 not in gpt2.encode("<|endoftext|>", add_special=False)
    assert gpt2.decode([50256]) == "<|endoftext|>" and gpt2.decode([50256], special=False) == ""


def test_ugm_nomic_bert_moe():
    """The UGM (t5) vocabulary of the sdist, which has no test files: XLM-R's ids for "Hello world"
    (<s> 0, ▁Hello 35378, ▁world 8999, </s> 2), and its character map applies NFKC (ligature,
    fullwidth, roman numeral forms encode as their plain letters)."""
    tok = from_gguf(llama_cpp() / "models" / "ggml-vocab-nomic-bert-moe.gguf")
    assert tok.kind == "ugm"
    assert tok.encode("Hello world") == [0, 35378, 8999, 2]
    for fancy, plain in (("\ufb01ve", "five"), ("\uff21\uff22\uff23", "ABC"), ("\u216b", "XII")):
        assert tok.encode(fancy) == tok.encode(plain), fancy
    assert tok.encode("a <mask>", parse_special=True) == [0, 10, 250001, 2]  # <mask> strips the space before it


def test_metadata_reader_agrees_with_gguf_package():
    """The tokenizer's own metadata reader gives what the gguf package's GGUFReader gives."""
    import gguf

    path = llama_cpp() / "models" / "ggml-vocab-phi-3.gguf"
    ours = read_metadata(path)
    ref = gguf.GGUFReader(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert sorted(ours) == sorted(keys)
    for k in keys:
        want = ref.fields[k].contents()
        got = ours[k]
        assert (np.asarray(got).tolist() == want) if isinstance(want, list) else got == want, k


def _source_patterns(src: str, anchor: str) -> tuple[str, ...]:
    at = src.index("regex_exprs = {", src.index(anchor))
    body = "\n".join(line for line in src[at:src.index("};", at)].split("\n") if not line.strip().startswith("//"))
    return tuple(p.encode().decode("unicode_escape").encode("latin-1").decode("utf-8")
                 for p in re.findall(r'"((?:[^"\\]|\\.)*)"', body))


# PRE_STEPS name -> the llama.cpp switch label its patterns follow
_PRE_CASES = {"default": "default:\n                // default regex", "llama3": "LLAMA3",
              "deepseek-llm": "DEEPSEEK_LLM",
              "deepseek-coder": "DEEPSEEK_CODER", "falcon": "FALCON", "starcoder": "STARCODER", "gpt2": "GPT2",
              "qwen2": "QWEN2", "qwen35": "QWEN35", "gemma4": "GEMMA4", "poro": "PORO", "viking": "VIKING",
              "ufakzeka": "UFAKZEKA", "seed-coder": "SEED_CODER", "laguna": "LAGUNA", "minicpm5": "MINICPM5",
              "bailingmoe": "BAILINGMOE", "jais-2": "JAIS2", "gpt-4o": "GPT4O", "tekken": "TEKKEN",
              "sarvam-moe": "SARVAM_MOE"}


def test_pre_tokenizer_patterns_are_llama_cpps():
    """Every step list is character for character llama.cpp's patterns (hand-written splitters
    standing for the pattern text llama.cpp selects them by)."""
    from prism_core.tokenizer.pretokenize import CUSTOM_SOURCE, PRE_STEPS

    src = (llama_cpp() / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    assert sorted(_PRE_CASES) == sorted(PRE_STEPS)
    for ours, case in _PRE_CASES.items():
        anchor = case if case.startswith("default") else f"case LLAMA_VOCAB_PRE_TYPE_{case}:"
        steps = tuple(CUSTOM_SOURCE.get(s, s) for s in PRE_STEPS[ours])
        assert steps == _source_patterns(src, anchor), ours


def test_pre_tokenizer_names_are_llama_cpps():
    """Each tokenizer.ggml.pre value gets the patterns and options llama.cpp's loader gives it."""
    from prism_core.tokenizer.pretokenize import CUSTOM_SOURCE, NOT_PORTED, PRE_STEPS, PRE_TYPES

    src = (llama_cpp() / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    start = src.index('} else if (tokenizer_pre == "default")')
    chain = src[start:src.index("unknown pre-tokenizer type", start)]
    flags = {"clean_spaces": "clean_spaces = false", "ignore_merges": "ignore_merges = true",
             "add_bos": "add_bos = true", "add_sep": "add_sep = true",
             "escape_whitespaces": "escape_whitespaces = true"}
    seen = set()
    assert set(re.findall(r'tokenizer_pre == "([^"]+)"', chain)) == set(PRE_TYPES) | NOT_PORTED
    for branch in chain.split("} else if (")[1:]:
        names = re.findall(r'tokenizer_pre == "([^"]+)"', branch)
        label = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", branch).group(1)
        for name in names:
            if name not in PRE_TYPES:
                continue
            seen.add(name)
            steps, opts = PRE_TYPES[name]
            anchor = _PRE_CASES["default"] if label == "DEFAULT" else f"case LLAMA_VOCAB_PRE_TYPE_{label}:"
            assert tuple(CUSTOM_SOURCE.get(x, x) for x in PRE_STEPS[steps]) == _source_patterns(src, anchor), name
            for flag, text in flags.items():
                assert (flag in opts) == (text in branch), (name, flag)
    assert seen == set(PRE_TYPES)  # no name of ours that llama.cpp does not know


def test_unicode_tables_are_llama_cpps(tmp_path, monkeypatch):
    """prism_core/tokenizer/unicode_data.py is what tools/gen_unicode_data.py makes of the sdist's tables."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gen_unicode_data", root / "tools" / "gen_unicode_data.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "OUT", tmp_path / "unicode_data.py")
    gen.main(str(llama_cpp() / "src" / "unicode-data.cpp"))
    ours = (root / "prism_core" / "tokenizer" / "unicode_data.py").read_text()
    assert (tmp_path / "unicode_data.py").read_text() == ours
