"""csrc/build_csimd.py's parallel compile: one extension's translation units side by side (setuptools compiles
them one after another), as many at a time as MAX_JOBS or the CPUs, the first failure still raised."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

from prism_core.contention import usable_cpus

REPO = Path(__file__).resolve().parent.parent


def _script():
    pytest.importorskip("cffi")
    spec = importlib.util.spec_from_file_location("_csimd_build_script_test", REPO / "csrc" / "build_csimd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeCompiler:
    """The part of a distutils Unix compiler that compile() uses; _compile records how many run at once."""

    compiler_type = "unix"

    def __init__(self, fail: str | None = None):
        self.running = self.most = 0
        self.done: list[str] = []
        self.fail = fail
        self.lock = threading.Lock()

    def _setup_compile(self, output_dir, macros, include_dirs, sources, depends, extra_postargs):
        objects = [s.replace(".c", ".o") for s in sources]
        return macros, objects, extra_postargs, [], {o: (s, ".c") for o, s in zip(objects, sources)}

    def _get_cc_args(self, pp_opts, debug, extra_preargs):
        return []

    def _compile(self, obj, src, ext, cc_args, extra_postargs, pp_opts):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        # long enough for the other jobs to start, on a busy machine too (a sleep needs no CPU)
        time.sleep(0.3)
        with self.lock:
            self.running -= 1
            self.done.append(obj)
        if src == self.fail:
            raise RuntimeError(f"{src} failed")


SOURCES = [f"u{i}.c" for i in range(6)]


def test_units_compile_side_by_side_up_to_the_jobs_asked():
    script = _script()
    cc = FakeCompiler()
    script.compile_in_parallel(cc, 3)
    assert cc.compile(SOURCES) == [s.replace(".c", ".o") for s in SOURCES]  # every object, in the sources' order
    assert sorted(cc.done) == sorted(s.replace(".c", ".o") for s in SOURCES)
    assert cc.most == 3


def test_one_job_and_other_compilers_stay_serial():
    script = _script()
    cc = FakeCompiler()  # no compile of its own: compile_in_parallel would add one
    script.compile_in_parallel(cc, 1)
    assert not hasattr(cc, "compile")
    msvc = FakeCompiler()
    msvc.compiler_type = "msvc"
    script.compile_in_parallel(msvc, 4)
    assert not hasattr(msvc, "compile")


def test_a_failing_unit_fails_the_compile():
    script = _script()
    cc = FakeCompiler(fail="u2.c")
    script.compile_in_parallel(cc, 2)
    with pytest.raises(RuntimeError, match="u2.c failed"):
        cc.compile(SOURCES)


@pytest.mark.parametrize(("value", "expected"), [("3", 3), ("1", 1)])
def test_max_jobs_sets_the_count(monkeypatch, value, expected):
    script = _script()
    monkeypatch.setenv("MAX_JOBS", value)
    assert script.build_jobs() == expected


@pytest.mark.parametrize("value", ["", "0", "-2", "many"])
def test_without_a_positive_max_jobs_every_cpu_of_the_process(monkeypatch, value):
    script = _script()
    monkeypatch.setenv("MAX_JOBS", value)
    assert script.build_jobs() == usable_cpus()
