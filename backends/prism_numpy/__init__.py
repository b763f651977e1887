"""The NumPy reference backend: every op in the table, written for clarity and exactness.

It is the ground truth of the conformance suite and the scheduler's fallback. It is
registered through the ``prism.backends`` entry point like any third-party backend
and uses only ``prism_core``'s public interface.
"""

from __future__ import annotations

import numpy as np

import prism_core

from .kernels import KERNELS, prepare


class NumpyBackend(prism_core.Backend):
    name = "numpy"
    version = f"{prism_core.__version__}+numpy{np.__version__}"
    priority = 10
    is_reference = True
    kernels = KERNELS
    activation_precision = "f64"
    block_types = prism_core.ops.table.QUANTIZED  # every block type is dequantized exactly (float64)

    def prepare(self, node: prism_core.Tensor):
        return prepare(node)


@prism_core.hookimpl
def prism_register_backends() -> list[prism_core.Backend]:
    return [NumpyBackend()]
