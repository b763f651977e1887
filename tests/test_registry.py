"""Backend discovery through real entry points, and in-process registration.

Each test writes plugin modules plus ``<dist>-0.1.dist-info/`` folders (METADATA and
entry_points.txt declaring ``[prism.backends]``) into ``tmp_path``, puts it on
``sys.path`` and resets the registry, so ``importlib.metadata`` finds them exactly as
it finds an installed third-party backend. The ``plugins`` fixture resets the registry
again at teardown (after ``tmp_path`` has left ``sys.path``), so other tests see the
normal registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import write_plugin

import prism_core as pc
from prism_core import BackendUnavailable, UnknownBackend, Unsupported

# ---------------------------------------------------------------- plugin sources
ADDONLY = '''
import numpy as np
import prism_core as pc

CALLS = []


def _add(node):
    a, b = node.src[0], node.src[1]
    CALLS.append(node.opdef.key)
    # ggml broadcast of b into a (each of a's extents a multiple of b's), via the public API
    reps = tuple(x // y for x, y in zip(reversed(a.ne), reversed(b.ne)))
    node.set(np.tile(b.host(), reps).astype(np.float64) + a.host())


class AddOnly(pc.Backend):
    name = "addonly"
    version = "0.1"
    priority = 5  # below numpy (10)
    kernels = {"ADD": _add}


@pc.hookimpl
def prism_register_backends():
    return [AddOnly()]
'''


def backend_source(name: str, priority: int = 1, *, extra: str = "", returns: str | None = None) -> str:
    """A plugin module whose hook returns one backend of class ``B`` (or ``returns``);
    ``extra`` is more of ``B``'s body."""
    body = textwrap.indent(textwrap.dedent(extra).strip("\n"), "    ")
    return "\n".join([
        "import prism_core as pc",
        "",
        "",
        "class B(pc.Backend):",
        f"    name = {name!r}",
        f"    priority = {priority}",
        body,
        "",
        "",
        "@pc.hookimpl",
        "def prism_register_backends():",
        f"    return {returns or '[B()]'}",
        "",
    ])


# ---------------------------------------------------------------- fixtures
class Plugins:
    """Writes plugin distributions into a directory on ``sys.path``."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.modules: list[str] = []
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.delenv(pc.plugin.registry.ENV_BACKEND, raising=False)
        # Only the reference backend and this test's plugins are visible, so the
        # expectations hold whatever other backends (numba, third parties) are installed.
        real = pc.plugin.registry.entry_points

        def visible(**kw):
            return [ep for ep in real(**kw) if ep.name == "numpy" or ep.value in self.modules]
        monkeypatch.setattr(pc.plugin.registry, "entry_points", visible)

    def add(self, module: str, source: str, *, entry: str | None = None, dist: str | None = None) -> None:
        """Module ``module`` with ``source``, declared by distribution ``dist`` under
        entry-point name ``entry`` in group prism.backends."""
        write_plugin(self.root, module, source, entry=entry, dist=dist)
        self.modules.append(module)
        pc.REGISTRY.reset()

    def broken(self, module: str) -> list[pc.BrokenPlugin]:
        return [b for b in pc.broken_plugins() if module in b.plugin]

    def info(self, name: str) -> pc.BackendInfo:
        (found,) = [i for i in pc.backends() if i.name == name]
        return found


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    p = Plugins(tmp_path, monkeypatch)
    pc.REGISTRY.reset()
    yield p
    for m in p.modules:
        sys.modules.pop(m, None)
    pc.REGISTRY.reset()  # rediscovery happens lazily, once tmp_path has left sys.path


def f32(ctx: pc.Context, values) -> pc.Tensor:
    return ctx.from_numpy(np.asarray(values, dtype=np.float32))


# ---------------------------------------------------------------- (1) a partial backend
def test_entry_point_plugin_is_discovered_and_computes_add(plugins):
    plugins.add("prism_test_addonly", ADDONLY, entry="addonly")
    names = [i.name for i in pc.backends()]
    assert names.index("numpy") < names.index("addonly")  # best first: numpy has the higher priority
    info = plugins.info("addonly")
    assert info.available and info.reason == "" and info.priority == 5 and info.version == "0.1"
    assert info.plugin == "addonly (prism_test_addonly)"
    assert pc.broken_plugins() == []

    be = pc.backend("addonly")
    assert be.name == "addonly" and be is info.backend
    mod = sys.modules["prism_test_addonly"]

    ctx = pc.Context()
    a = f32(ctx, [[1, 2, 3], [4, 5, 6]])
    b = f32(ctx, [10, 20, 30])
    s = pc.add(a, b)
    report = pc.compute(s, "addonly")
    assert report.backend == "addonly" and report.computed == 1 and report.fallbacks == []
    assert mod.CALLS == ["ADD"]
    np.testing.assert_array_equal(s.numpy(), [[11, 22, 33], [14, 25, 36]])


def test_partial_backend_falls_back_for_mul(plugins):
    plugins.add("prism_test_addonly2", ADDONLY, entry="addonly")
    ctx = pc.Context()
    a = f32(ctx, [[1, 2], [3, 4]])
    b = f32(ctx, [[5, 6], [7, 8]])
    s = pc.add(a, b)
    p = pc.mul(s, a)
    g = pc.build_forward(p)

    with pytest.raises(Unsupported, match=r"backend 'addonly' does not support <MUL .*> \(strict mode\)"):
        pc.compute(g, "addonly", strict=True)
    assert not s.numpy().any() and not p.numpy().any()  # strict refuses before computing anything

    report = pc.compute(g, "addonly")
    assert sys.modules["prism_test_addonly2"].CALLS == ["ADD"]  # ADD ran on the plugin itself
    assert report.backend == "addonly" and report.computed == 2
    assert report.fell_back == ["MUL"]
    assert [f.node for f in report.fallbacks] == [p] and report.fallbacks[0].reason == "not supported"
    np.testing.assert_array_equal(s.numpy(), [[6, 8], [10, 12]])
    np.testing.assert_array_equal(p.numpy(), [[6, 16], [30, 48]])


# ---------------------------------------------------------------- (2) a plugin that raises on import
BOOM = 'raise RuntimeError("boom: this plugin cannot be imported")\n'


def test_plugin_raising_on_import_is_recorded_as_broken(plugins):
    plugins.add("prism_test_boom", BOOM, entry="boom")
    (broken,) = plugins.broken("prism_test_boom")
    assert broken.plugin == "boom (prism_test_boom)"
    assert broken.reason == "import failed: RuntimeError: boom: this plugin cannot be imported"
    assert [i.name for i in pc.backends()] == ["numpy"]
    assert pc.backend().name == "numpy"
    ctx = pc.Context()
    x = f32(ctx, [1, 4, 9])
    r = pc.sqrt(x)
    assert pc.compute(r).backend == "numpy"
    np.testing.assert_array_equal(r.numpy(), [1, 2, 3])


def test_plugin_raising_on_import_does_not_break_import_prism_core(plugins):
    plugins.add("prism_test_boom_sub", BOOM, entry="boom")
    code = ("import prism_core as pc; b = pc.broken_plugins(); "
            "print(pc.backend('numpy').name); print(len(b)); print(b[0].reason)")
    paths = [str(plugins.root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop(pc.plugin.registry.ENV_BACKEND, None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["numpy", "1",
                                       "import failed: RuntimeError: boom: this plugin cannot be imported"]


# ---------------------------------------------------------------- (3) malformed plugins and unavailable backends
def test_hook_that_raises(plugins):
    src = backend_source("never", returns='(_ for _ in ()).throw(ValueError("hook exploded"))')
    plugins.add("prism_test_hook_raises", src)
    (broken,) = plugins.broken("prism_test_hook_raises")
    assert broken.reason == "prism_register_backends raised ValueError: hook exploded"
    assert "never" not in [i.name for i in pc.backends()]
    assert pc.backend().name == "numpy"


def test_hook_returning_a_non_list(plugins):
    plugins.add("prism_test_not_list", backend_source("single", returns="B()"))
    (broken,) = plugins.broken("prism_test_not_list")
    assert broken.reason == "prism_register_backends must return a list of Backend instances, returned B"
    assert "single" not in [i.name for i in pc.backends()]


def test_hook_returning_a_non_backend(plugins):
    plugins.add("prism_test_not_backend", backend_source("x", returns='[B(), "not a backend", object()]'))
    reasons = [b.reason for b in plugins.broken("prism_test_not_backend")]
    assert reasons == ["registered str object, which is not a prism_core.Backend",
                       "registered object object, which is not a prism_core.Backend"]
    assert plugins.info("x").available  # the well-formed backend of the same plugin still registers


def test_hook_returning_a_duplicate_name(plugins):
    plugins.add("prism_test_dup", backend_source("dupe", returns="[B(), B()]"))
    (broken,) = plugins.broken("prism_test_dup")
    assert broken.reason == "backend name 'dupe' is already registered by prism_test_dup (prism_test_dup)"
    assert [i.name for i in pc.backends()].count("dupe") == 1


def test_duplicate_name_across_plugins_refuses_both(plugins):
    plugins.add("prism_test_dup_a", backend_source("twin", 3))
    plugins.add("prism_test_dup_b", backend_source("twin", 4))
    broken = plugins.broken("prism_test_dup_")
    assert sorted(b.plugin for b in broken) == ["prism_test_dup_a (prism_test_dup_a)",
                                                "prism_test_dup_b (prism_test_dup_b)"]
    for b in broken:
        assert b.reason == ("backend name 'twin' is claimed by several plugins (prism_test_dup_a (prism_test_dup_a), "
                            "prism_test_dup_b (prism_test_dup_b)); all are refused until one is renamed")
    assert "twin" not in [i.name for i in pc.backends()]
    with pytest.raises(UnknownBackend, match="no backend named 'twin'"):
        pc.backend("twin")


def test_malformed_backend_name_and_priority(plugins):
    src = textwrap.dedent('''
        import prism_core as pc


        class BadName(pc.Backend):
            name = "has space"


        class BadPriority(pc.Backend):
            name = "badprio"
            priority = "high"


        @pc.hookimpl
        def prism_register_backends():
            return [BadName(), BadPriority()]
        ''')
    plugins.add("prism_test_malformed", src)
    reasons = sorted(b.reason for b in plugins.broken("prism_test_malformed"))
    assert reasons == ["backend 'badprio': priority must be an int, got 'high'",
                       "backend name must be an identifier-like str, got 'has space'"]
    assert {i.name for i in pc.backends()} == {"numpy"}


def test_backend_with_another_interface_version_is_unavailable(plugins):
    plugins.add("prism_test_iface", backend_source("future", 99, extra="interface_version = 999"))
    info = plugins.info("future")
    assert not info.available
    assert "interface" in info.reason and "999" in info.reason
    assert info.reason == f"built for plugin interface 999, this Prism has {pc.INTERFACE_VERSION}"
    with pytest.raises(BackendUnavailable, match=r"backend 'future' is unavailable: built for plugin interface 999"):
        pc.backend("future")
    assert pc.backend().name == "numpy"  # priority 99 but unavailable: not the default


def test_unavailable_backend_lists_its_reason(plugins):
    extra = '''
        def availability(self):
            return False, "no compiler"
        '''
    plugins.add("prism_test_nocc", backend_source("needscc", 50, extra=extra))
    info = plugins.info("needscc")
    assert (info.available, info.reason) == (False, "no compiler")
    assert pc.broken_plugins() == []  # unavailable is not broken
    with pytest.raises(BackendUnavailable, match=r"^backend 'needscc' is unavailable: no compiler$"):
        pc.backend("needscc")
    assert pc.backend().name == "numpy"


def test_availability_that_raises_is_unavailable(plugins):
    extra = '''
        def availability(self):
            raise OSError("driver missing")
        '''
    plugins.add("prism_test_avail_raises", backend_source("flaky", extra=extra))
    info = plugins.info("flaky")
    assert not info.available
    assert info.reason == "availability check raised OSError: driver missing"


# ---------------------------------------------------------------- (4) PRISM_BACKEND and (5) the default pick
def test_env_var_selects_the_backend(plugins, monkeypatch):
    plugins.add("prism_test_env", ADDONLY, entry="addonly")
    assert pc.backend().name == "numpy"
    monkeypatch.setenv("PRISM_BACKEND", "addonly")
    assert pc.backend().name == "addonly"
    ctx = pc.Context()
    x = f32(ctx, [1, 2])
    r = pc.add(x, x)
    report = pc.compute(r)
    assert report.backend == "addonly" and report.fallbacks == []
    assert pc.backend("numpy").name == "numpy"  # an explicit name wins over the variable
    monkeypatch.setenv("PRISM_BACKEND", "nope")
    with pytest.raises(UnknownBackend, match=r"no backend named 'nope'; registered: numpy, addonly"):
        pc.backend()
    monkeypatch.setenv("PRISM_BACKEND", "")  # empty: as if unset
    assert pc.backend().name == "numpy"


def test_env_var_naming_an_unavailable_backend(plugins, monkeypatch):
    extra = '''
        def availability(self):
            return False, "no compiler"
        '''
    plugins.add("prism_test_env_nocc", backend_source("needscc2", extra=extra))
    monkeypatch.setenv("PRISM_BACKEND", "needscc2")
    with pytest.raises(BackendUnavailable, match="no compiler"):
        pc.backend()


def test_default_is_the_highest_priority_available_backend(plugins):
    low, high = (_inproc_module(f"prism_test_prio_{n}", n, p) for n, p in (("low", 1), ("high", 20)))
    top = _inproc_module("prism_test_prio_top", "top", 30, unavailable="no device")
    for m in (low, high, top):
        pc.REGISTRY.register(m)
    try:
        assert [i.name for i in pc.backends()] == ["top", "high", "numpy", "low"]
        assert pc.backend().name == "high"  # "top" ranks first but is unavailable
        assert pc.REGISTRY.reference().name == "numpy"  # the reference is found by flag, not by rank
    finally:
        for m in (low, high, top):
            pc.REGISTRY.unregister(m.__name__)


def test_an_installed_third_party_backend_is_the_default_only_when_named(plugins, monkeypatch):
    plugins.add("prism_test_prio_installed", backend_source("installed", 90))
    assert [i.name for i in pc.backends()][:2] == ["installed", "numpy"]  # ranked first when listed
    assert plugins.info("installed").available and plugins.info("installed").installed
    assert pc.backend().name == "numpy"  # but the default is chosen among the built-ins (and in-process plugins)
    assert [i.name for i in pc.REGISTRY.candidates()] == ["numpy"]
    monkeypatch.setenv("PRISM_BACKEND", "installed")
    assert pc.backend().name == "installed"  # named, it is used
    monkeypatch.delenv("PRISM_BACKEND")
    with pc.using_backend("installed"):
        assert pc.backend().name == "installed"


def test_equal_priorities_break_ties_by_name(plugins):
    plugins.add("prism_test_tie_b", backend_source("beta", 40))
    plugins.add("prism_test_tie_a", backend_source("alpha", 40))
    assert [i.name for i in pc.backends()][:2] == ["alpha", "beta"]
    mods = [_inproc_module(f"prism_test_tie_{n}", n, 40) for n in ("delta", "gamma")]
    for m in mods:
        pc.REGISTRY.register(m)
    try:
        assert pc.backend().name == "delta"
    finally:
        for m in mods:
            pc.REGISTRY.unregister(m.__name__)


# ---------------------------------------------------------------- in-process registration
def _inproc_module(name: str, backend_name: str, priority: int = 15, unavailable: str = "") -> types.ModuleType:
    mod = types.ModuleType(name)

    class InProc(pc.Backend):
        def availability(self):
            return not unavailable, unavailable

    InProc.name = backend_name
    InProc.priority = priority

    @pc.hookimpl
    def prism_register_backends():
        return [InProc()]

    mod.prism_register_backends = prism_register_backends
    return mod


def test_in_process_register_and_unregister(plugins):
    mod = _inproc_module("prism_test_inproc", "inproc")
    assert "inproc" not in [i.name for i in pc.backends()]
    pc.REGISTRY.register(mod)
    try:
        info = plugins.info("inproc")
        assert info.available and info.plugin == "prism_test_inproc"
        assert pc.backend().name == "inproc"  # priority 15 beats numpy's 10
        assert pc.backend("numpy").name == "numpy"
        pc.REGISTRY.reset()  # a reset rediscovers, and keeps in-process plugins
        assert "inproc" in [i.name for i in pc.backends()]
    finally:
        pc.REGISTRY.unregister("prism_test_inproc")
    assert "inproc" not in [i.name for i in pc.backends()]
    assert pc.backend().name == "numpy"
    with pytest.raises(UnknownBackend, match="no backend named 'inproc'"):
        pc.backend("inproc")


def test_in_process_register_with_explicit_name_and_object(plugins):
    class Holder:
        @pc.hookimpl
        def prism_register_backends(self):
            class Obj(pc.Backend):
                name = "objbackend"
            return [Obj()]

    pc.REGISTRY.register(Holder(), name="holder")
    try:
        assert plugins.info("objbackend").plugin == "holder"
    finally:
        pc.REGISTRY.unregister("holder")
    assert "objbackend" not in [i.name for i in pc.backends()]


def test_in_process_plugin_alongside_entry_points(plugins):
    plugins.add("prism_test_mix", ADDONLY, entry="addonly")
    pc.REGISTRY.register(_inproc_module("prism_test_inproc2", "inproc2", priority=1))
    try:
        assert {"numpy", "addonly", "inproc2"} <= {i.name for i in pc.backends()}
    finally:
        pc.REGISTRY.unregister("prism_test_inproc2")
    assert {i.name for i in pc.backends()} == {"numpy", "addonly"}


def test_in_process_broken_hook_is_recorded(plugins):
    mod = types.ModuleType("prism_test_inproc_broken")

    @pc.hookimpl
    def prism_register_backends():
        raise KeyError("missing config")

    mod.prism_register_backends = prism_register_backends
    pc.REGISTRY.register(mod)
    try:
        (broken,) = plugins.broken("prism_test_inproc_broken")
        assert broken.reason == "prism_register_backends raised KeyError: 'missing config'"
        assert pc.backend().name == "numpy"
    finally:
        pc.REGISTRY.unregister("prism_test_inproc_broken")
    assert plugins.broken("prism_test_inproc_broken") == []


def test_normal_registry_after_reset():
    """Outside the fixture the registry holds only the installed backends."""
    pc.REGISTRY.reset()
    assert "numpy" in [i.name for i in pc.backends()]
    assert pc.REGISTRY.reference().name == "numpy"


# ---------------------------------------------------------------- the reference cannot be replaced
IMPOSTOR = '''
import prism_core as pc


def _sub(node):  # "ADD" that subtracts: a result no one must ever certify against
    node.host()[...] = node.src[0].host() - node.src[1].host()


class Impostor(pc.Backend):
    name = {name!r}
    priority = 1000
    is_reference = {ref!r}
    kernels = {{"ADD": _sub}}


@pc.hookimpl
def prism_register_backends():
    return [Impostor()]
'''


def _assert_real_reference():
    ref = pc.REGISTRY.reference()
    assert type(ref).__module__ == "prism_numpy" and pc.backend("numpy") is ref
    ctx = pc.Context()
    a, b = f32(ctx, [1, 2]), f32(ctx, [10, 20])
    s = pc.add(a, b)
    assert pc.compute(s, "numpy").backend == "numpy"
    np.testing.assert_array_equal(s.numpy(), [11, 22])


@pytest.mark.parametrize("order", ["found", "reversed"])
@pytest.mark.parametrize("dist", ["numpy-impostor", "prism-tensor"])
def test_a_third_party_numpy_backend_is_refused_whatever_the_order(plugins, monkeypatch, order, dist):
    # tmp_path is first on sys.path; "prism-tensor": the impostor even takes this distribution's name
    plugins.add("prism_test_impostor", IMPOSTOR.format(name="numpy", ref=True), entry="numpy", dist=dist)
    if order == "reversed":
        found = pc.plugin.registry.entry_points
        monkeypatch.setattr(pc.plugin.registry, "entry_points", lambda **kw: list(reversed(found(**kw))))
    (broken,) = plugins.broken("prism_test_impostor")
    assert broken.reason == ("backend name 'numpy' is reserved for the reference backend shipped with "
                             "prism-tensor; refused")
    assert [i.name for i in pc.backends()] == ["numpy"]
    _assert_real_reference()
    assert pc.backend().name == "numpy"  # priority 1000 did not make it the default either


def test_prism_info_lists_the_impostor_as_broken(plugins, capsys):
    from prism_core.cli import main as cli
    plugins.add("prism_test_impostor_info", IMPOSTOR.format(name="numpy", ref=True), entry="numpy")
    assert cli(["info"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("numpy ") and "priority=" in ln]
    assert "[reference," in line and line.rstrip().endswith("from numpy (prism_numpy)")
    assert ("broken plugins (1), skipped:\n  numpy (prism_test_impostor_info): backend name 'numpy' is reserved "
            "for the reference backend shipped with prism-tensor; refused") in out


def test_a_third_party_claiming_to_be_the_reference_is_refused(plugins):
    plugins.add("prism_test_claims_ref", IMPOSTOR.format(name="truth", ref=True))
    (broken,) = plugins.broken("prism_test_claims_ref")
    assert broken.reason == ("backend 'truth' claims to be the reference (is_reference=True), which is for the "
                             "reference backend shipped with prism-tensor; refused")
    assert "truth" not in [i.name for i in pc.backends()]
    _assert_real_reference()


def test_a_built_in_name_stays_the_built_in(plugins):
    plugins.modules.append("prism_numba")  # make the built-in numba entry point visible to this test
    plugins.add("prism_test_fake_numba", IMPOSTOR.format(name="numba", ref=False), entry="numba")
    (broken,) = plugins.broken("prism_test_fake_numba")
    assert broken.reason == "backend name 'numba' is already registered by numba (prism_numba), prism-tensor's own"
    info = plugins.info("numba")
    assert type(info.backend).__module__ == "prism_numba" and info.plugin == "numba (prism_numba)"


# ---------------------------------------------------------------- hook implementations are validated
@pytest.mark.parametrize("source, reason", [
    ("import prism_core as pc\nVERSION = 1\n",
     "implements no hook of the prism interface (expected prism_register_backends)"),
    ("import prism_core as pc\n\n\ndef prism_register_backend():\n    return []\n",
     "implements no hook of the prism interface (expected prism_register_backends); "
     "'prism_register_backend' looks like a misspelling"),
    ("import prism_core as pc\n\n\ndef prism_register_backends():\n    return []\n",
     "prism_register_backends is not marked with @prism_core.hookimpl"),
    ("import prism_core as pc\n\n\n@pc.hookimpl\ndef prism_registre_backends():\n    return []\n",
     "implements 'prism_registre_backends', which is no hook of the prism interface "
     "(hooks: prism_register_backends)"),
], ids=["no-hook", "misspelled-unmarked", "unmarked", "misspelled-marked"])
def test_a_plugin_without_a_valid_hook_is_listed_as_broken(plugins, source, reason):
    plugins.add("prism_test_nohook", source)
    (broken,) = plugins.broken("prism_test_nohook")
    assert broken.reason == reason
    assert [i.name for i in pc.backends()] == ["numpy"]


# ---------------------------------------------------------------- availability is asked lazily
LAZY = '''
import prism_core as pc

ASKED = []


def _make(n, p):
    class B(pc.Backend):
        name = n
        priority = p

        def availability(self):
            ASKED.append(self.name)
            return True, ""
    return B()


@pc.hookimpl
def prism_register_backends():
    return [_make("lazy_low", 1), _make("lazy_high", 90)]
'''


def test_selecting_one_backend_asks_only_that_one_and_caches(plugins):
    plugins.add("prism_test_lazy", LAZY)
    assert pc.REGISTRY.names() == ["lazy_high", "numpy", "lazy_low"]
    asked = sys.modules["prism_test_lazy"].ASKED
    assert asked == []  # discovery alone asks no one
    assert pc.backend("numpy").name == "numpy" and pc.REGISTRY.reference().name == "numpy"
    assert asked == []
    assert pc.backend("lazy_low").name == "lazy_low"
    assert pc.backend("lazy_low").name == "lazy_low"
    assert asked == ["lazy_low"]  # once, then cached
    assert pc.backend().name == "numpy"  # the default asks no installed third party's backend
    assert asked == ["lazy_low"]
    pc.backends()  # listing everything asks the rest, each once
    assert asked == ["lazy_low", "lazy_high"]
    pc.REGISTRY.reset()  # a reset forgets the cache
    plugins.info("lazy_low")
    assert asked[-1] == "lazy_low"


# ---------------------------------------------------------------- third-party plugins are kept at arm's length
def _own_entry_points() -> set[str]:
    """The prism.backends entry points this distribution declares, read from its pyproject.toml."""
    import tomllib
    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return set(project["entry-points"][pc.plugin.registry.ENTRY_POINT_GROUP])


def test_the_built_ins_are_this_distributions_entry_points_ggml_included():
    from prism_core.plugin.registry import ENTRY_POINT_GROUP, entry_points, is_built_in
    own = _own_entry_points()
    assert "ggml" in own  # prism_ggml lives in backends/ and is ours, registered like a third party's
    assert {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if is_built_in(ep)} == own


@pytest.mark.parametrize("dist", ["numpy-impostor", "prism-tensor"])
def test_selecting_a_built_in_imports_no_third_party_plugin(plugins, dist):
    plugins.add("prism_test_untouched", IMPOSTOR.format(name="numpy", ref=True), entry="numpy", dist=dist)
    plugins.add("prism_test_untouched2", ADDONLY, entry="addonly")
    (ep,) = [ep for ep in pc.plugin.registry.entry_points(group="prism.backends") if ep.value == "prism_test_untouched"]
    assert not pc.plugin.registry.is_built_in(ep)  # a distribution taking our name is still a third party
    assert pc.backend("numpy").name == "numpy" and pc.REGISTRY.reference().name == "numpy"
    assert pc.backend().name == "numpy"  # the default too
    assert "prism_test_untouched" not in sys.modules and "prism_test_untouched2" not in sys.modules
    assert pc.backend("addonly").name == "addonly"  # naming a third party's backend loads the plugins
    assert "prism_test_untouched2" in sys.modules


def test_system_exit_from_a_hook_or_availability_is_the_plugins_fault(plugins):
    plugins.add("prism_test_hook_exits", backend_source("never2", returns="exit(3)"))
    plugins.add("prism_test_avail_exits", backend_source("exits_on_ask", extra='''
        def availability(self):
            raise SystemExit(4)
        '''))
    (broken,) = plugins.broken("prism_test_hook_exits")
    assert broken.reason == "prism_register_backends raised SystemExit: 3"
    info = plugins.info("exits_on_ask")
    assert (info.available, info.reason) == (False, "availability check raised SystemExit: 4")
    with pytest.raises(BackendUnavailable, match="availability check raised SystemExit: 4"):
        pc.backend("exits_on_ask")


@pytest.mark.parametrize("raised, caught", [("SystemExit(3)", True), ("GeneratorExit()", True),
                                            ("KeyboardInterrupt()", False)])
def test_an_import_raising_any_base_exception_but_ctrl_c_is_a_broken_plugin(plugins, monkeypatch, raised, caught):
    # in-process (as in a probe process, where the import runs in-process): no probe in between
    monkeypatch.setattr(pc.REGISTRY, "sandboxed", True)
    plugins.add("prism_test_raises_base", f"raise {raised}\n", entry="base")
    if not caught:
        with pytest.raises(KeyboardInterrupt):
            pc.backends()
        return
    (broken,) = plugins.broken("prism_test_raises_base")
    assert broken.reason == f"import failed: {raised.split('(')[0]}: {'3' if 'SystemExit' in raised else ''}"
    assert pc.backend().name == "numpy"


def test_an_import_raising_system_exit_is_reported_by_the_probe(plugins):
    where = plugins.root / "imported_by"
    plugins.add("prism_test_probe_exits", f"import os\nopen({str(where)!r}, 'a').write(f'{{os.getpid()}} ')\n"
                                          "raise SystemExit(3)\n", entry="probed")
    (broken,) = plugins.broken("prism_test_probe_exits")
    assert broken.reason == "import failed: SystemExit: 3"
    pids = [int(p) for p in where.read_text().split()]
    assert len(pids) == 1 and pids[0] != os.getpid()  # found out in the probe process, never tried here


TWO_BACKENDS = '''
import time
import prism_core as pc


class Hangs(pc.Backend):
    name = "asks_forever"

    def availability(self):
        time.sleep(600)  # far past the probe's limit: a hang, whatever the machine's speed
        return True, ""


class Fine(pc.Backend):
    name = "asks_fine"


@pc.hookimpl
def prism_register_backends():
    return [Hangs(), Fine()]
'''


def test_an_availability_that_hangs_in_the_probe_leaves_the_plugins_other_backends(plugins, monkeypatch):
    monkeypatch.setenv("PRISM_PLUGIN_TIMEOUT", "10")  # generous for a healthy step, which takes milliseconds
    plugins.add("prism_test_two_backends", TWO_BACKENDS)
    hung = plugins.info("asks_forever")  # never asked here: this would not return for 600 s
    assert not hung.available
    assert hung.reason.startswith("availability() TIMEOUT: did not finish within 10 s; it hung at ")
    assert "prism_test_two_backends.py" in hung.reason
    assert plugins.info("asks_fine").available and pc.backend("asks_fine").name == "asks_fine"
    with pytest.raises(BackendUnavailable, match=r"^backend 'asks_forever' is unavailable: availability\(\) TIMEOUT"):
        pc.backend("asks_forever")
    assert plugins.broken("prism_test_two_backends") == []  # unavailable, not broken
