"""The op specification (prism_core.ops.spec): every op of the table has a full page, and every
page's worked example, whose numbers were worked out by hand from the page's formula, is what
the reference backend computes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import prism_core as pc
from prism_core.cli import main
from prism_core.ops.spec import all_pages, build_example, page, to_markdown
from prism_core.ops.table import OPS


@pytest.mark.parametrize("key", list(OPS))
def test_every_op_has_a_full_page(key):
    p = page(key)
    assert p["summary"], f"{key}: no summary"
    for field in ("shape", "special_values"):
        assert len(p[field]) > 10, f"{key}: {field} is missing"
    assert p["formula"] or OPS[key].view_only, f"{key}: no formula"
    assert p["example"]["expected"], f"{key}: no worked example"
    assert set(p["derivative"]) == {s.name for s in OPS[key].srcs}
    for s in p["sources"]:
        assert s["types"], f"{key}: source {s['name']} accepts no type"
    text = to_markdown(p)
    for heading in ("## Sources", "## Params", "## Result and shape rule", "## Formula",
                    "## NaN, infinities, signed zeros", "## Derivative", "## Conformance", "## Worked example"):
        assert heading in text


@pytest.mark.parametrize("key", list(OPS))
def test_worked_example_matches_the_reference(key):
    e = OPS[key].spec.example
    out = build_example(key)
    pc.compute(out, "numpy", strict=True)
    got = out.numpy().reshape(-1).astype(np.float64)
    want = np.asarray(e.expected, np.float64)
    assert got.shape == want.shape, f"{key}: result has {got.size} elements, the page says {want.size}"
    np.testing.assert_allclose(got, want, rtol=e.rtol, atol=1e-7, err_msg=f"{key}'s worked example")


def test_ops_without_a_rule_say_so_not_piecewise_constant(capsys):
    for key in ("PAD", "L2_NORM", "GROUP_NORM", "OUT_PROD", "DIAG"):
        assert all(v.startswith("none: no derivative rule yet") for v in page(key)["derivative"].values()), key
    assert page("FLOOR")["derivative"]["a"].startswith("zero almost everywhere")
    assert page("GET_ROWS")["derivative"]["b"].startswith("none needed")
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "piecewise constant: the gradient is zero" not in out
    pad = out[out.index("\nPAD "):]
    assert "no derivative rule yet" in pad.split("\n")[4]


def test_quantized_types_are_on_the_pages():
    srcs = {s["name"]: s["types"] for s in page("MUL_MAT")["sources"]}
    assert "q4_0" in srcs["a"] and "q6_K" in srcs["a"] and "q8_1" not in srcs["a"]
    assert "q4_0" not in srcs["b"]
    cpy = {s["name"]: s["types"] for s in page("CPY")["sources"]}
    assert "q8_1" in cpy["a"]


def test_cli_page_markdown_and_json(tmp_path, capsys):
    assert main(["ops", "soft_max"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# SOFT_MAX") and "m0 = 2^(-max_bias / L)" in out and "sinks" in out
    assert main(["ops", "--markdown", str(tmp_path)]) == 0
    capsys.readouterr()
    files = sorted(f.name for f in tmp_path.iterdir())
    assert len(files) == len(OPS) + 1 and "index.md" in files and "ROPE.md" in files
    assert "[FLASH_ATTN_EXT](FLASH_ATTN_EXT.md)" in (tmp_path / "index.md").read_text()
    assert main(["ops", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["key"] for p in data["ops"]] == list(OPS) and data["ops"] == json.loads(json.dumps(all_pages()))
    assert main(["ops", "NO_SUCH_OP"]) == 2


def test_every_page_has_a_node_src_line_from_the_op_table():
    # hand-written from ggml's ggml_soft_max_ext / ggml_soft_max_add_sinks and ggml_set_rows(ctx, a, b, c) argument
    # order as Prism's table declares them (values, indices, destination)
    assert page("SOFT_MAX")["node_src"] == "(a, mask|None, sinks|None)"
    assert page("SET_ROWS")["node_src"] == "(b, c, a)"
    assert page("ARANGE")["node_src"] == "()"
    for key in pc.OPS:
        md = to_markdown(page(key))
        assert "| `node.src` |" in md, key
