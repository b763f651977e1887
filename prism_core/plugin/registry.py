"""Backend discovery and selection.

Plugins are found through the ``prism.backends`` entry-point group (the built-in
backends too) and may also be registered in-process. A plugin that raises on
import, whose hook raises, that implements no (or a misspelled) hook, or that
registers something malformed is recorded as a :class:`BrokenPlugin` and skipped: it
never breaks ``import prism_core``.

Names are settled after every plugin is loaded, so the outcome does not depend on the
order of ``sys.path`` or of the entry points: the reference is the ``numpy`` backend of
this distribution (prism-tensor) and nothing else; a third party naming a backend
``numpy`` or setting ``is_reference`` is refused; a name claimed by this distribution
stays its own; a name several third-party plugins claim is refused for all of them.

Availability is asked lazily, one backend at a time, and cached until :meth:`Registry.reset`:
selecting a backend by name asks only that backend.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from ..errors import BackendUnavailable, InvalidArgument, UnknownBackend
from . import hookspecs
from .base import Backend

ENTRY_POINT_GROUP = "prism.backends"
ENV_BACKEND = "PRISM_BACKEND"
OWN_DISTRIBUTION = "prism-tensor"  # the distribution whose backends are Prism's own
REFERENCE_NAME = "numpy"


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


@dataclass
class _Entry:
    """A registered backend; its availability is asked on first need and then kept."""
    backend: Backend
    plugin: str
    availability: tuple[bool, str] | None = field(default=None)

    def state(self) -> tuple[bool, str]:
        if self.availability is None:
            b = self.backend
            if b.interface_version != hookspecs.INTERFACE_VERSION:
                self.availability = (False, f"built for plugin interface {b.interface_version}, "
                                            f"this Prism has {hookspecs.INTERFACE_VERSION}")
            else:
                try:
                    ok, reason = b.availability()
                    self.availability = (bool(ok), str(reason))
                except Exception as e:  # noqa: BLE001 - a plugin must never break the host
                    self.availability = (False, f"availability check raised {type(e).__name__}: {e}")
        return self.availability

    def info(self) -> BackendInfo:
        ok, reason = self.state()
        b = self.backend
        return BackendInfo(b.name, str(b.version), int(b.priority), ok, reason, self.plugin, b,
                           interface_version=b.interface_version)


@dataclass
class _Claim:
    backend: Backend
    plugin: str
    own: bool  # shipped by this distribution, from a module installed beside prism_core


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The entry points of ``group`` of every distribution on ``sys.path``.

    Unlike ``importlib.metadata.entry_points``, a distribution is not hidden by another
    of the same name earlier on the path (a third party calling itself prism-tensor must
    not hide this one); identical declarations found twice count once."""
    seen: set[tuple[str, str, str]] = set()
    found = []
    for dist in metadata.distributions():
        dname = _canonical(dist.metadata["Name"] or "")
        for ep in dist.entry_points:
            key = (dname, ep.name, ep.value)
            if ep.group == group and key not in seen:
                seen.add(key)
                found.append(ep)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _own_roots() -> tuple[Path, ...]:
    """Where this distribution's backend packages live: beside prism_core (an installed
    wheel) or in the checkout's ``backends/`` folder (a source tree)."""
    root = Path(__file__).resolve().parents[2]  # prism_core/plugin/registry.py -> beside prism_core
    return root, root / "backends"


def _is_own(ep: metadata.EntryPoint | None, backend: Backend) -> bool:
    """Declared by prism-tensor and defined in a package installed beside this prism_core."""
    dist = getattr(ep, "dist", None) if ep is not None else None
    if dist is None or _canonical(dist.metadata["Name"] or "") != OWN_DISTRIBUTION:
        return False
    top = sys.modules.get(type(backend).__module__.split(".")[0])
    file = getattr(top, "__file__", None)
    if not file:
        return False
    path = Path(file).resolve()
    where = path.parent.parent if path.name == "__init__.py" else path.parent
    return where in _own_roots() or any(path in _shipped_files(d) for d in metadata.distributions()
                                        if _canonical(d.metadata["Name"] or "") == OWN_DISTRIBUTION)


def _shipped_files(dist: metadata.Distribution) -> frozenset[Path]:
    """The files an installed prism-tensor wheel recorded, when it also ships the core itself (so
    a source checkout's prism_core on sys.path still recognises the installed built-in backends,
    and a distribution that only borrows the name ships no prism_core)."""
    files = [dist.locate_file(f) for f in dist.files or () if str(f).endswith(".py")]
    paths = frozenset(Path(f).resolve() for f in files)
    return paths if any(p.parts[-2:] == ("prism_core", "__init__.py") for p in paths) else frozenset()


def _hook_problem(pm: pluggy.PluginManager, plugin: Any) -> str:
    """Why ``plugin`` implements the prism interface wrongly ("" when it does not)."""
    spec_names = {n for n in dir(hookspecs) if pm.parse_hookspec_opts(hookspecs, n) is not None}
    names = [n for n in dir(plugin) if not n.startswith("__")]
    marked = []
    for n in names:
        try:
            if pm.parse_hookimpl_opts(plugin, n) is not None:
                marked.append(n)
        except Exception:  # noqa: BLE001 - an attribute that raises on access is no hook
            continue
    unknown = [n for n in marked if n not in spec_names]
    if unknown:
        return (f"implements {', '.join(repr(n) for n in unknown)}, which is no hook of the prism interface "
                f"(hooks: {', '.join(sorted(spec_names))})")
    if any(n in spec_names for n in marked):
        return ""
    if "prism_register_backends" in names:
        return "prism_register_backends is not marked with @prism_core.hookimpl"
    close = difflib.get_close_matches("prism_register_backends", names, n=1, cutoff=0.75)
    hint = f"; {close[0]!r} looks like a misspelling" if close else ""
    return "implements no hook of the prism interface (expected prism_register_backends)" + hint


class Registry:
    default: Backend | str | None = None  # set by use_backend(): the process-wide choice

    def __init__(self) -> None:
        self._loaded = False
        self._extra: list[tuple[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        """Forget everything found so far; the next query rediscovers entry points."""
        self._loaded = False
        self._backends: dict[str, _Entry] = {}
        self._reference: _Entry | None = None
        self.broken: list[BrokenPlugin] = []
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register a plugin object (module or class instance with the hook) in-process."""
        self._extra.append((name or getattr(plugin, "__name__", repr(plugin)), plugin))
        self.reset()

    def unregister(self, name: str) -> None:
        self._extra = [(n, p) for n, p in self._extra if n != name]
        self.reset()

    @property
    def in_process_plugins(self) -> list[tuple[str, Any]]:
        """The plugins given to :meth:`register` (label, object), in order."""
        return list(self._extra)

    def _load(self) -> None:
        if self._loaded:
            return
        self.reset()
        self._loaded = True
        plugins: list[tuple[str, Any, metadata.EntryPoint | None]] = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            label = f"{ep.name} ({ep.value})"
            try:
                plugins.append((label, ep.load(), ep))
            except BaseException as e:  # noqa: BLE001 - a plugin must never break the host
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                self.broken.append(BrokenPlugin(label, f"import failed: {type(e).__name__}: {e}"))
        claims: list[_Claim] = []
        for label, plugin, ep in plugins:
            claims += self._claims_of(label, plugin, ep)
        if self._extra:
            # provisionally, so that an in-process plugin's hook can already look up installed backends
            self._backends, self._reference, _ = _settle(claims)
            for label, plugin in self._extra:
                claims += self._claims_of(label, plugin, None)
        self._backends, self._reference, refused = _settle(claims)
        self.broken += refused

    def _claims_of(self, label: str, plugin: Any, ep: metadata.EntryPoint | None) -> list[_Claim]:
        try:
            self.pm.register(plugin, name=label)
        except Exception as e:  # noqa: BLE001
            self.broken.append(BrokenPlugin(label, f"not a valid plugin: {type(e).__name__}: {e}"))
            return []
        problem = _hook_problem(self.pm, plugin)
        if problem:
            self.pm.unregister(name=label)
            self.broken.append(BrokenPlugin(label, problem))
            return []
        claims = []
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
                problem = _malformed(b)
                if problem:
                    self.broken.append(BrokenPlugin(label, problem))
                else:
                    claims.append(_Claim(b, label, _is_own(ep, b)))
        return claims

    # ---------------------------------------------------------------- queries
    def _ranked(self) -> list[_Entry]:
        self._load()
        return sorted(self._backends.values(), key=lambda e: (-int(e.backend.priority), e.backend.name))

    def names(self) -> list[str]:
        """Every registered backend's name, best first, without asking any for availability."""
        return [e.backend.name for e in self._ranked()]

    def infos(self) -> list[BackendInfo]:
        """Every registered backend with its availability (asks each backend once)."""
        return [e.info() for e in self._ranked()]

    def info(self, name: str) -> BackendInfo:
        """One backend's record, asking only that backend for its availability."""
        if not isinstance(name, str):
            raise InvalidArgument(f"a backend name must be a str (or None: the best available), got {name!r:.60}")
        self._load()
        entry = self._backends.get(name)
        if entry is None:
            raise UnknownBackend(f"no backend named {name!r}; registered: {', '.join(self.names()) or 'none'}")
        return entry.info()

    def get(self, name: str | None = None) -> Backend:
        if name is None:
            chosen = _SCOPED.get() or self.default
            if isinstance(chosen, Backend):
                return chosen
            name = chosen or os.environ.get(ENV_BACKEND) or None
        if name is None:
            ranked = self._ranked()
            for e in ranked:  # availability is asked best first, up to the first available backend
                if e.state()[0]:
                    return e.backend
            raise BackendUnavailable("no backend is available; registered: "
                                     + (", ".join(f"{e.backend.name} ({e.state()[1]})" for e in ranked) or "none"))
        info = self.info(name)
        if not info.available:
            raise BackendUnavailable(f"backend {name!r} is unavailable: {info.reason}")
        return info.backend

    def reference(self) -> Backend:
        self._load()
        entry = self._reference
        if entry is not None and entry.state()[0]:
            return entry.backend
        why = f": {entry.state()[1]}" if entry is not None else ""
        raise BackendUnavailable(f"the reference backend ({REFERENCE_NAME!r}, shipped with {OWN_DISTRIBUTION}) is "
                                 f"not installed or not available{why}; fallback and conformance need it")


def _settle(claims: list[_Claim]) -> tuple[dict[str, _Entry], _Entry | None, list[BrokenPlugin]]:
    """Give each name to one claim, independently of the order the claims came in: the
    backends by name, the reference, and the refused claims."""
    refused: list[BrokenPlugin] = []
    backends: dict[str, _Entry] = {}
    reference = None
    by_name: dict[str, list[_Claim]] = {}
    for c in claims:
        b = c.backend
        if not c.own and (b.name == REFERENCE_NAME or b.is_reference):
            what = (f"backend name {REFERENCE_NAME!r} is reserved" if b.name == REFERENCE_NAME
                    else f"backend {b.name!r} claims to be the reference (is_reference=True), which is")
            refused.append(BrokenPlugin(c.plugin, f"{what} for the reference backend shipped with "
                                        f"{OWN_DISTRIBUTION}; refused"))
            continue
        by_name.setdefault(b.name, []).append(c)
    for name, cs in by_name.items():
        own = [c for c in cs if c.own]
        if own:
            keep = own[0]
            for c in cs:
                if c is not keep:
                    refused.append(BrokenPlugin(c.plugin, f"backend name {name!r} is already registered "
                                                f"by {keep.plugin}, {OWN_DISTRIBUTION}'s own"))
        elif len({c.plugin for c in cs}) > 1:
            owners = ", ".join(sorted({c.plugin for c in cs}))
            for c in cs:
                refused.append(BrokenPlugin(c.plugin, f"backend name {name!r} is claimed by several "
                                            f"plugins ({owners}); all are refused until one is renamed"))
            continue
        else:
            keep = cs[0]
            for c in cs[1:]:
                refused.append(BrokenPlugin(c.plugin, f"backend name {name!r} is already registered "
                                            f"by {keep.plugin}"))
        entry = backends[name] = _Entry(keep.backend, keep.plugin)
        if keep.own and name == REFERENCE_NAME and keep.backend.is_reference:
            reference = entry
    return backends, reference, refused


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
    """The backend called ``name`` (a lookup: it selects nothing); without a name the one
    compute would use: the innermost :func:`using_backend` block's, else :func:`use_backend`'s,
    else ``$PRISM_BACKEND``'s, else the best available one."""
    return REGISTRY.get(name)


# using_backend()'s choice: per thread (and per asyncio task), innermost block first
_SCOPED: contextvars.ContextVar[Backend | str | None] = contextvars.ContextVar("prism_backend", default=None)


def _checked_choice(b: Backend | str, who: str) -> Backend | str:
    if isinstance(b, Backend):
        return b
    if not isinstance(b, str):
        raise InvalidArgument(f"{who}: expected a Backend or a backend name, got {type(b).__name__}")
    REGISTRY.get(b)  # unknown or unavailable: refused now, not at the first compute
    return b


def use_backend(b: Backend | str | None) -> Backend | None:
    """Make ``b`` the process-wide default backend (every thread, every later compute or
    plan without an explicit backend); ``None`` goes back to ``$PRISM_BACKEND`` / the best
    available one. Returns the backend now selected by default (None after clearing)."""
    REGISTRY.default = None if b is None else _checked_choice(b, "use_backend")
    return None if b is None else REGISTRY.get()


@contextlib.contextmanager
def using_backend(b: Backend | str) -> Iterator[Backend]:
    """Within the ``with`` block, in this thread (or asyncio task) only, compute and plan
    without an explicit backend use ``b``; blocks nest, the innermost wins, and the previous
    choice comes back on exit, also after an exception."""
    token = _SCOPED.set(_checked_choice(b, "using_backend"))
    try:
        yield REGISTRY.get()
    finally:
        _SCOPED.reset(token)


def broken_plugins() -> list[BrokenPlugin]:
    REGISTRY.names()
    return list(REGISTRY.broken)
