"""Settings every backend reads the same way, from the environment.

``PRISM_NUM_THREADS`` is the one thread-count setting of all parallel backends; backends
also use :func:`env_int` for their own integer settings so that a bad value is refused
with the same clear message everywhere. Backends read them in ``availability()``, so a
bad value makes the backend unavailable with the message when it is selected, instead
of failing (or crashing native code) at compute time.
"""

from __future__ import annotations

import functools
import os

from .errors import InvalidArgument

ENV_THREADS = "PRISM_NUM_THREADS"
# ggml's own ceiling on a compute's thread count (GGML_MAX_N_THREADS in ggml.h): far more
# than any host has cores, and far below what native thread pools survive (100000 crashed one).
MAX_THREADS = 512


def env_values(names: tuple[str, ...]) -> tuple[str | None, ...]:
    """The raw values of the variables ``names`` (None where unset), cheaply enough for a check on
    every call: ``os.environ.get`` of an unset variable raises and catches two KeyErrors inside
    (about 2 us each), so CPython's own mapping behind ``os.environ`` is read where it is there."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        return tuple(os.environ.get(n) for n in names)
    decode = os.environ.decodevalue  # type: ignore[attr-defined]
    return tuple(None if (v := data.get(k)) is None else decode(v) for k in _encoded(names))


@functools.cache
def _encoded(names: tuple[str, ...]) -> tuple:
    return tuple(os.environ.encodekey(n) for n in names)  # type: ignore[attr-defined]


def env_int(name: str, default: int | None, minimum: int, maximum: int | None = None) -> int | None:
    """The integer in ``$name`` (``default`` when unset or empty); InvalidArgument (a
    ValueError) naming the variable when it is not an integer or lies outside
    ``[minimum, maximum]``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw[:40]!r} is not an integer") from None
    if n < minimum:
        raise InvalidArgument(f"{name}={raw!r} must be at least {minimum}")
    if maximum is not None and n > maximum:
        raise InvalidArgument(f"{name}={raw[:40]!r} must be at most {maximum}")
    return n


def requested_threads() -> int | None:
    """The thread count asked for in ``$PRISM_NUM_THREADS`` (None: all cores), 1 to
    :data:`MAX_THREADS`."""
    return env_int(ENV_THREADS, None, 1, MAX_THREADS)


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The word in ``$name``, lower-cased (``default`` when unset or empty); InvalidArgument (a
    ValueError) naming the variable, the words it takes and the value given otherwise."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise InvalidArgument(f"{name}={raw[:40]!r} is not one of {', '.join(choices)}")
    return raw
