"""csimd on arm64, under emulation: csrc/ cross-compiled for aarch64 (without OpenMP: the build a
compiler with no OpenMP makes) and run with qemu-user on every ARM path, through the Python of an
arm64 Debian tree. Speed means nothing here; these tests check that each path computes right and
that a CPU without an extension never reaches its instructions (qemu raises SIGILL for them).

Paths and the CPUs qemu emulates: ``-cpu max`` has the dot-product extension and i8mm (paths
scalar, neon, dotprod, i8mm), ``-cpu cortex-a76`` dotprod only, ``-cpu cortex-a53`` neither
(scalar, neon).

What CI runs (each case tens of seconds under qemu, hence ``slow``): the paths each CPU reports,
csimd's quantized-kernel tests (tests/test_csimd_quant.py, every path that -cpu max runs), and the
conformance suite on the neon path of a Cortex-A53. ``PRISM_FULL_SWEEP=1`` adds the conformance
suite (forward) on every path with the CPU that has just that path's extensions, its grad mode on
i8mm, and tests/test_csimd_attn.py.

Needs (the tests skip with the reason where one is missing): ``aarch64-linux-gnu-gcc`` (Debian's
gcc-aarch64-linux-gnu), ``qemu-aarch64`` (qemu-user), and an arm64 Debian tree with python3, numpy,
cffi and pytest at ``PRISM_ARM64_ROOT`` (default: /work/cache/arm64-root); docs/isa.md says how to
make one. The pure-Python packages the tree lacks (gguf, tqdm, PyYAML, hypothesis) come from this
interpreter's site-packages.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import once_per_run

REPO = Path(__file__).resolve().parents[1]
ARM64_ROOT = Path(os.environ.get("PRISM_ARM64_ROOT", "/work/cache/arm64-root"))
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
PURE_PYTHON_DEPS = ("gguf", "tqdm", "yaml", "hypothesis", "sortedcontainers")
FULL_SWEEP = os.environ.get("PRISM_FULL_SWEEP", "") not in ("", "0")
QEMU_TIMEOUT = 1200

pytestmark = pytest.mark.slow
NO_X86_CASES = "not avx"  # -k: test_csimd_quant.py's x86 paths' cases, which would skip, at emulated cost


def _missing() -> str | None:
    if not shutil.which(CROSS_CC):
        return f"{CROSS_CC} not found (Debian: apt-get install gcc-aarch64-linux-gnu)"
    if not shutil.which(QEMU):
        return f"{QEMU} not found (Debian: apt-get install qemu-user)"
    python = _tree_python()
    if not python:
        return f"no arm64 Debian tree with python3 at {ARM64_ROOT} (PRISM_ARM64_ROOT; docs/isa.md says how to make one)"
    if not (ARM64_ROOT / "usr" / "include" / python.name / "Python.h").is_file():
        return (f"the arm64 tree at {ARM64_ROOT} lacks {python.name}'s headers, which the cross build needs "
                "(libpython3-dev: docs/isa.md)")
    return None


def _tree_python() -> Path | None:
    found = sorted((ARM64_ROOT / "usr" / "bin").glob("python3.[0-9]*"))
    return next((p for p in found if p.name.replace("python", "").replace(".", "").isdigit()), None)


def _cross_build(out: Path, sanitize: bool) -> Path:
    """csimd cross-compiled for aarch64 into out, with the build's own sources and flags (no OpenMP)."""
    python = _tree_python()
    version = python.name.replace("python", "")
    sys.path.insert(0, str(REPO / "csrc"))
    try:
        import build_csimd
    finally:
        sys.path.pop(0)
    ffi = build_csimd.make_ffi(sanitize=sanitize, openmp=False, relative=False)
    glue = out / "_csimd.c"
    ffi.emit_c_code(str(glue))
    kw = ffi._assigned_source[3]  # set_source's keywords (cffi keeps them here)
    lib = out / f"_csimd.cpython-{version.replace('.', '')}-aarch64-linux-gnu.so"
    include = ARM64_ROOT / "usr" / "include"
    cflags = ["-fPIC", *kw["extra_compile_args"], *[f"-I{d}" for d in kw["include_dirs"]],
              f"-I{include / f'python{version}'}", f"-I{include}"]
    sources = [glue, *map(Path, kw["sources"])]
    objects = [out / f"{src.stem}.o" for src in sources]

    def compile_one(src: Path, obj: Path) -> subprocess.CompletedProcess:
        return subprocess.run([CROSS_CC, *cflags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True,
                              timeout=900)

    # one compiler per translation unit, as many at a time as the build's own (MAX_JOBS or the CPUs)
    with ThreadPoolExecutor(max_workers=build_csimd.build_jobs()) as pool:
        for r in pool.map(compile_one, sources, objects):
            assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([CROSS_CC, "-shared", "-o", str(lib), *map(str, objects), *kw["extra_link_args"],
                        *[f"-l{n}" for n in kw["libraries"]]], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return lib


def _site(out: Path) -> Path:
    site = out / "site"
    site.mkdir()
    for name in PURE_PYTHON_DEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{name} is not installed here (the arm64 run takes it from this interpreter)")
        (site / name).symlink_to(next(iter(spec.submodule_search_locations)))
    return site


def _need_tools() -> None:
    reason = _missing()
    if reason:
        print(f"SKIP test_arm64_qemu: {reason}")
        pytest.skip(reason)


def _built_once(tmp_path_factory, sanitize: bool) -> Path:
    """_cross_build once in the run: this file's tests may land on several pytest-xdist workers."""
    def make(folder: Path) -> tuple[str, str]:
        return str(_cross_build(folder, sanitize)), ""
    lib, _ = once_per_run(tmp_path_factory, "arm64-asan" if sanitize else "arm64", make)
    return Path(lib)


@pytest.fixture(scope="module")
def arm64(tmp_path_factory):
    """The cross-built extension and the site folder beside it: (python, library, site, preload)."""
    _need_tools()
    out = tmp_path_factory.mktemp("arm64")
    return _tree_python(), _built_once(tmp_path_factory, sanitize=False), _site(out), ""


@pytest.fixture(scope="module")
def arm64_sanitized(tmp_path_factory):
    """The same built with AddressSanitizer and UndefinedBehaviorSanitizer, their runtimes preloaded."""
    _need_tools()
    preload = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([CROSS_CC, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(path):
            pytest.skip(f"{CROSS_CC} has no {name} (Debian: libasan8-arm64-cross, libubsan1-arm64-cross)")
        preload.append(os.path.realpath(path))
    out = tmp_path_factory.mktemp("arm64-asan")
    return _tree_python(), _built_once(tmp_path_factory, sanitize=True), _site(out), ":".join(preload)


def _qemu(arm64, cpu: str, args: list[str], isa: str | None = None) -> subprocess.CompletedProcess:
    python, lib, site, preload = arm64
    env = {"PYTHONPATH": f"{REPO}:{REPO / 'backends'}:{site}", "PRISM_CSIMD_LIBRARY": str(lib),
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(site.parent)}
    if preload:
        env.update(LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0",
                   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    if isa:
        env["PRISM_CSIMD_ISA"] = isa
    cmd = [QEMU, "-cpu", cpu, "-L", str(ARM64_ROOT)]
    for k, v in env.items():
        cmd += ["-E", f"{k}={v}"]
    return subprocess.run(cmd + [str(python), *args], cwd=REPO / "tests", capture_output=True, text=True,
                          timeout=QEMU_TIMEOUT)


_PATHS_SCRIPT = """
import prism_core as pc
from prism_csimd import ISA_NAMES, kernels
info = next(i for i in pc.backends() if i.name == "csimd")  # loads the library
lib = kernels._state["lib"]
print("best", ISA_NAMES[lib.csimd_cpu_isa()])
print("runs", " ".join(n for i, n in enumerate(ISA_NAMES) if lib.csimd_isa_runs(i)))
print("openmp", lib.csimd_has_openmp(), "threads", pc.backend("csimd").threads, "version", info.version)
"""


@pytest.mark.parametrize("cpu, best, runs", [
    ("max", "i8mm", "scalar neon dotprod i8mm"),
    ("cortex-a76", "dotprod", "scalar neon dotprod"),
    ("cortex-a53", "neon", "scalar neon"),
])
def test_paths_follow_the_cpu(arm64, cpu, best, runs):
    r = _qemu(arm64, cpu, ["-c", _PATHS_SCRIPT])
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.splitlines()
    assert f"best {best}" in lines
    assert f"runs {runs}" in lines
    # no OpenMP in this build: one thread, and the backend is available all the same
    assert f"openmp 0 threads 1 version 0.1.0+{best}" in lines


def test_path_the_cpu_lacks_is_refused(arm64):
    r = _qemu(arm64, "cortex-a53", ["-m", "prism_core.cli", "info"], isa="dotprod")
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("csimd"))
    assert "UNAVAILABLE" in line and "dotprod" in line and "it runs scalar, neon" in line, line


def test_quantized_kernels_on_every_path(arm64):
    """tests/test_csimd_quant.py under -cpu max: scalar, neon, dotprod and i8mm each against gguf.quants and
    float64 NumPy (the x86 paths skip there)."""
    r = _qemu(arm64, "max", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_csimd_quant.py", "-k", NO_X86_CASES])
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    for isa in ("neon", "dotprod", "i8mm"):  # the ARM paths ran, not skipped
        assert f"does not run the {isa} path" not in r.stdout, tail
    assert " passed" in r.stdout and " failed" not in r.stdout, tail


def _conformance(arm64, cpu: str, isa: str, mode: str = "forward") -> None:
    r = _qemu(arm64, cpu, ["-m", "prism_core.cli", "conformance", "--backend", "csimd", "--in-process", "-q",
                           "--mode", mode], isa=isa)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    summary = next((ln for ln in r.stdout.splitlines() if ln.startswith("csimd:")), "")
    assert " 0 failed, 0 unsupported cases, 0 timed out" in summary, tail
    assert int(summary.split()[1]) > (1000 if mode == "forward" else 50), summary  # the suite ran and passed


def test_conformance_neon_on_a_core_without_extensions(arm64):
    _conformance(arm64, "cortex-a53", "neon")


@pytest.mark.skipif(not FULL_SWEEP, reason="full sweep: set PRISM_FULL_SWEEP=1")
@pytest.mark.parametrize("cpu, isa", [("cortex-a53", "scalar"), ("cortex-a76", "dotprod"), ("max", "i8mm")])
def test_conformance_every_path(arm64, cpu, isa):
    _conformance(arm64, cpu, isa)


@pytest.mark.skipif(not FULL_SWEEP, reason="full sweep: set PRISM_FULL_SWEEP=1")
def test_conformance_grad_i8mm(arm64):
    _conformance(arm64, "max", "i8mm", mode="grad")


@pytest.mark.skipif(not FULL_SWEEP, reason="full sweep: set PRISM_FULL_SWEEP=1")
def test_attention_kernels_on_every_path(arm64):
    r = _qemu(arm64, "max", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_csimd_attn.py"])
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0 and " passed" in r.stdout, tail


def _sanitizer_clean(r: subprocess.CompletedProcess) -> None:
    """No sanitizer report; the one exit failure allowed is LeakSanitizer's own, which cannot start under
    qemu-user (it needs ptrace-free thread suspension) and fails at exit after the run."""
    out = r.stdout + r.stderr
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-6000:]
    if r.returncode != 0:
        assert "LeakSanitizer has encountered a fatal error" in r.stderr, out[-4000:]


def test_sanitized_quantized_kernels_on_every_path(arm64_sanitized):
    """tests/test_csimd_quant.py under ASan + UBSan on neon, dotprod and i8mm (-cpu max). The sanitizer
    sees the C code: a read past a buffer in any path's kernel is reported (checked: a dequantize of 64 values
    from a 16-byte buffer is caught in the i8mm copy). The scalar path's cases are left out: its C source is
    x86's scalar copy, which tests/test_csimd_backend.py's sanitized run covers (a quarter of this run's
    emulated time)."""
    r = _qemu(arm64_sanitized, "max", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_csimd_quant.py",
                                       "-k", f"{NO_X86_CASES} and not scalar-"])
    _sanitizer_clean(r)
    assert " passed" in r.stdout and " failed" not in r.stdout, (r.stdout + r.stderr)[-4000:]


@pytest.mark.skipif(not FULL_SWEEP, reason="full sweep: set PRISM_FULL_SWEEP=1")
@pytest.mark.parametrize("cpu, isa", [("cortex-a53", "neon"), ("max", "i8mm")])
def test_sanitized_conformance(arm64_sanitized, cpu, isa):
    r = _qemu(arm64_sanitized, cpu, ["-m", "prism_core.cli", "conformance", "--backend", "csimd", "--in-process",
                                     "-q"], isa=isa)
    _sanitizer_clean(r)
    summary = next((ln for ln in r.stdout.splitlines() if ln.startswith("csimd:")), "")
    assert " 0 failed, 0 unsupported cases, 0 timed out" in summary, (r.stdout + r.stderr)[-4000:]
