"""Everything about ops, beside each other: codes, the op table, parameters, builders, semantics, pages.

- :mod:`.codes`: the ``Op``/``UnaryOp``/``GluOp`` enums with ggml's numbering (re-exported here);
- :mod:`.table` (with :mod:`.table_attn`, :mod:`.table_conv`): the op table, one declaration per op;
- :mod:`.params`: typed op parameters; :mod:`.semantics`, :mod:`.gelu_tables`: formulas every backend shares;
- :mod:`.build` (with :mod:`.build_attn`, :mod:`.build_conv`): the graph-building functions;
- :mod:`.spec`: the op pages generated from the table (``prism ops OP``).

A new op is one declaration in a ``table*`` module and one builder in the matching ``build*`` module.
"""

from .codes import GLU_OP_COUNT, OP_COUNT, UNARY_OP_COUNT, GluOp, Op, RopeMode, SortOrder, UnaryOp

__all__ = ["GLU_OP_COUNT", "OP_COUNT", "UNARY_OP_COUNT", "GluOp", "Op", "RopeMode", "SortOrder", "UnaryOp"]
