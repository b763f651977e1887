"""The house as the code's own imports draw it: folders are rooms, arrows go one way.

The rules (docs/architecture.md draws them): the core never imports a backend; below ``models`` nothing
imports ``models``; the op package and the execution layer know nothing of files, tokenizers, models,
training, conformance or commands; only ``cli`` (and what sits above models) imports ``cli``, except its
argument types (``cli.args``, a leaf). Old module names keep importing, deprecated.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "prism_core"
BACKENDS = ("prism_numpy", "prism_numba", "prism_csimd", "prism_ggml")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (at top level or inside functions)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import build` names a module
    return found


GRAPH = {module_name(p): imports_of(p) for p in CORE.rglob("*.py")}


def room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def offenders(frm, to) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if frm(m) for t in ts if to(t))


def test_the_core_never_imports_a_backend():
    assert offenders(lambda m: True, lambda t: t.split(".")[0] in BACKENDS) == []


def test_nothing_below_models_imports_models():
    above = {"models", "cli", "serve", "finetune"}
    assert offenders(lambda m: room(m) not in above, lambda t: t.startswith("prism_core.models")) == []


def test_ops_and_execution_know_nothing_of_files_models_or_commands():
    low = {"ops", "tensor", "context", "graph", "autodiff", "plan", "schedule", "types", "errors", "quant"}
    high = ("prism_core.gguf", "prism_core.tokenizer", "prism_core.models", "prism_core.train",
            "prism_core.conformance", "prism_core.cli", "prism_core.serve")
    # the op pages (ops.spec) state each op's conformance bound, so they read the suite's error metrics
    pages = {"prism_core.ops.spec -> prism_core.conformance.accuracy"}
    bad = offenders(lambda m: room(m) in low, lambda t: t.startswith(high))
    assert [b for b in bad if not b.startswith(tuple(pages))] == []


def test_only_commands_import_commands():
    allowed = {"cli", "serve"}
    bad = offenders(lambda m: room(m) not in allowed and m != "prism_core",
                    lambda t: t.startswith("prism_core.cli") and not t.startswith("prism_core.cli.args"))
    assert bad == []
    assert {t for t in GRAPH["prism_core.cli.args"] if t.startswith("prism_core")} == set()  # a leaf


def test_the_root_holds_few_modules():
    assert len(list(CORE.glob("*.py"))) <= 16, sorted(p.name for p in CORE.glob("*.py"))


@pytest.mark.parametrize("old,new", [("prism_core.optable", "prism_core.ops.table"),
                                     ("prism_core.gguf_reader", "prism_core.gguf.reader"),
                                     ("prism_core.registry", "prism_core.plugin.registry"),
                                     ("prism_core.tokenizer.cli", "prism_core.cli.tokenize")])
def test_an_old_module_name_still_imports_with_a_deprecation_warning(old, new):
    code = (f"import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            f"import prism_core\ntry:\n    import {old}\nexcept DeprecationWarning as e:\n    print(e)\n"
            f"warnings.simplefilter('ignore')\nimport {old} as a, {new} as b\nprint(a is b)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"{old} moved to {new}" in out and out.strip().endswith("True"), out


def test_importing_the_old_backend_module_does_not_hide_the_backend_function():
    import prism_core as pc
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        importlib.import_module("prism_core.backend")
        from prism_core.backend import KernelTable  # the old spelling, deprecated
    assert KernelTable is pc.plugin.base.KernelTable
    assert any(issubclass(w.category, DeprecationWarning) and "prism_core.plugin.base" in str(w.message)
               for w in seen)
    assert pc.backend("numpy").name == "numpy"  # still the function
    assert not hasattr(pc.backend, "no_such_name")
