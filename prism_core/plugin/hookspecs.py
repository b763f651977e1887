"""pluggy hook specifications of the ``prism`` plugin interface.

A plugin is a module listed under the entry-point group ``prism.backends`` that
implements :func:`prism_register_backends`. See plugins.md.
"""

from __future__ import annotations

import pluggy

PROJECT = "prism"
INTERFACE_VERSION = 1  # bumped on incompatible changes to Backend or the hooks

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def prism_register_backends() -> list:
    """Return the :class:`prism_core.Backend` instances this plugin provides."""
