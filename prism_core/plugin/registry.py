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

Third-party plugins run their own code at import, in their hook and in ``availability()``,
so they are kept at arm's length (plugins.md, "What a plugin may do at import"):

* the backends of this distribution (numpy, numba, csimd, ggml) are found without importing
  any other plugin: selecting one by name, the reference and the default never import a
  third-party plugin;
* the default (nothing named) is the best available backend of this distribution or of a
  plugin registered in-process: an installed third-party backend is used only when named;
* a third-party plugin is imported in-process only after a child process imported it, called
  its hook and asked its backends' availability without crashing, hanging or exiting
  (:mod:`.probe`; once per process); one that did is listed as broken with what happened.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib.util
import os
import re
import sys
import threading
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
    installed: bool = False  # a third-party plugin's, found through an entry point: used only when named


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
    installed: bool = False  # a third party's, found through an entry point: used only when named

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
                except BaseException as e:  # noqa: BLE001 - a plugin must never break the host
                    _reraise_interrupt(e)
                    self.availability = (False, f"availability check raised {type(e).__name__}: {e}")
        return self.availability

    def info(self) -> BackendInfo:
        ok, reason = self.state()
        b = self.backend
        return BackendInfo(b.name, str(b.version), int(b.priority), ok, reason, self.plugin, b,
                           interface_version=b.interface_version, installed=self.installed)


@dataclass
class _Claim:
    backend: Backend
    plugin: str
    own: bool  # shipped by this distribution, from a module installed beside prism_core
    installed: bool = False  # a third-party plugin found through an entry point


def _reraise_interrupt(e: BaseException) -> None:
    """Let Ctrl-C through; every other exception a plugin raises (SystemExit included) is its fault."""
    if isinstance(e, KeyboardInterrupt):
        raise e


def load_plugin(ep: metadata.EntryPoint) -> tuple[Any, str]:
    """The plugin object an entry point names, or (None, why its import failed)."""
    try:
        return ep.load(), ""
    except BaseException as e:  # noqa: BLE001 - a plugin must never break the host
        _reraise_interrupt(e)
        return None, f"import failed: {type(e).__name__}: {e}"


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


def _declared_by_us(ep: metadata.EntryPoint | None) -> bool:
    dist = getattr(ep, "dist", None) if ep is not None else None
    return dist is not None and _canonical(dist.metadata["Name"] or "") == OWN_DISTRIBUTION


def _own_file(file: str | None) -> bool:
    """Whether a module file is one of this distribution's (beside prism_core, or in its wheel)."""
    if not file:
        return False
    path = Path(file).resolve()
    where = path.parent.parent if path.name == "__init__.py" else path.parent
    return where in _own_roots() or any(path in _shipped_files(d) for d in metadata.distributions()
                                        if _canonical(d.metadata["Name"] or "") == OWN_DISTRIBUTION)


def _is_own(ep: metadata.EntryPoint | None, backend: Backend) -> bool:
    """Declared by prism-tensor and defined in a package installed beside this prism_core."""
    top = sys.modules.get(type(backend).__module__.split(".")[0])
    return _declared_by_us(ep) and _own_file(getattr(top, "__file__", None))


def is_built_in(ep: metadata.EntryPoint) -> bool:
    """Whether an entry point is one of this distribution's backends, decided before importing
    it: declared by prism-tensor and naming a module installed beside this prism_core (found,
    not run: a top-level module's spec executes none of its code)."""
    if not _declared_by_us(ep):
        return False
    try:
        spec = importlib.util.find_spec(ep.module.split(".")[0])
    except (ImportError, ValueError):
        return False
    return spec is not None and _own_file(spec.origin)


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
    # True in a process that is itself a probe child: it imports third-party plugins directly
    sandboxed: bool = False

    def __init__(self) -> None:
        self._lock = threading.RLock()  # one discovery at a time (a probe takes a while); hooks may re-enter
        self._extra: list[tuple[str, Any]] = []
        self._probed: dict[tuple, list[Any]] = {}  # per set of installed third-party plugins; kept across reset
        self.generation = 0  # bumped whenever what callers derived from the registry (a choice of backend) is stale
        self.reset()

    def reset(self) -> None:
        """Forget everything found so far; the next query rediscovers entry points (the probes of
        third-party plugins are kept: the same plugins, installed in the same place, are not probed again)."""
        self.generation += 1
        self._stage = 0  # 1: built-ins and in-process plugins loaded; 2: third-party plugins too
        self._backends: dict[str, _Entry] = {}
        self._reference: _Entry | None = None
        self._claims: list[_Claim] = []
        self._load_broken: list[BrokenPlugin] = []  # import and hook problems (settling adds refused names)
        self._third_party: list[metadata.EntryPoint] = []
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

    def probes(self) -> dict[tuple, list[Any]]:
        """The probes of third-party plugins made so far (for a child process to adopt)."""
        return dict(self._probed)

    def adopt_probes(self, probes: dict[tuple, list[Any]]) -> None:
        """Take another process's probes (same plugins, same machine) instead of probing again."""
        self._probed.update(probes)

    def _load(self, third_party: bool = True) -> None:
        """Stage 1: the built-in backends and the in-process plugins; stage 2 (``third_party``):
        the third-party plugins too, each imported only once its probe passed."""
        with self._lock:
            self._load_stages(third_party)

    def _load_stages(self, third_party: bool) -> None:
        if self._stage == 0:
            self.reset()
            self._stage = 1
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                if is_built_in(ep):
                    self._claims += self._import(ep)
                else:
                    self._third_party.append(ep)
            if self._extra:
                # provisionally, so that an in-process plugin's hook can already look up installed backends
                self._settle()
                for label, plugin in self._extra:
                    self._claims += self._claims_of(label, plugin, None)
            self._settle()
        if third_party and self._stage == 1:
            self._stage = 2
            self.generation += 1
            try:
                probes = self._probe(self._third_party)
            except BaseException:  # Ctrl-C while probing: the next query probes again
                self._stage = 1
                raise
            unavailable = {}  # plugin -> {backend: why}: its availability() crashed or hung in the probe
            for ep, found in zip(self._third_party, probes or [None] * len(self._third_party)):
                if found is not None and found.reason:
                    self._load_broken.append(BrokenPlugin(_label(ep), found.reason))
                    continue
                self._claims += [_Claim(c.backend, c.plugin, c.own, installed=True) for c in self._import(ep)]
                unavailable[_label(ep)] = found.unavailable if found is not None else {}
            self._settle(unavailable)

    def _import(self, ep: metadata.EntryPoint) -> list[_Claim]:
        plugin, why = load_plugin(ep)
        if why:
            self._load_broken.append(BrokenPlugin(_label(ep), why))
            return []
        return self._claims_of(_label(ep), plugin, ep)

    def _probe(self, eps: list[metadata.EntryPoint]) -> list[Any]:
        """The probe of these third-party plugins (a PluginProbe each); none in a sandbox."""
        if not eps or self.sandboxed:
            return []
        from .probe import probe, probe_timeout
        specs = tuple((ep.name, ep.value, ep.group) for ep in eps)
        key = specs + tuple(_installed_where(ep) for ep in eps)  # another install of a plugin is probed again
        if key not in self._probed:
            self._probed[key] = probe(specs, probe_timeout())
        return self._probed[key]

    def _settle(self, unavailable: dict[str, dict[str, str]] | None = None) -> None:
        """Give each name to one claim; an entry already made for the same backend object keeps its
        cached availability, and a backend whose availability() crashed or hung in the probe is
        unavailable without being asked here."""
        backends, reference, refused = _settle(self._claims)
        for name, e in backends.items():
            old = self._backends.get(name)
            if old is not None and old.backend is e.backend:
                backends[name] = old
            else:
                why = (unavailable or {}).get(e.plugin, {}).get(name)
                if why:
                    e.availability = (False, why)
        self._backends = backends
        self._reference = backends[REFERENCE_NAME] if reference is not None else None
        self.broken = self._load_broken + refused

    def _claims_of(self, label: str, plugin: Any, ep: metadata.EntryPoint | None) -> list[_Claim]:
        try:
            self.pm.register(plugin, name=label)
        except Exception as e:  # noqa: BLE001
            self._load_broken.append(BrokenPlugin(label, f"not a valid plugin: {type(e).__name__}: {e}"))
            return []
        problem = _hook_problem(self.pm, plugin)
        if problem:
            self.pm.unregister(name=label)
            self._load_broken.append(BrokenPlugin(label, problem))
            return []
        claims = []
        for impl in self.pm.hook.prism_register_backends.get_hookimpls():
            if impl.plugin_name != label:
                continue
            try:
                found = impl.function()
            except BaseException as e:  # noqa: BLE001 - SystemExit from a hook is the plugin's fault too
                _reraise_interrupt(e)
                self._load_broken.append(BrokenPlugin(label, f"prism_register_backends raised {type(e).__name__}: {e}"))
                continue
            if not isinstance(found, (list, tuple)):
                self._load_broken.append(BrokenPlugin(label, "prism_register_backends must return a list of Backend "
                                                      f"instances, returned {type(found).__name__}"))
                continue
            for b in found:
                problem = _malformed(b)
                if problem:
                    self._load_broken.append(BrokenPlugin(label, problem))
                else:
                    claims.append(_Claim(b, label, _is_own(ep, b)))
        return claims

    # ---------------------------------------------------------------- queries
    def _ranked(self, third_party: bool = True) -> list[_Entry]:
        self._load(third_party)
        entries = [e for e in self._backends.values() if third_party or not e.installed]
        return sorted(entries, key=lambda e: (-int(e.backend.priority), e.backend.name))

    def names(self) -> list[str]:
        """Every registered backend's name, best first, without asking any for availability."""
        return [e.backend.name for e in self._ranked()]

    def infos(self) -> list[BackendInfo]:
        """Every registered backend with its availability (asks each backend once)."""
        return [e.info() for e in self._ranked()]

    def info(self, name: str) -> BackendInfo:
        """One backend's record, asking only that backend for its availability; a built-in
        backend is found without importing any third-party plugin."""
        if not isinstance(name, str):
            raise InvalidArgument(f"a backend name must be a str (or None: the best available), got {name!r:.60}")
        self._load(third_party=False)
        entry = self._backends.get(name)
        if entry is None or not self._is_built_in(entry):
            self._load()
            entry = self._backends.get(name)
        if entry is None:
            skipped = "".join(f"; broken plugin {b.plugin}: {b.reason}" for b in self.broken)
            raise UnknownBackend(f"no backend named {name!r}; registered: {', '.join(self.names()) or 'none'}"
                                 + skipped)
        return entry.info()

    def candidates(self) -> Iterator[BackendInfo]:
        """The backends a choice without a name picks from, best first: the built-ins and the
        plugins registered in-process, never an installed third party's (none is imported).
        Each backend is asked for its availability as the iteration reaches it."""
        for e in self._ranked(third_party=False):
            yield e.info()

    def _is_built_in(self, entry: _Entry) -> bool:
        return any(c.own and c.backend is entry.backend for c in self._claims)

    def get(self, name: str | None = None) -> Backend:
        if name is None:
            chosen = _SCOPED.get() or self.default
            if isinstance(chosen, Backend):
                return chosen
            name = chosen or os.environ.get(ENV_BACKEND) or None
        if name is None:
            for info in self.candidates():
                if info.available:
                    return info.backend
            raise BackendUnavailable("no backend is available; registered: "
                                     + (", ".join(f"{i.name} ({i.reason})" for i in self.candidates()) or "none")
                                     + " (an installed third-party backend is used only when named)")
        info = self.info(name)
        if not info.available:
            raise BackendUnavailable(f"backend {name!r} is unavailable: {info.reason}")
        return info.backend

    def reference(self) -> Backend:
        self._load(third_party=False)
        entry = self._reference
        if entry is not None and entry.state()[0]:
            return entry.backend
        why = f": {entry.state()[1]}" if entry is not None else ""
        raise BackendUnavailable(f"the reference backend ({REFERENCE_NAME!r}, shipped with {OWN_DISTRIBUTION}) is "
                                 f"not installed or not available{why}; fallback and conformance need it")


def _label(ep: metadata.EntryPoint) -> str:
    return f"{ep.name} ({ep.value})"


def _installed_where(ep: metadata.EntryPoint) -> tuple[str, str]:
    """The folder and version of the distribution declaring ``ep``."""
    dist = getattr(ep, "dist", None)
    return (str(dist.locate_file("")), str(dist.version)) if dist is not None else ("", "")


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
        entry = backends[name] = _Entry(keep.backend, keep.plugin, installed=keep.installed)
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
