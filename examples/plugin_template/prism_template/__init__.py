"""A template Prism backend (see plugins.md of the Prism repository).

Registered through the entry point ``template = "prism_template"`` in the group
``prism.backends`` (pyproject.toml). Prism imports this module, calls the hook below
and gets the backend instance back.
"""

from __future__ import annotations

import numpy as np

import prism_core
from prism_core import F16, F32, Tensor

from .kernels import KERNELS

__version__ = "0.1.0"

FLOAT = frozenset({F32, F16})  # BF16 left out on purpose: those cases are reported unsupported


class TemplateBackend(prism_core.Backend):
    name = "template"  # what users pass to prism_core.backend(), PRISM_BACKEND, --backend
    version = __version__
    priority = 5  # below the reference (10): never picked as the default by accident
    # interface_version: inherited (prism_core.INTERFACE_VERSION, the Prism this was built against)
    kernels = KERNELS

    def availability(self) -> tuple[bool, str]:
        if not hasattr(np, "einsum"):
            return False, "numpy.einsum is missing"
        return True, ""

    def supports(self, node: Tensor) -> bool:
        """Called for every node before anything is computed; ``False`` sends the node to the
        reference backend (or reports the case unsupported in the conformance suite)."""
        if not super().supports(node):  # a kernel exists for node.opdef.key
            return False
        srcs = [s for s in node.src if s is not None]
        if node.opdef.key == "MUL_MAT":
            return srcs[0].type in FLOAT and srcs[1].type == F32
        return node.type in FLOAT and all(s.type in FLOAT for s in srcs)


@prism_core.hookimpl
def prism_register_backends() -> list[prism_core.Backend]:
    return [TemplateBackend()]
