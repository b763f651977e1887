"""Op-table declarations: conv ops (part of the one op table, :data:`prism_core.optable.OPS`)."""

from __future__ import annotations
