"""Reference kernels: attn ops."""

from __future__ import annotations
