"""The conformance suite: cases for every op in the table, run on any backend
against the reference, with ggml's error metric. See ``prism conformance``."""

from . import cases_attn, cases_conv, cases_edges, cases_quant, gradcheck  # noqa: E402,F401,I001 - families register their cases
from .cases import Case, all_cases, cases_for
from .runner import FAIL, PASS, UNSUPPORTED, CaseResult, run, run_case

__all__ = ["Case", "CaseResult", "FAIL", "PASS", "UNSUPPORTED", "all_cases", "cases_for", "run", "run_case"]
