"""Every code block of README.md and docs/*.md runs, so the docs cannot rot.

- ```python blocks run in order in one namespace per page (a fresh interpreter per page, in a temporary
  working directory), so a page can build on its earlier blocks;
- in ```bash / ```console / ```sh blocks, every command runs from the repository root with this venv's
  programs (``.venv/bin/X`` and a bare ``prism`` are this interpreter's) and must exit 0; the set-up parts
  (``python3 -m venv``, ``pip install``, ``git clone``) and the test command are what .ci/run itself runs,
  so they are not repeated here;
- blocks fenced ```text (or any other language) are shown, not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL = {"bash", "console", "sh", "shell"}
BIN = Path(sys.executable).parent


def blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


SETUP = re.compile(r"^(python3? -m venv|(\S*/)?pip3? install|git clone|cd )")


def commands_of(code: str) -> list[str]:
    """The commands of a shell block that a test runs: each line's parts (split at ``&&``) except the
    set-up (venv, pip install: what .ci/run does) and the test command itself; ``.venv/bin/X`` is this
    interpreter's X."""
    found = []
    for raw in code.splitlines():
        line = raw.split("  #")[0].strip().removeprefix("$ ")
        for part in re.split(r"\s*&&\s*", line):
            if not part or part.startswith("#") or SETUP.match(part):
                continue
            words = shlex.split(part)
            words = [str(BIN / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w for w in words]
            if Path(words[0]).name == "pytest":
                continue  # the README's test command: what is running now
            found.append(shlex.join(words))
    return found


def _pages_with(kind: set[str]) -> list[Path]:
    return [p for p in PAGES if any(lang in kind for lang, _, _ in blocks(p))]


def test_the_pages_exist_and_have_blocks():
    assert (ROOT / "README.md").is_file()
    assert sum(len(blocks(p)) for p in PAGES) > 0


def test_every_block_says_whether_it_runs():
    """A fence without a language would be shown and never run by mistake: each names one (```text for a
    synopsis or an example that needs files the reader brings)."""
    bare = [f"{p.relative_to(ROOT)}:{line}" for p in PAGES for lang, _, line in blocks(p) if not lang]
    assert not bare, f"code blocks without a language: {bare}"


@pytest.mark.parametrize("page", _pages_with({"python"}), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, tmp_path: Path):
    parts = [f"# line {line}\n{code}" for lang, code, line in blocks(page) if lang == "python"]
    script = tmp_path / "page.py"
    script.write_text("\n".join(parts), encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{page.name}'s python blocks failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def _commands() -> list[tuple[Path, int, str]]:
    return [(p, line, cmd) for p in PAGES for lang, code, line in blocks(p) if lang in SHELL
            for cmd in commands_of(code)]


@pytest.mark.parametrize("page,line,cmd", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_shell_commands_run(page: Path, line: int, cmd: str):
    """From the repository root (the README's paths are relative to it), with this venv's programs first
    on PATH. Nothing else is set: as root too, a command runs as printed (the README's mpiexec carries
    --allow-run-as-root itself)."""
    words = shlex.split(cmd)
    if words[0] == "prism":
        words[0] = str(BIN / "prism")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    r = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    out = f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert r.returncode == 0, f"{page.name}:{line}: `{cmd}` exited {r.returncode}:\n{out}"


def test_the_op_reference_pages_are_the_op_tables(tmp_path: Path):
    """docs/ops/ is `prism ops --markdown docs/ops` of this op table: regenerate it when an op changes."""
    r = subprocess.run([str(BIN / "prism"), "ops", "--markdown", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.md")}
    have = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "ops").glob("*.md")}
    stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    assert not stale, f"docs/ops is out of date ({', '.join(stale[:8])}): run `prism ops --markdown docs/ops`"
