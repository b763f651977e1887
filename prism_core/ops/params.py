"""Typed op parameters: each op's schema validates values before a node is built.

ggml packs op parameters into 16 int32 slots; Prism keeps them typed and named, with
the same information. A value that is the wrong kind, not finite or out of range
raises :class:`InvalidArgument` naming the op, the parameter and the bound.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument

_REQUIRED = object()
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Param:
    """One named parameter: ``kind`` is int, float, bool, an IntEnum class, or
    ``tuple`` (of ``length`` ints)."""

    name: str
    kind: Any
    default: Any = _REQUIRED
    min: float | None = None
    max: float | None = None
    length: int | None = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def check(self, op: str, value: Any) -> Any:
        where = f"{op}: parameter {self.name!r}"
        k = self.kind
        if k is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise InvalidArgument(f"{where} must be a bool, got {value!r}")
            return bool(value)
        if isinstance(k, type) and issubclass(k, enum.IntEnum):
            # a member or its int: True (an int in Python) or 1.0 (equal to 1) would pass Enum's lookup
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise InvalidArgument(f"{where} must be one of {[m.name for m in k]} (or its int), got {value!r}")
            try:
                return k(value)
            except (ValueError, TypeError):
                raise InvalidArgument(f"{where} must be one of {[m.name for m in k]}, got {value!r}") from None
        if k is tuple:
            if isinstance(value, (str, bytes)):
                raise InvalidArgument(f"{where} must be a sequence of ints, got {value!r}")
            try:
                vals = tuple(value)
            except TypeError:
                raise InvalidArgument(f"{where} must be a sequence of {self.length} ints, got {value!r}") from None
            if self.length is not None and len(vals) != self.length:
                raise InvalidArgument(f"{where} must have {self.length} ints, got {len(vals)}: {vals}")
            return tuple(self._int(where, v) for v in vals)
        if k is int:
            return self._range(where, self._int(where, value))
        if k is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InvalidArgument(f"{where} must be a number, got {value!r}")
            try:
                v = float(value)
            except OverflowError:  # an int beyond any float
                raise InvalidArgument(f"{where} must be a finite float32, got an int of "
                                      f"{int(value).bit_length()} bits") from None
            if not math.isfinite(v):
                raise InvalidArgument(f"{where} must be finite, got {v}")
            # ggml stores float params as float32 and its kernels compute with that value: a value
            # finite as a double but not as a float32 would be inf on one backend and not on another
            if abs(v) > FLOAT32_MAX:
                raise InvalidArgument(f"{where} is {v}, beyond float32's range (|x| <= {FLOAT32_MAX:.7g})")
            return float(np.float32(self._range(where, v)))
        raise AssertionError(f"unknown param kind {k!r}")

    def _int(self, where: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidArgument(f"{where} must be an int, got {v!r}")
        v = int(v)
        if not INT64_MIN <= v <= INT64_MAX:  # kernels index and offset with int64
            raise InvalidArgument(f"{where} must fit in int64, got {v}")
        return self._range(where, v)

    def _range(self, where: str, v: Any) -> Any:
        if self.min is not None and v < self.min:
            raise InvalidArgument(f"{where} must be >= {self.min}, got {v}")
        if self.max is not None and v > self.max:
            raise InvalidArgument(f"{where} must be <= {self.max}, got {v}")
        return v


def check_params(op: str, schema: tuple[Param, ...], given: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters in schema order, defaults filled in; unknown names rejected."""
    known = {p.name for p in schema}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidArgument(f"{op}: unknown parameter(s) {unknown}; known: {sorted(known) or 'none'}")
    out = {}
    for p in schema:
        if p.name in given:
            out[p.name] = p.check(op, given[p.name])
        elif p.required:
            raise InvalidArgument(f"{op}: parameter {p.name!r} is required")
        else:
            out[p.name] = p.default
    return out
