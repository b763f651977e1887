"""Backend discovery and selection.

Plugins are found through the ``prism.backends`` entry-point group (the built-in
backends too) and may also be registered in-process. A plugin that raises on
import, whose hook raises, or that registers something malformed is recorded as a
:class:`BrokenPlugin` and skipped: it never breaks ``import prism_core``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy

from . import hookspecs
from .backend import Backend
from .errors import BackendUnavailable, UnknownBackend

ENTRY_POINT_GROUP = "prism.backends"
ENV_BACKEND = "PRISM_BACKEND"


@dataclass(frozen=True)
class BackendInfo:
    name: str
    version: str
    priority: int
    available: bool
    reason: str
    plugin: str
    backend: Backend | None = None
    interface_version: int | None = None  # the plugin interface the backend was built for


@dataclass(frozen=True)
class BrokenPlugin:
    plugin: str
    reason: str


class Registry:
    def __init__(self) -> None:
        self._loaded = False
        self._extra: list[tuple[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        """Forget everything found so far; the next query rediscovers entry points."""
        self._loaded = False
        self._backends: dict[str, BackendInfo] = {}
        self.broken: list[BrokenPlugin] = []
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register a plugin object (module or class instance with the hook) in-process."""
        self._extra.append((name or getattr(plugin, "__name__", repr(plugin)), plugin))
        self._loaded = False
        self._backends.clear()
        self.broken.clear()

    def unregister(self, name: str) -> None:
        self._extra = [(n, p) for n, p in self._extra if n != name]
        self.reset()

    def _load(self) -> None:
        if self._loaded:
            return
        self.reset()
        self._loaded = True
        plugins: list[tuple[str, Any]] = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            label = f"{ep.name} ({ep.value})"
            try:
                plugins.append((label, ep.load()))
            except BaseException as e:  # noqa: BLE001 - a plugin must never break the host
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                self.broken.append(BrokenPlugin(label, f"import failed: {type(e).__name__}: {e}"))
        plugins += self._extra
        for label, plugin in plugins:
            self._add_plugin(label, plugin)

    def _add_plugin(self, label: str, plugin: Any) -> None:
        try:
            self.pm.register(plugin, name=label)
        except Exception as e:  # noqa: BLE001
            self.broken.append(BrokenPlugin(label, f"not a valid plugin: {type(e).__name__}: {e}"))
            return
        for impl in self.pm.hook.prism_register_backends.get_hookimpls():
            if impl.plugin_name != label:
                continue
            try:
                found = impl.function()
            except Exception as e:  # noqa: BLE001
                self.broken.append(BrokenPlugin(label, f"prism_register_backends raised {type(e).__name__}: {e}"))
                continue
            if not isinstance(found, (list, tuple)):
                self.broken.append(BrokenPlugin(label, "prism_register_backends must return a list of Backend "
                                                f"instances, returned {type(found).__name__}"))
                continue
            for b in found:
                self._add_backend(label, b)

    def _add_backend(self, label: str, b: Any) -> None:
        problem = _malformed(b)
        if problem is None and b.name in self._backends:
            problem = f"backend name {b.name!r} is already registered by {self._backends[b.name].plugin}"
        if problem:
            self.broken.append(BrokenPlugin(label, problem))
            return
        if b.interface_version != hookspecs.INTERFACE_VERSION:
            ok, reason = False, (f"built for plugin interface {b.interface_version}, "
                                 f"this Prism has {hookspecs.INTERFACE_VERSION}")
        else:
            try:
                ok, reason = b.availability()
            except Exception as e:  # noqa: BLE001
                ok, reason = False, f"availability check raised {type(e).__name__}: {e}"
        self._backends[b.name] = BackendInfo(b.name, str(b.version), int(b.priority), bool(ok), reason,
                                             label, b, interface_version=b.interface_version)

    # ---------------------------------------------------------------- queries
    def infos(self) -> list[BackendInfo]:
        self._load()
        return sorted(self._backends.values(), key=lambda i: (-i.priority, i.name))

    def get(self, name: str | None = None) -> Backend:
        infos = self.infos()
        if name is None:
            name = os.environ.get(ENV_BACKEND) or None
        if name is None:
            for i in infos:
                if i.available:
                    return i.backend
            raise BackendUnavailable("no backend is available; registered: "
                                     + (", ".join(f"{i.name} ({i.reason})" for i in infos) or "none"))
        info = self._backends.get(name)
        if info is None:
            raise UnknownBackend(f"no backend named {name!r}; registered: "
                                 f"{', '.join(i.name for i in infos) or 'none'}")
        if not info.available:
            raise BackendUnavailable(f"backend {name!r} is unavailable: {info.reason}")
        return info.backend

    def reference(self) -> Backend:
        for i in self.infos():
            if i.available and i.backend.is_reference:
                return i.backend
        raise BackendUnavailable("the reference backend (is_reference=True, normally 'numpy') is not "
                                 "installed or not available; fallback and conformance need it")


def _malformed(b: Any) -> str | None:
    if not isinstance(b, Backend):
        return f"registered {type(b).__name__!s} object, which is not a prism_core.Backend"
    if not isinstance(b.name, str) or not b.name.isidentifier():
        return f"backend name must be an identifier-like str, got {b.name!r}"
    if isinstance(b.priority, bool) or not isinstance(b.priority, int):
        return f"backend {b.name!r}: priority must be an int, got {b.priority!r}"
    if not hasattr(b.kernels, "get"):
        return f"backend {b.name!r}: kernels must be a mapping of op keys to callables"
    return None


REGISTRY = Registry()


def backends() -> list[BackendInfo]:
    """Every registered backend (best first) with its availability and reason."""
    return REGISTRY.infos()


def backend(name: str | None = None) -> Backend:
    """The backend called ``name``; else ``$PRISM_BACKEND``; else the best available one."""
    return REGISTRY.get(name)


def broken_plugins() -> list[BrokenPlugin]:
    REGISTRY.infos()
    return list(REGISTRY.broken)
