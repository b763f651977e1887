"""LoRA training against PyTorch + PEFT (an optional peer: skipped, with the reason, when torch, transformers
or peft is not installed): the tiny random models of every architecture built as Hugging Face models from the
same weights, the same A and B, the same windows in the same order; the losses agree to 1e-5 relative at
step 0 and after each of 3 AdamW steps, and Prism's trained A and B are PEFT's.

The GGUF weights map onto Hugging Face's layout as llama.cpp's converter maps the other way: Llama's q and k
rows un-permuted (the converter interleaves each head's halves for RoPE NORMAL; the B of an adapter on them
is un-permuted the same way, its A unchanged), Gemma's norm weights less the 1 the converter adds. Gemma's
GELU is ggml's: F16-rounded input, the tanh formula in float32, F16-rounded result (the table Prism and
llama.cpp read), written here in torch for the peer's MLP.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_models import tiny, to_tensors

import prism_core as pc
from prism_core.finetune import TokenWindows, build_forward, new_lora
from prism_core.models import Model
from prism_core.train.optimizer import AdamWParams, OptContext, OptimizerParams

try:
    import peft
    import torch
    import transformers
except ImportError as e:  # a peer for tests only, never a dependency
    pytest.skip(f"PyTorch + PEFT peer not installed ({e.name}): pip install torch transformers peft",
                allow_module_level=True)

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
N_CTX, BATCH, STEPS, LR, RANK, ALPHA = 12, 2, 3, 1e-3, 4, 8.0
AVAILABLE = [b.name for b in pc.backends() if b.available]


def head_dim_of(arch: str) -> int:
    return 16 if arch == "qwen2" else 32  # transformers' Qwen2 takes head_dim = hidden / heads


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's convert permute (rows of each head: interleaved pairs -> two halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GgmlGelu(torch.nn.Module):
    """GELU as ggml's CPU computes it: the table of the tanh formula at F16 inputs, F16 results; 0 below -10,
    x above 10. The gradient flows as the formula's (the F16 roundings are straight-through)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        smooth = torch.nn.functional.gelu(x, approximate="tanh")
        xd = x.detach()
        table = torch.nn.functional.gelu(xd.half().float(), approximate="tanh").half().float()
        table = torch.where(xd <= -10, torch.zeros_like(table), torch.where(xd >= 10, xd, table))
        return smooth + (table - smooth).detach()


def hf_model(arch: str, meta: dict, w: dict[str, np.ndarray]):
    e, nl, nh, nkv = (meta[f"{arch}.{k}"] for k in ("embedding_length", "block_count", "attention.head_count",
                                                     "attention.head_count_kv"))
    d, f = meta[f"{arch}.attention.key_length"], meta[f"{arch}.feed_forward_length"]
    common = dict(vocab_size=w["token_embd.weight"].shape[0], hidden_size=e, intermediate_size=f,
                  num_hidden_layers=nl, num_attention_heads=nh, num_key_value_heads=nkv,
                  rms_norm_eps=meta[f"{arch}.attention.layer_norm_rms_epsilon"], max_position_embeddings=512,
                  attention_dropout=0.0)
    theta = meta[f"{arch}.rope.freq_base"]
    if arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(
            **common, head_dim=d, query_pre_attn_scalar=d, sliding_window=meta["gemma3.attention.sliding_window"],
            layer_types=["sliding_attention" if il % 6 != 5 else "full_attention" for il in range(nl)],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": theta}},
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, final_logit_softcapping=None,
            attn_logit_softcapping=None)
        model = transformers.Gemma3ForCausalLM(cfg)
    else:
        cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[arch]
        extra = {} if arch == "qwen2" else {"head_dim": d}
        cfg = cls[0](**common, **extra, rope_parameters={"rope_type": "default", "rope_theta": theta},
                     hidden_act="silu", tie_word_embeddings=False)
        model = cls[1](cfg)
    one = 1.0 if arch == "gemma3" else 0.0  # Gemma's converter stores 1 + w
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"] - one}
    if arch != "gemma3":
        sd["lm_head.weight"] = w["output.weight"]
    for il in range(nl):
        p, h = f"blk.{il}.", f"model.layers.{il}."
        for t, name in HF_NAMES.items():
            m = w[p + t + ".weight"]
            if arch == "llama" and t in ("attn_q", "attn_k"):
                m = unpermute(m, nh if t == "attn_q" else nkv)
            sd[h + name + ".weight"] = m
        sd[h + "input_layernorm.weight"] = w[p + "attn_norm.weight"] - one
        if arch == "gemma3":
            sd[h + "post_attention_layernorm.weight"] = w[p + "post_attention_norm.weight"] - one
            sd[h + "pre_feedforward_layernorm.weight"] = w[p + "ffn_norm.weight"] - one
            sd[h + "post_feedforward_layernorm.weight"] = w[p + "post_ffw_norm.weight"] - one
        else:
            sd[h + "post_attention_layernorm.weight"] = w[p + "ffn_norm.weight"]
        if arch == "qwen2":
            for t in ("q", "k", "v"):
                sd[h + f"self_attn.{t}_proj.bias"] = w[p + f"attn_{t}.bias"]
        if arch in ("qwen3", "gemma3"):
            sd[h + "self_attn.q_norm.weight"] = w[p + "attn_q_norm.weight"] - one
            sd[h + "self_attn.k_norm.weight"] = w[p + "attn_k_norm.weight"] - one
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                                                strict=False)
    assert not unexpected and all("rotary" in k or k == "lm_head.weight" for k in missing), (missing, unexpected)
    if arch == "gemma3":
        for layer in model.model.layers:
            layer.mlp.act_fn = GgmlGelu()
    return model.float()


def peft_model(arch: str, meta: dict, w: dict, lora):
    model = peft.get_peft_model(hf_model(arch, meta, w), peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=[HF_NAMES[t].split(".")[1] for t in TARGETS], lora_dropout=0.0,
        bias="none"))
    nh, nkv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    with torch.no_grad():
        for name, (a, b) in lora.pairs.items():
            il, t = int(name.split(".")[1]), name.split(".")[2]
            mod = model.base_model.model.model.layers[il].get_submodule(HF_NAMES[t])
            bv = b.numpy()
            if arch == "llama" and t in ("attn_q", "attn_k"):
                bv = unpermute(bv, nh if t == "attn_q" else nkv)
            mod.lora_A["default"].weight.copy_(torch.from_numpy(a.numpy()))
            mod.lora_B["default"].weight.copy_(torch.from_numpy(np.ascontiguousarray(bv)))
    return model


def peft_losses(model, data: TokenWindows) -> tuple[list[float], float]:
    """The loss of each of STEPS AdamW steps (batches in storage order), then the first batch's loss after."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.0)
    ids, nxt = (torch.from_numpy(t.numpy().astype(np.int64)) for t in (data.data, data.labels))

    def loss_of(i):
        sl = slice(i * BATCH, (i + 1) * BATCH)
        logits = model(input_ids=ids[sl]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), nxt[sl].reshape(-1))

    losses = []
    for i in range(STEPS):
        loss = loss_of(i)
        losses.append(float(loss))
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return losses, float(loss_of(0))


def prism_losses(model: Model, lora, data: TokenWindows, backend: str) -> tuple[list[float], float]:
    fw = build_forward(model, N_CTX, BATCH, lora.products())
    oc = OptContext(model.ctx, fw.tokens, fw.logits, "cross_entropy", "adamw", 1, backend=backend,
                    get_opt_pars=OptimizerParams(adamw=AdamWParams(alpha=LR)))
    losses = []
    for i in range(STEPS):
        oc.alloc(True)
        data.get_batch(oc.inputs, oc.labels, i)
        oc.eval()
        losses.append(float(oc.loss.numpy()[0]))
    oc.alloc(False)
    data.get_batch(oc.inputs, oc.labels, 0)
    oc.eval()
    return losses, float(oc.loss.numpy()[0])


@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("arch", ARCHS)
def test_lora_training_steps_are_pefts(arch, backend):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    meta, w = tiny(arch, 31, head_dim=head_dim_of(arch))
    model = Model(to_tensors(w), meta, backend=backend, n_ctx=64, cache_type="f32")
    lora = new_lora(model, TARGETS, RANK, ALPHA, seed=32)
    r = np.random.default_rng(33)
    ids = r.integers(3, 50, N_CTX * (STEPS * BATCH + 2))
    data = TokenWindows(ids, N_CTX, 50, stride=N_CTX)
    assert data.ndata >= STEPS * BATCH
    a0 = {n: (a.numpy().copy(), b.numpy().copy()) for n, (a, b) in lora.pairs.items()}
    ref = peft_model(arch, meta, w, lora)
    want, want_after = peft_losses(ref, data)
    got, got_after = prism_losses(model, lora, data, backend)
    for step, (g, p) in enumerate(zip(got, want)):
        assert math.isclose(g, p, rel_tol=1e-5), (step, g, p)
    assert math.isclose(got_after, want_after, rel_tol=1e-5), (got_after, want_after)
    assert want_after < want[0] - 1e-3  # the steps changed something
    nh, nkv = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    for name, (a, b) in lora.pairs.items():
        il, t = int(name.split(".")[1]), name.split(".")[2]
        mod = ref.base_model.model.model.layers[il].get_submodule(HF_NAMES[t])
        pb = mod.lora_B["default"].weight.detach().numpy()
        bv = b.numpy()
        if arch == "llama" and t in ("attn_q", "attn_k"):
            bv = unpermute(bv, nh if t == "attn_q" else nkv)
        np.testing.assert_allclose(a.numpy(), mod.lora_A["default"].weight.detach().numpy(), rtol=1e-3, atol=2e-6)
        np.testing.assert_allclose(bv, pb, rtol=1e-3, atol=2e-6)
        assert not np.array_equal(a.numpy(), a0[name][0]) or not np.array_equal(b.numpy(), a0[name][1])
