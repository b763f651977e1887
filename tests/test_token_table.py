"""The tokenizer's compact vocabulary (prism_core.tokenizer.token_table) against plain Python
lists and dicts built here, and a GGUF vocabulary read without decoding a list of str."""

from __future__ import annotations

import re
import struct
from array import array

import pytest

from prism_core.tokenizer.token_table import TokenTable

TEXTS = ["<pad>", "a", "▁the", "", "日本", "x▁y", "▁▁▁", "a", "\udcff▁", "nul\0▁", "é▁z", "🙂"]


def gguf_string_array(texts):
    raw = [t.encode("utf-8", errors="surrogateescape") for t in texts]
    return b"".join(struct.pack("<Q", len(b)) + b for b in raw), array("q", [len(b) for b in raw])


@pytest.mark.parametrize("source", ["strings", "gguf"])
def test_texts_ids_and_index_agree_with_a_list_and_a_dict(source):
    if source == "strings":
        table = TokenTable.from_strings(TEXTS)
    else:
        buf, lengths = gguf_string_array(TEXTS)
        table = TokenTable.from_gguf_strings(memoryview(b"junk" + buf), 4, lengths)
    assert len(table) == len(TEXTS) and list(table) == TEXTS and table[-1] == TEXTS[-1]
    assert [table[i] for i in range(len(TEXTS))] == TEXTS and table[2:4] == TEXTS[2:4]
    last = {t: i for i, t in enumerate(TEXTS)}  # a repeated text maps to its last id
    for t, i in last.items():
        assert table.index[t] == i and table.index.get(t) == i and t in table.index
    assert table.ids_of("a") == [1, 7]
    assert table.index.get("nope") is None and "nope" not in table.index and 3 not in table.index
    with pytest.raises(KeyError):
        table.index["nope"]
    with pytest.raises(IndexError):
        table[len(TEXTS)]
    assert table.empty_ids() == [3]
    assert table.max_nbytes == max(len(t.encode("utf-8", errors="surrogateescape")) for t in TEXTS)
    assert sorted(table.index) == sorted(last) and len(table.index) == len(last)


def test_chars_before_a_mark_match_the_regex_over_the_joined_texts():
    want = set(re.findall("([^\0])(?=▁)", "\0".join(TEXTS)))
    assert TokenTable.from_strings(TEXTS).chars_before("▁") == want == {"x", "▁", "\udcff", "é"}


def test_a_gguf_vocabulary_is_not_decoded_into_a_list(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    import prism_core.gguf as pg
    from prism_core.tokenizer import from_metadata
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "▁a", "a", "▁b"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -1.5])
    w.add_token_types([2, 3, 3, 1, 1, 1])
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = pg.load(path)
    tok = from_metadata(f.meta)
    assert tok.encode("a b", add_special=False) == [3, 5]
    assert f.meta.undecoded_strings("tokenizer.ggml.tokens") is not None  # no list[str] was made
    assert f.meta["tokenizer.ggml.tokens"][3] == "▁a"  # still readable on request
