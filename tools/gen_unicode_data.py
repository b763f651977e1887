"""Regenerate ``prism_core/tokenizer/unicode_data.py`` from llama.cpp's ``src/unicode-data.cpp``.

``python tools/gen_unicode_data.py PATH/TO/unicode-data.cpp``. The tables are data, carried over
as they are so that the pre-tokenizers classify every codepoint exactly as llama.cpp does
(Python's ``unicodedata`` follows another Unicode version and differs on a few hundred codepoints).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "prism_core" / "tokenizer" / "unicode_data.py"


def table(src: str, name: str) -> str:
    m = re.search(name + r"\s*=\s*\{(.*?)\n\};", src, re.S)
    if m is None:
        raise SystemExit(f"{name} not found")
    return m.group(1)


def ints(body: str) -> list[int]:
    return [int(x, 16) for x in re.findall(r"0x[0-9A-Fa-f]+", body)]


def wrap(values: list[int], per_line: int = 12) -> str:
    lines = [", ".join(f"0x{v:X}" for v in values[i:i + per_line]) for i in range(0, len(values), per_line)]
    return "(\n    " + ",\n    ".join(lines) + ",\n)"


def main(path: str) -> None:
    src = Path(path).read_text()
    flags = ints(table(src, "unicode_ranges_flags"))
    ws = ints(table(src, "unicode_set_whitespace"))
    lower = ints(table(src, "unicode_map_lowercase"))
    nfd = ints(table(src, "unicode_ranges_nfd"))
    OUT.write_text(
        '"""Unicode tables of llama.cpp (src/unicode-data.cpp of llama-cpp-python 0.3.36\'s vendored llama.cpp),\n'
        "carried over as data by tools/gen_unicode_data.py; do not edit by hand.\n\n"
        "FLAG_RANGES: (first codepoint, category flags) pairs, each range running to the next first;\n"
        "WHITESPACE: codepoints llama.cpp treats as \\\\s; LOWERCASE: (codepoint, lowercase) pairs;\n"
        'NFD_RANGES: (first, last, replacement) triples of llama.cpp\'s one-codepoint "NFD".\n"""\n\n'
        "# ruff: noqa: E501\n"
        f"FLAG_RANGES = {wrap(flags)}\n\n"
        f"WHITESPACE = {wrap(ws)}\n\n"
        f"LOWERCASE = {wrap(lower)}\n\n"
        f"NFD_RANGES = {wrap(nfd)}\n")
    print(f"wrote {OUT}: {len(flags) // 2} flag ranges, {len(ws)} whitespace, {len(lower) // 2} lowercase, "
          f"{len(nfd) // 3} nfd ranges")


if __name__ == "__main__":
    main(sys.argv[1])
