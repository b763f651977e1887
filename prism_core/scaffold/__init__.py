"""``prism new-backend NAME``: a ready backend plugin package, written from the templates
shipped beside this module (``template/``, package data of the wheel).

The package holds a pyproject with the ``prism.backends`` entry point, a Backend subclass
with two example kernels in a KernelTable and a ``prepare()``, its own pytest run of the
conformance suite and a README; it installs and certifies as written.
"""

from __future__ import annotations

import keyword
import re
import string
from importlib import resources
from pathlib import Path

from ..errors import InvalidArgument

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
RESERVED = frozenset({"numpy", "numba", "csimd", "all", "template"})  # Prism's own, and the CLI's "all"


def names(name: str) -> dict[str, str]:
    """The substitutions for backend ``name``: module, distribution and class names."""
    if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name):
        raise InvalidArgument(f"backend name {name!r}: use 1 to 40 lowercase letters, digits and '_', "
                              "starting with a letter (it becomes a Python module name)")
    if name in RESERVED:
        raise InvalidArgument(f"backend name {name!r} is taken (Prism's own backends and 'all'); pick another")
    cls = "".join(p.capitalize() for p in name.split("_") if p) + "Backend"
    return {"name": name, "module": f"prism_{name}", "dist": f"prism-{name.replace('_', '-')}", "Class": cls}


def _templates() -> list[tuple[str, str]]:
    """(relative path with MODULE for the package folder, template text) of every template."""
    root = resources.files(__package__) / "template"
    out = []

    def walk(d, prefix: str) -> None:
        for entry in sorted(d.iterdir(), key=lambda e: e.name):
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".tmpl"):
                out.append((prefix + entry.name[: -len(".tmpl")], entry.read_text(encoding="utf-8")))
    walk(root, "")
    return out


def write_backend(name: str, directory: str | Path | None = None) -> list[Path]:
    """Write the package for backend ``name`` into ``directory`` (default ``./prism-NAME``), which
    must not exist or be empty; returns the files written. Nothing is written on a refusal."""
    subs = names(name)
    root = Path(directory) if directory is not None else Path.cwd() / subs["dist"]
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InvalidArgument(f"{root} exists and is not an empty directory; choose another --dir")
    files = [(root / rel.replace("MODULE", subs["module"]), string.Template(text).substitute(subs))
             for rel, text in _templates()]
    written = []
    try:
        for path, text in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as e:
        raise InvalidArgument(f"cannot write the backend package into {root}: {e}") from None
    return written
