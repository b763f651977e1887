"""The ``prism`` command: one module per subcommand, each with ``add_parser(sub)``.

A new command is one module here and one name in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import warnings
from collections.abc import Callable

from .. import __version__
from ..errors import InvalidArgument, PrismError, PrismWarning, UnknownBackend, Unsupported

COMMANDS = ("info", "ops", "conformance", "new_backend", "demo", "models", "run", "gguf", "tokenize", "finetune",
            "export_lora", "quantize", "imatrix", "perplexity", "serve", "chat")


def exit_status(e: PrismError) -> int:
    """The exit status of a command that raised ``e``: 2 for a usage error, as argparse's own (a value
    refused: InvalidArgument and its kinds, a malformed or unknown model file, an unknown backend, something
    not supported), 1 for a failure of the work itself (a backend unavailable here, a broken plugin,
    training that diverged)."""
    return 2 if isinstance(e, InvalidArgument | UnknownBackend | Unsupported) else 1


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """warnings.showwarning that prints Prism's own warnings as the errors are, "prism: warning: ...": the
    line of Prism's code that raised one means nothing to someone running a command. Others as before."""
    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PrismWarning):
            print(f"prism: warning: {message}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)
    return showwarning


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism", description="Prism: ggml's tensor semantics with pluggable backends")
    p.add_argument("--version", action="version", version=f"prism {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f".{name}", __name__).add_parser(sub)
    args = p.parse_args(argv)
    if getattr(args, "report", None):
        for fmt, _ in args.report:
            if fmt not in ("json", "markdown", "md"):
                p.error(f"--report FORMAT must be json or markdown, got {fmt!r}")
    if hasattr(signal, "SIGPIPE"):  # `prism ops | head` should end quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    show = warnings.showwarning
    warnings.showwarning = _one_line_warnings(show)
    try:
        return args.func(args)
    except PrismError as e:
        print(f"prism: error: {e}", file=sys.stderr)
        return exit_status(e)
    except KeyboardInterrupt:  # before or after the run proper (which reports what finished)
        print("prism: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
