"""Conformance cases (forward and gradient): attn ops."""

from __future__ import annotations
