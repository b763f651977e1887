"""Crash-proof conformance: backends that kill or freeze their process, installed beside the built-ins.

Three third-party distributions are installed into a folder on ``PYTHONPATH`` (as pip would
install them), each a backend whose ADD kernel ends its process in a way no thread can
contain, and whose MUL kernel is correct:

* ``segv``: reads address 0 (SIGSEGV);
* ``gilhang``: sleeps in C while holding the GIL (``ctypes.PyDLL``: no thread of the process
  runs meanwhile, the watchdog of an in-process timeout included);
* ``exits``: ``os._exit(3)``, as native code calling ``exit()`` would.

``prism conformance --backend all`` must still print and report every built-in backend's
results exactly as a clean run does, report each fault on its first ADD case (with the
signal, or the exit status, and where), run MUL on each faulty backend in a new worker, and
end in about one timeout for the hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import default_sigint, reads_block_types, write_plugin

import prism_core as pc
from prism_core.conformance import cases_for

FAULTY = textwrap.dedent('''
    import ctypes
    import os

    import numpy as np
    import prism_core as pc

    _HOLDING_THE_GIL = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call


    def _segv(node):
        ctypes.string_at(0)


    def _gilhang(node):
        _HOLDING_THE_GIL.sleep(3600)


    def _exits(node):
        os._exit(3)


    def _mul(node):  # through the public value API: numpy() and set() convert bf16/f16
        a, b = (s.numpy().reshape(tuple(reversed(s.ne))) for s in node.src[:2])
        node.set(a * np.tile(b, tuple(x // y for x, y in zip(a.shape, b.shape))))


    class Faulty(pc.Backend):
        name = {name!r}
        version = "fault"
        kernels = {{"ADD": _{name}, "MUL": _mul}}


    @pc.hookimpl
    def prism_register_backends():
        return [Faulty()]
    ''')

FAULTS = {  # backend -> what its first ADD case reports
    "segv": ("crashed", "the worker process was killed by SIGSEGV"),
    "gilhang": ("timeout", "did not finish within 4 s; it hung at "),
    "exits": ("crashed", "the worker process exited with status 3"),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    for name in FAULTS:
        write_plugin(root, f"prism_test_{name}", FAULTY.format(name=name), entry=name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))])}
    env.pop(pc.plugin.registry.ENV_BACKEND, None)
    return root, env


def _counts() -> tuple[int, int, int, int]:
    """ADD and MUL case counts, all and without block (quantized) types, which the faulty
    backends do not claim."""
    add, mul = cases_for("ADD"), cases_for("MUL")
    return (len(add), sum(not reads_block_types(c) for c in add),
            len(mul), sum(not reads_block_types(c) for c in mul))


def _conformance(env, tmp_path, *args, timeout=600):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "prism_core.cli", "conformance", "--op", "ADD", "--op", "MUL",
                        "--report", "json", str(report), "--report", "markdown", str(tmp_path / "r.md"), *args],
                       capture_output=True, text=True, env=env, timeout=timeout)
    return r, json.loads(report.read_text()) if report.exists() else None


def test_the_faulty_plugin_really_holds_the_gil():
    """The premise of the hang case: during a PyDLL call no other thread runs (a CDLL call,
    which releases the GIL, lets one run)."""
    code = textwrap.dedent('''
        import ctypes, threading, time
        ticks = [0]
        def tick():
            while True:
                ticks[0] += 1
                time.sleep(0.001)
        threading.Thread(target=tick, daemon=True).start()
        time.sleep(0.2)
        for lib in (ctypes.PyDLL(None), ctypes.CDLL(None)):
            before = ticks[0]
            lib.usleep(500000)
            print(ticks[0] - before)
        ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    held, released = (int(x) for x in r.stdout.split())
    assert held <= 1 and released > 20, r.stdout


@pytest.mark.slow
def test_conformance_all_survives_segfault_gil_hang_and_exit(installed, tmp_path):
    root, env = installed
    clean_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    clean_env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    real = [i.name for i in pc.backends() if i.available]
    r, clean = _conformance(clean_env, tmp_path, "--backend", "all")  # also warms numba's on-disk cache
    assert r.returncode in (0, 1) and clean is not None, r.stdout + r.stderr

    # only the hanging backend gets a short limit: a built-in's case, slow on a busy machine, must not race it
    r, rep = _conformance(env, tmp_path, "--backend", "all", "--timeout", "gilhang=4")
    out = r.stdout
    assert r.returncode == 1, out + r.stderr  # failures, not a crash of the run (which would be < 0)
    header = next(ln for ln in out.splitlines() if ln.startswith("op ")).split()  # after the streamed rows
    assert header[0] == "op" and set(header[1:]) == set(real) | set(FAULTS)  # every backend has a column
    by = {b["name"]: b for b in rep["backends"]}
    assert set(by) == set(real) | set(FAULTS) and rep["complete"] is True
    for name in real:  # the built-ins' results are exactly those of the clean run
        (before,) = [b for b in clean["backends"] if b["name"] == name]
        assert by[name]["ops"] == before["ops"] and by[name]["failures"] == before["failures"], name
        assert f"{name}: {before['summary']['passed']} passed, {before['summary']['failed']} failed" in out
    n_add, n_plain, n_mul, n_mul_plain = _counts()
    n_unsup = n_add - n_plain + n_mul - n_mul_plain
    for name, (status, expect) in FAULTS.items():
        b = by[name]
        first, *rest = b["failures"]
        assert first["op"] == "ADD" and first["status"] == status and expect in first["message"], first
        assert len(rest) == n_plain - 1 and all(f["message"].startswith("not run: an earlier case of ADD")
                                                for f in rest), name
        assert b["summary"][status] == n_plain, name
        assert b["ops"]["MUL"]["status"] in ("ok", "partial"), name  # a new worker ran it
        assert b["ops"]["MUL"]["passed"] == n_mul_plain, name
        assert f"{first['name']} on {name}: {status.upper()}" in out
        assert "nb=" in first["detail"], name  # the case's tensors, though the worker never answered
    assert "prism_test_segv.py" in by["segv"]["failures"][0]["message"] or \
        "string_at" in by["segv"]["failures"][0]["message"]  # faulthandler's innermost frame
    assert "prism_test_gilhang.py" in by["gilhang"]["failures"][0]["message"]  # where it hung
    assert f"segv: {n_mul_plain} passed, 0 failed, {n_unsup} unsupported cases, 0 timed out, {n_plain} crashed" in out
    assert f"FAIL {n_plain}/{n_add} ({n_plain} crashed)" in out and f"FAIL {n_plain}/{n_add} ({n_plain} timeout)" in out
    md = (tmp_path / "r.md").read_text()
    assert "| segv | fault |" in md and f"| 0 | {n_plain} | 0 |" in md
    assert "SIGSEGV" in r.stderr  # the crash is announced as it happens


@pytest.mark.slow
def test_budget_stops_the_run_and_keeps_the_results(installed, tmp_path):
    _, env = installed
    # gilhang hangs in its first ADD case with no per-case limit: only the budget can end the run. How far
    # numpy got by then depends on the machine's speed, so what is checked holds at any speed: every case
    # either ran (and numpy's pass) or is reported NOT RUN, and nothing is reported as a failure or a timeout
    r, rep = _conformance(env, tmp_path, "--backend", "numpy", "--backend", "gilhang", "--timeout", "0",
                          "--budget", "20")
    assert r.returncode == 1, r.stdout + r.stderr
    by = {b["name"]: b for b in rep["backends"]}
    n_add, n_plain, n_mul, n_mul_plain = _counts()
    ran = by["numpy"]["summary"]
    assert ran["passed"] + ran["not_run"] == n_add + n_mul and ran["failed"] == ran["timeout"] == 0
    hung = by["gilhang"]["summary"]
    assert hung["passed"] == 0 and hung["not_run"] >= n_mul and hung["not_run"] + hung["unsupported"] == n_add + n_mul
    assert f"numpy: {ran['passed']} passed, 0 failed" in r.stdout  # the results so far are printed
    assert rep["complete"] is False and rep["incomplete_reason"] == "the overall budget of 20 s ran out"
    assert "incomplete run: the overall budget of 20 s ran out" in r.stdout
    assert "**Incomplete run**" in (tmp_path / "r.md").read_text()


@pytest.mark.slow
def test_jobs_give_the_same_results(installed, tmp_path):
    _, env = installed
    _, one = _conformance(env, tmp_path, "--backend", "numpy", "--backend", "segv")
    _, two = _conformance(env, tmp_path, "--backend", "numpy", "--backend", "segv", "--jobs", "3")
    assert two["jobs"] == 3
    strip = [{k: b[k] for k in ("name", "summary", "ops")} for b in one["backends"]]
    assert strip == [{k: b[k] for k in ("name", "summary", "ops")} for b in two["backends"]]


@pytest.mark.slow
def test_pytest_plugin_survives_a_crashing_backend_under_xdist(installed, tmp_path):
    _, env = installed
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--pyargs",
                        "prism_core.conformance", "-k", "test_conformance", "--prism-backend", "numpy",
                        "--prism-backend", "segv", "--prism-op", "ADD", "--prism-op", "MUL"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    n_add, n_plain, n_mul, n_mul_plain = _counts()
    assert f"{n_plain} failed, {n_add + n_mul + n_mul_plain} passed" in r.stdout, r.stdout[-3000:] + r.stderr
    assert "CRASHED: the worker process was killed by SIGSEGV" in r.stdout
    assert "not run: an earlier case of ADD" in r.stdout


@pytest.mark.slow
def test_pytest_plugin_hang_costs_one_timeout(installed, tmp_path):
    _, env = installed
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                        "prism_core.conformance", "-k", "test_conformance", "--prism-backend", "gilhang",
                        "--prism-op", "ADD", "--prism-timeout", "15"],  # room for a loaded machine
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    _, n_plain, _, _ = _counts()
    assert f"{n_plain} failed" in r.stdout, r.stdout[-3000:] + r.stderr
    # counted in the failure sections: pytest's short summary repeats each message when the terminal
    # width lets it (it depends on the environment, e.g. COLUMNS)
    sections = "\n".join(line for line in r.stdout.splitlines() if not line.startswith("FAILED "))
    assert sections.count("TIMEOUT: did not finish within 15 s") == 1, r.stdout[-3000:]  # the first case
    assert sections.count("TIMEOUT: not run: an earlier case of ADD") == n_plain - 1, r.stdout[-3000:]  # the rest


def _workers(pid: int) -> list[int]:
    """The conformance worker processes of ``pid`` (not its plugin probe, which comes first)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                        continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if b"conformance.worker_main" in f.read():
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                continue
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker through /proc")
def test_ctrl_c_prints_and_reports_what_finished_and_stops_the_workers(installed, tmp_path):
    import signal
    import time
    _, env = installed
    report = tmp_path / "report.json"
    p = subprocess.Popen([sys.executable, "-m", "prism_core.cli", "conformance", "--backend", "gilhang", "--op", "ADD",
                          "--op", "MUL", "--timeout", "300", "--report", "json", str(report)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)
    workers: list[int] = []
    for _ in range(600):  # the worker is up (and soon stuck in its first ADD case)
        workers = _workers(p.pid)
        if workers or p.poll() is not None:
            break
        time.sleep(0.1)
    assert workers, p.communicate()
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, out + err
    assert "Traceback" not in err and "incomplete run: interrupted" in out
    assert "gilhang: 0 passed, 0 failed, 0 unsupported cases, 0 timed out" in out
    rep = json.loads(report.read_text())
    assert rep["complete"] is False and rep["incomplete_reason"] == "interrupted"
    (b,) = rep["backends"]
    n_add, _, n_mul, _ = _counts()
    assert b["summary"]["not_run"] + b["summary"]["unsupported"] == n_add + n_mul and b["summary"]["not_run"] > 0
    assert {f["message"] for f in b["failures"]} == {"not run: interrupted"}
    for w in workers:  # the stuck worker was killed, not left behind
        try:
            with open(f"/proc/{w}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode()
            with open(f"/proc/{w}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        assert state == "Z" or "serve(" not in cmd, (state, cmd)


@pytest.mark.parametrize("argv, message", [
    (["--timeout", "-1"], "argument --timeout: must be a finite number of seconds >= 0, got '-1'"),
    (["--timeout", "nan"], "argument --timeout: must be a finite number of seconds >= 0, got 'nan'"),
    (["--timeout", "inf"], "argument --timeout: must be a finite number of seconds >= 0, got 'inf'"),
    (["--timeout", "1e300"], "argument --timeout: must be at most 1e+06 seconds (0: no limit), got '1e300'"),
    (["--timeout", "soon"], "argument --timeout: not a number of seconds: 'soon'"),
    (["--timeout", "=3"], "argument --timeout: expected SECONDS or BACKEND=SECONDS, got '=3'"),
    (["--timeout", "numpy=-1"], "argument --timeout: must be a finite number of seconds >= 0, got '-1'"),
    (["--timeout", "numpy=soon"], "argument --timeout: not a number of seconds: 'soon'"),
    (["--seed", "-1", "--random", "2"], "argument --seed: must be at least 0, got -1"),
    (["--random", "0"], "argument --random: must be at least 1, got 0"),
    (["--budget", "0"], "argument --budget: must be more than 0 seconds"),
    (["--budget", "-5"], "argument --budget: must be a finite number of seconds >= 0, got '-5'"),
    (["--jobs", "0"], "argument --jobs/-j: must be at least 1, got 0"),
    (["--jobs", "many"], "argument --jobs/-j: not an integer: 'many'"),
])
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    from prism_core.cli import main as cli
    with pytest.raises(SystemExit) as e:
        cli(["conformance", "--backend", "numpy", "--op", "ADD", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: prism conformance") and f"prism conformance: error: {message}" in err
    assert "Traceback" not in err


def test_a_timeout_for_a_backend_outside_the_run_is_refused(capsys):
    from prism_core.cli import main as cli
    assert cli(["conformance", "--backend", "numpy", "--op", "ADD", "--timeout", "numba=3"]) == 2
    err = capsys.readouterr().err
    assert "--timeout numba=3: backend 'numba' is not in this run (running: numpy)" in err


def test_a_backend_timeout_overrides_the_common_one(tmp_path, capsys):
    from prism_core.cli import main as cli
    path = tmp_path / "r.json"
    argv = ["conformance", "--backend", "numpy", "--op", "ADD", "--report", "json", str(path), "-q"]
    assert cli([*argv, "--timeout", "numpy=0", "--timeout", "7"]) == 0  # 0: no limit for numpy
    rep = json.loads(path.read_text())
    assert rep["timeout_s"] == 7 and rep["backends"][0]["timeout_s"] is None
    assert cli([*argv, "--timeout", "numpy=30", "--timeout", "numpy=45"]) == 0  # the last one wins
    rep = json.loads(path.read_text())
    assert rep["timeout_s"] == 120 and rep["backends"][0]["timeout_s"] == 45


def test_bad_pytest_options_are_usage_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                        "prism_core.conformance", "--prism-backend", "numpy", "--prism-timeout", "nan"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 4, r.stdout + r.stderr  # pytest's exit status for a usage error
    assert "argument --prism-timeout: must be a finite number of seconds >= 0, got 'nan'" in r.stderr


def test_batches_cut_at_op_boundaries():
    from prism_core.conformance.workers import Suite, _batches
    cases = Suite(ops=("ADD", "MUL", "SOFT_MAX", "SQRT")).cases()
    assert _batches(cases, 1) == [list(range(len(cases)))]
    for n in (2, 3, 8):
        batches = _batches(cases, n)
        assert [i for b in batches for i in b] == list(range(len(cases)))  # every case once, in order
        for b, after in zip(batches, batches[1:]):
            assert cases[b[-1]].key != cases[after[0]].key  # no op is split between two batches
        assert 1 < len(batches) <= 4
