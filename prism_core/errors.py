"""Prism's error hierarchy: one root, each subclass also the matching builtin.

Catching ``ValueError`` or ``NotImplementedError`` keeps working for callers that
do not know Prism; catching ``PrismError`` catches everything Prism raises on purpose.
"""

from __future__ import annotations


class PrismError(Exception):
    """Root of every error Prism raises on purpose."""


class InvalidArgument(PrismError, ValueError):
    """An argument (shape, param, name, flag...) is not acceptable."""


class ShapeMismatch(InvalidArgument):
    """Tensor extents do not satisfy an op's shape rule (e.g. do not broadcast)."""


class TypeMismatch(InvalidArgument, TypeError):
    """A tensor's element type is not accepted where it was given."""


class BoundExceeded(InvalidArgument):
    """A bound was exceeded: memory budget, node capacity, name length, dims."""


class ReadOnlyTensor(InvalidArgument):
    """Something would write into a read-only tensor (one mapped from a file)."""


class MalformedFile(InvalidArgument):
    """A file (GGUF) is not well formed; the message names the file, the byte offset and
    what was wrong, which :attr:`path` and :attr:`offset` also hold."""

    def __init__(self, message: str, path: str = "", offset: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class Unsupported(PrismError, NotImplementedError):
    """A backend (or the core) does not implement what was asked."""


class BackendUnavailable(PrismError, RuntimeError):
    """A backend exists but cannot be used here (import failed, no compiler...)."""


class UnknownBackend(PrismError, LookupError):
    """No backend of that name is registered."""


class PluginError(PrismError, RuntimeError):
    """A plugin raised on import or registered something malformed."""


class PrismWarning(UserWarning):
    """Prism did what was asked, but something about it deserves a word: part of it has no effect as in
    ggml (datapoints in a partial shard that no batch uses), or it will be very slow (a real model on the
    float64 reference backend)."""
