"""The conformance suite: cases for every op in the table, run on any backend
against the reference, with ggml's error metric. See ``prism conformance``."""

from .cases import Case, all_cases, cases_for
from .runner import FAIL, PASS, UNSUPPORTED, CaseResult, run, run_case

from . import cases_attn, cases_conv, gradcheck  # noqa: E402,I001 - families register their cases

__all__ = ["Case", "CaseResult", "FAIL", "PASS", "UNSUPPORTED", "all_cases", "cases_for", "run", "run_case"]
