"""Plugins that die at import cannot take Prism down.

Six third-party distributions are installed into a folder on ``PYTHONPATH`` (as pip would
install them) beside the built-in backends:

* ``segv``: kills its process with SIGSEGV at import;
* ``hang``: sleeps at import far longer than the probe's time limit (a hang, told apart from
  a slow import by the limit alone: the healthy plugins here import in milliseconds, and the
  limit is 20 s);
* ``exits``: raises ``SystemExit(3)`` at import;
* ``hookcrash``: imports cleanly, but its hook kills its process with SIGSEGV;
* ``badavail``: imports cleanly, but its backend's ``availability()`` reads address 0;
* ``goodplug``: a healthy backend computing ADD on F32.

Each writes "<module> <pid>" to ``$PRISM_TEST_IMPORT_LOG`` before doing anything else, so a
test sees which process imported which plugin, and how often. Every command must still work:
those that name a built-in (or choose the default) import no plugin at all; ``prism info`` and
``prism conformance`` probe them in a child process and report each fault.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from finetune_models import write_tiny
from helpers import default_sigint, write_plugin

import prism_core as pc
from prism_core.conformance import cases_for

TIMEOUT = 20  # PRISM_PLUGIN_TIMEOUT: far above a healthy plugin's import, far below the hang

LOG = textwrap.dedent('''
    import os
    with open(os.environ["PRISM_TEST_IMPORT_LOG"], "a") as _log:
        _log.write(f"{__name__} {os.getpid()}\\n")
    ''')

BACKEND = textwrap.dedent('''
    import numpy as np
    import prism_core as pc


    def _add(node):  # through the public value API; float32 as the reference rounds an F32 sum
        a, b = (s.numpy().reshape(tuple(reversed(s.ne))) for s in node.src[:2])
        node.set(a + np.tile(b, tuple(x // y for x, y in zip(a.shape, b.shape))))


    class Plugged(pc.Backend):
        name = {name!r}
        priority = 99  # above every built-in: still not the default, since it is not named
        kernels = {{"ADD": _add}}

        def supports(self, node):
            return super().supports(node) and all(t.type == pc.F32 for t in (node, *node.src))
    {extra}

    @pc.hookimpl
    def prism_register_backends():
        return [Plugged()]
    ''')

SEGV_AVAILABILITY = '''
    def availability(self):
        import ctypes
        ctypes.string_at(0)
'''

PLUGINS = {  # module -> source
    "prism_test_segv": LOG + "import signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    "prism_test_hang": LOG + "import time\ntime.sleep(600)\n",
    "prism_test_exits": LOG + "raise SystemExit(3)\n",
    "prism_test_hookcrash": LOG + textwrap.dedent('''
        import signal
        import prism_core as pc


        @pc.hookimpl
        def prism_register_backends():
            os.kill(os.getpid(), signal.SIGSEGV)
        '''),
    "prism_test_badavail": LOG + BACKEND.format(name="badavail",
                                                extra=textwrap.indent(textwrap.dedent(SEGV_AVAILABILITY), "    ")),
    "prism_test_good": LOG + BACKEND.format(name="goodplug", extra=""),
}
FAULTY = ("prism_test_segv", "prism_test_hang", "prism_test_exits", "prism_test_hookcrash")
BUILT_IN = ("numpy", "numba", "csimd", "ggml")  # prism-tensor's own entry points (pyproject.toml)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    for module, source in PLUGINS.items():
        write_plugin(root, module, source, entry=module.removeprefix("prism_test_"))
    return root


def plugged_env(site: Path, folder: Path) -> dict[str, str]:
    """The environment of a command with the six plugins installed, its import log in folder."""
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))]), "PRISM_TEST_IMPORT_LOG": str(folder / "imports.log"),
        "PRISM_PLUGIN_TIMEOUT": str(TIMEOUT)}
    e.pop(pc.plugin.registry.ENV_BACKEND, None)
    return e


@pytest.fixture
def env(site, tmp_path) -> dict[str, str]:
    return plugged_env(site, tmp_path)


def imports(env) -> list[tuple[str, int]]:
    """(module, pid) for every import of a test plugin so far, in order."""
    log = Path(env["PRISM_TEST_IMPORT_LOG"])
    return [(m, int(p)) for m, p in (ln.split() for ln in log.read_text().splitlines())] if log.exists() else []


CLI = "from prism_core.cli import main; raise SystemExit(main(sys.argv[1:]))"


def prism(env, *argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, int]:
    """``python -m prism_core.cli ARGV`` and the pid it ran under."""
    return python(env, CLI, *argv, timeout=timeout)


def python(env, code: str, *argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, int]:
    return finish(start(env, code, *argv), timeout)


def start(env, code: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys\n" + code, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(p: subprocess.Popen, timeout: float = 600) -> tuple[subprocess.CompletedProcess, int]:
    """The finished process p (its output, exit status) and its pid."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"hung: {out[-2000:]}\n{err[-2000:]}") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid


@pytest.fixture(scope="module")
def probing(site, tmp_path_factory) -> dict[str, tuple[dict[str, str], subprocess.Popen]]:
    """The three commands below that probe the plugins, each with its own import log: each waits out the
    hanging plugin's time limit (TIMEOUT s, asleep), so they start together and each test checks its own."""
    commands = {"info": (CLI, "info"), "named": (NAMED,),
                "conformance": (CLI, "conformance", "--backend", "numpy", "--backend", "goodplug", "-q", "--op", "ADD")}
    started = {}
    for name, (code, *argv) in commands.items():
        e = plugged_env(site, tmp_path_factory.mktemp(f"probing-{name}"))
        started[name] = (e, start(e, code, *argv))
    yield started
    for _, p in started.values():
        if p.poll() is None:  # a test failed before waiting for it
            p.kill()
            p.communicate()


def installed_built_ins() -> list[str]:
    """The built-in backends available here (csimd needs a compiler, ggml ggml-python)."""
    return [i.name for i in pc.backends() if i.name in BUILT_IN and i.available]


def assert_faults_reported(out: str) -> None:
    """The four plugins that die at import or in their hook are listed as broken, each with what happened."""
    broken = out.split("broken plugins (4), skipped:\n", 1)[1].splitlines()[:4]
    by = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in broken}
    assert by["segv (prism_test_segv)"].startswith(
        "CRASHED while importing it: the probe process was killed by SIGSEGV at "), by
    assert "prism_test_segv.py" in by["segv (prism_test_segv)"]  # faulthandler's innermost frame
    assert by["hang (prism_test_hang)"].startswith(
        f"TIMEOUT while importing it: did not finish within {TIMEOUT} s; it hung at "), by
    assert "prism_test_hang.py" in by["hang (prism_test_hang)"]
    assert by["exits (prism_test_exits)"] == "import failed: SystemExit: 3", by
    assert by["hookcrash (prism_test_hookcrash)"].startswith(
        "CRASHED in prism_register_backends: the probe process was killed by SIGSEGV at "), by
    assert "prism_test_hookcrash.py" in by["hookcrash (prism_test_hookcrash)"]


def assert_probed_once_and_imported_only_healthy(env, pid: int) -> None:
    """Each faulty plugin was tried exactly once, in a probe process, never in ``pid``; the
    healthy ones were imported in ``pid`` once their probe passed."""
    log = imports(env)
    for module in FAULTY:
        tries = [p for m, p in log if m == module]
        assert len(tries) == 1 and tries[0] != pid, (module, log)
    assert {m for m, p in log if p == pid} == {"prism_test_good", "prism_test_badavail"}, log


# ---------------------------------------------------------------- listing: prism info
@pytest.mark.slow  # waits out the hanging plugin's probe (the three such commands at once: probing)
def test_prism_info_reports_each_fault_and_lists_the_rest(probing):
    env, started = probing["info"]
    r, pid = finish(started)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and "priority=" in ln}
    for name in installed_built_ins():
        assert " available " in rows[name], rows[name]
    assert " available " in rows["goodplug"] and "from good (prism_test_good)" in rows["goodplug"]
    assert "UNAVAILABLE: availability() CRASHED: the probe process was killed by SIGSEGV at " in rows["badavail"]
    assert_faults_reported(out)
    default = pc.backend().name  # this process: no plugin installed
    assert (f"default (no backend named): {default}; installed third-party backends are used only when named "
            "(badavail, goodplug)") in out
    assert_probed_once_and_imported_only_healthy(env, pid)
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- a built-in or the default: no plugin imported
def test_conformance_on_a_built_in_imports_no_plugin(env):
    r, _ = prism(env, "conformance", "--backend", "numpy", "-q", "--op", "ADD")
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(cases_for("ADD"))
    assert f"numpy: {n} passed, 0 failed" in r.stdout and "certified: " in r.stdout
    assert imports(env) == []  # neither this process nor its worker imported a plugin, nor probed one


COMPUTE = textwrap.dedent('''
    import json
    import numpy as np
    import prism_core as pc
    ctx = pc.Context()
    x = ctx.from_numpy(np.array([1, 2, 3], np.float32))
    r = pc.add(x, x)
    report = pc.compute(r, None if sys.argv[1] == "default" else sys.argv[1])
    print(json.dumps({"used": report.backend, "values": r.numpy().tolist(), "default": pc.backend().name}))
    ''')


@pytest.mark.parametrize("how", ["default", "named", "env"])
def test_a_compute_on_a_built_in_imports_no_plugin(env, how):
    names = installed_built_ins()
    e = {**env, "PRISM_BACKEND": names[-1]} if how == "env" else env
    argv = names if how == "named" else ["default"]
    for name in argv:
        r, _ = python(e, COMPUTE, name)
        assert r.returncode == 0, r.stdout + r.stderr
        got = json.loads(r.stdout)
        default = names[-1] if how == "env" else pc.backend().name  # here, with no plugin installed
        assert got == {"used": name if how == "named" else default, "values": [2.0, 4.0, 6.0], "default": default}
    assert imports(env) == []


LOAD = textwrap.dedent('''
    import json
    from prism_core import models
    m = models.load(sys.argv[1], backend=sys.argv[2])
    print(json.dumps(m.logits([1, 5, 6, 7]).tolist()))
    ''')


def test_models_load_on_a_built_in_imports_no_plugin(env, tmp_path):
    path = write_tiny(tmp_path / "tiny.gguf")
    backend = "csimd" if "csimd" in installed_built_ins() else "numpy"
    r, _ = python(env, LOAD, str(path), backend)
    assert r.returncode == 0, r.stdout + r.stderr
    from prism_core import models
    expected = models.load(str(path), backend=backend).logits([1, 5, 6, 7])  # here, no plugin installed
    np.testing.assert_allclose(json.loads(r.stdout), expected, rtol=1e-5, atol=1e-5)
    assert imports(env) == []


# ---------------------------------------------------------------- naming a third party's backend
NAMED = textwrap.dedent('''
    import numpy as np
    import prism_core as pc
    ctx = pc.Context()
    x = ctx.from_numpy(np.array([1, 2, 3], np.float32))
    r = pc.add(x, x)
    print(pc.compute(r, "goodplug").backend, r.numpy().tolist())
    try:
        pc.backend("badavail")
    except pc.BackendUnavailable as e:
        print("refused:", e)
    try:
        pc.backend("segv")  # the broken plugin's name: unknown, and the message says which plugins broke
    except pc.UnknownBackend as e:
        print("unknown:", e)
    print("default:", pc.backend().name)
    ''')


@pytest.mark.slow  # waits out the hanging plugin's probe (the three such commands at once: probing)
def test_naming_a_healthy_third_party_backend_imports_only_what_its_probe_passed(probing):
    env, started = probing["named"]
    r, pid = finish(started)
    assert r.returncode == 0, r.stdout + r.stderr
    used, refused, unknown, default = r.stdout.splitlines()
    assert used == "goodplug [2.0, 4.0, 6.0]"
    assert unknown.startswith("unknown: no backend named 'segv'; registered: ")
    assert ("; broken plugin segv (prism_test_segv): CRASHED while importing it: the probe process was killed by "
            "SIGSEGV at ") in unknown
    assert "; broken plugin exits (prism_test_exits): import failed: SystemExit: 3" in unknown
    assert refused.startswith("refused: backend 'badavail' is unavailable: availability() CRASHED: the probe "
                              "process was killed by SIGSEGV at ")
    assert default == f"default: {pc.backend().name}"
    assert_probed_once_and_imported_only_healthy(env, pid)


@pytest.mark.slow  # waits out the hanging plugin's probe (the three such commands at once: probing)
def test_conformance_on_a_third_party_backend_reports_the_faults(probing):
    env, started = probing["conformance"]
    r, _ = finish(started)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_faults_reported(r.stdout)
    assert "certified: " in r.stdout.split("(numpy)")[0] and r.stdout.rstrip().endswith("(goodplug)")
    assert "NOT certified" not in r.stdout
    # one probe, in this process: the worker of goodplug adopted it instead of probing again
    for module in FAULTY:
        assert [m for m, _ in imports(env)].count(module) == 1, imports(env)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="checks through /proc that the probe is gone")
def test_ctrl_c_while_a_probe_hangs_ends_the_command_and_the_probe(env):
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-m", "prism_core.cli", "info"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**env, "PRISM_PLUGIN_TIMEOUT": "3600"},
                         preexec_fn=default_sigint)
    hung = []
    for _ in range(3000):  # until the hanging plugin has started its import, in the probe process
        hung = [pid for m, pid in imports(env) if m == "prism_test_hang"]
        if hung or p.poll() is not None:
            break
        time.sleep(0.1)
    assert hung and p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130 and "prism: interrupted" in err and "Traceback" not in err, out + err
    assert not Path(f"/proc/{hung[0]}").exists()  # the probe process was killed and reaped, not left behind
