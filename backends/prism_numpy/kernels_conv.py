"""Reference kernels: conv ops."""

from __future__ import annotations
