"""Conformance cases (forward and gradient): conv ops."""

from __future__ import annotations
