"""Fine-tuning GGUF language models: LoRA adapters over the frozen (quantized, memory-mapped) weights, or
every weight of an F32/F16 model, trained with ggml-opt (:mod:`prism_core.train`) through the model's own
architecture module; adapters are written in llama.cpp's LoRA GGUF format.

    model = prism_core.models.load("gemma3-270m", n_ctx=256)
    res = prism_core.finetune.finetune(model, open("notes.txt").read(), FinetuneConfig(rank=8, epochs=1))
    res.lora.save("adapter.gguf", model.hparams.arch)
    adapted = prism_core.models.load("gemma3-270m", lora=[("adapter.gguf", 1.0)])
"""

from __future__ import annotations

from .checkpoint import CheckpointMismatch
from .graph import TrainingForward, build_forward, window_mask
from .lora import DEFAULT_TARGETS, TARGETS, TrainableLora, new_lora, parse_targets
from .session import FinetuneConfig, FinetuneResult, TrainingDiverged, epoch_line, finetune, tokenize
from .windows import TokenWindows, window_count

__all__ = ["DEFAULT_TARGETS", "TARGETS", "CheckpointMismatch", "FinetuneConfig", "FinetuneResult", "TokenWindows",
           "TrainableLora", "TrainingDiverged", "TrainingForward", "build_forward", "epoch_line", "finetune",
           "new_lora", "parse_targets", "tokenize", "window_count", "window_mask"]
