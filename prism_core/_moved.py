"""Modules that moved when the core was grouped by purpose: the old dotted names keep importing.

``import prism_core.optable`` (and every other old name below) loads the new module under the old
name too, with a :class:`DeprecationWarning` naming the new one. Nothing is imported until asked.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {  # old module -> new module
    "prism_core.params": "prism_core.ops.params",
    "prism_core.optable": "prism_core.ops.table",
    "prism_core.optable_attn": "prism_core.ops.table_attn",
    "prism_core.optable_conv": "prism_core.ops.table_conv",
    "prism_core.build": "prism_core.ops.build",
    "prism_core.build_attn": "prism_core.ops.build_attn",
    "prism_core.build_conv": "prism_core.ops.build_conv",
    "prism_core.opspec": "prism_core.ops.spec",
    "prism_core.semantics": "prism_core.ops.semantics",
    "prism_core.gelu_tables": "prism_core.ops.gelu_tables",
    "prism_core.gguf_format": "prism_core.gguf.format",
    "prism_core.gguf_reader": "prism_core.gguf.reader",
    "prism_core.gguf_writer": "prism_core.gguf.writer",
    "prism_core.cli_gguf": "prism_core.cli.gguf",
    "prism_core.cli_run": "prism_core.cli.run",
    "prism_core.tokenizer.cli": "prism_core.cli.tokenize",
    "prism_core.demo": "prism_core.cli.demo",
    "prism_core.hookspecs": "prism_core.plugin.hookspecs",
    "prism_core.registry": "prism_core.plugin.registry",
}


def warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old name will be removed in prism-tensor 0.2",
                  DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        warn_moved(spec.name, MOVED[spec.name])
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):  # the new module is already executed
        pass


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
