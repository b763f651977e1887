"""Argument types shared by the commands: a bad value is a usage error (exit 2), as argparse's own."""

from __future__ import annotations

import argparse
import math
import os

MAX_SECONDS = 1e6  # about 11 days: beyond it "no limit" is meant (0), and OS timers overflow


def seconds_arg(text: str) -> float:
    """A finite number of seconds, 0 to MAX_SECONDS."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    if x > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS:g} seconds (0: no limit), got {text!r}")
    return x


def timeout_arg(text: str) -> tuple[str | None, float]:
    """``SECONDS`` (every backend) or ``BACKEND=SECONDS`` (that backend only): (name or None, seconds)."""
    name, sep, value = text.rpartition("=")
    if sep and not name.strip():
        raise argparse.ArgumentTypeError(f"expected SECONDS or BACKEND=SECONDS, got {text!r}")
    return (name.strip() or None), seconds_arg(value)


def budget_arg(text: str) -> float:
    x = seconds_arg(text)
    if x == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return x


def int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
        return n
    parse.__name__ = f"integer >= {minimum}"
    return parse


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate, a LoRA alpha)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return v


def jobs_arg(text: str) -> int:
    if text == "auto":
        return os.cpu_count() or 1
    return int_at_least(1)(text)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default in ``--help`` (as llama.cpp's tools), unless its help already says it or
    there is none (a default of None, or a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
