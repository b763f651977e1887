"""The plugin contract: the :class:`~.base.Backend` base class, pluggy's hook specifications
(:mod:`.hookspecs`) and discovery and selection of backends (:mod:`.registry`)."""

from .base import Backend, Kernel, KernelTable, NodeRun, type_refusal
from .hookspecs import INTERFACE_VERSION, hookimpl

__all__ = ["INTERFACE_VERSION", "Backend", "Kernel", "KernelTable", "NodeRun", "hookimpl", "type_refusal"]
