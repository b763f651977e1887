"""Settings every backend reads the same way, from the environment.

``PRISM_NUM_THREADS`` is the one thread-count setting of all parallel backends; backends
also use :func:`env_int` for their own integer settings so that a bad value is refused
with the same clear message everywhere.
"""

from __future__ import annotations

import os

ENV_THREADS = "PRISM_NUM_THREADS"


def env_int(name: str, default: int | None, minimum: int) -> int | None:
    """The integer in ``$name`` (``default`` when unset or empty); ValueError naming the
    variable when it is not an integer or is below ``minimum``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if n < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}")
    return n


def requested_threads() -> int | None:
    """The thread count asked for in ``$PRISM_NUM_THREADS`` (None: all cores)."""
    return env_int(ENV_THREADS, None, 1)
