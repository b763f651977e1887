"""GGUF files: the format's constants (:mod:`.format`), the header parser (:mod:`.reader`), the writer
(:mod:`.writer`) and memory-mapped loading (:mod:`.file`).

::

    f = prism_core.gguf.load("model.gguf")      # header validated, tensors mapped, nothing copied
    prism_core.gguf.save("copy.gguf", f.tensors, f.meta)

A new file format built on GGUF (LoRA adapters, importance matrices) is one module beside these.
"""

from .file import GGUFFile, GGUFValueType, load
from .reader import Metadata, TensorInfo
from .writer import save

__all__ = ["GGUFFile", "GGUFValueType", "Metadata", "TensorInfo", "load", "save"]
