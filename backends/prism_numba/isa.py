"""Which vector code numba's integer matrix-vector path is generated for (``_qvec``).

The path exists for three instruction sets, best first: AVX-512 VNNI (``vpdpbusd`` on ``zmm``),
AVX-VNNI (``vpdpbusd`` on ``ymm``, VEX-encoded: Alder Lake and later, Zen 5) and AVX2
(``vpmaddubsw`` then ``vpmaddwd``); elsewhere the float path runs ("portable": the lane sums are
then plain LLVM vector IR, slower than the float path, so never taken for products).

The features are those of the CPU numba compiles for: the host's, or with ``NUMBA_CPU_NAME`` set to a
named CPU, only the ``+feature`` entries of ``NUMBA_CPU_FEATURES`` (a named CPU alone, e.g. ``generic``
for a portable cache, gets the portable code). ``PRISM_NUMBA_ISA=auto|avx512vnni|avxvnni|avx2|portable``
forces one no better than the CPU runs (a lower one is how the AVX2 code is tested on an AVX-512
machine; LLVM still chooses the registers of the rest of the code for the CPU it compiles for).
Imports llvmlite and numba's config, not numba's compiler.
"""

from __future__ import annotations

from prism_core.errors import InvalidArgument
from prism_core.settings import env_choice

ENV_ISA = "PRISM_NUMBA_ISA"
#: the integer path's vector ISAs, best first, each with the LLVM features it needs
MODES = ("avx512vnni", "avxvnni", "avx2", "portable")
_NEEDS = {"avx512vnni": ("avx512f", "avx512bw", "avx512vnni"), "avxvnni": ("avx2", "avxvnni"),
          "avx2": ("avx2",), "portable": ()}


def target_features() -> dict[str, bool]:
    """The LLVM features of the CPU numba compiles for (see the module docstring)."""
    import llvmlite.binding as llb
    from numba.core import config
    if config.CPU_NAME in (None, "", "host"):
        return dict(llb.get_host_cpu_features())
    feats = (config.CPU_FEATURES or "").split(",")
    return {f[1:].strip(): True for f in feats if f.strip().startswith("+")}


def cpu_modes() -> tuple[str, ...]:
    """The modes the target CPU runs, best first ("portable" always)."""
    feats = target_features()
    return tuple(m for m in MODES if all(feats.get(f, False) for f in _NEEDS[m]))


def chosen() -> str:
    """The mode in force: ``$PRISM_NUMBA_ISA`` (InvalidArgument when it is not a mode, or one the CPU
    does not run), else the best the CPU runs."""
    want = env_choice(ENV_ISA, ("auto", *MODES), "auto")
    runs = cpu_modes()
    if want == "auto":
        return runs[0]
    if want not in runs:
        raise InvalidArgument(f"{ENV_ISA}={want} asks for more than the CPU numba compiles for runs "
                              f"(it runs: {', '.join(runs)})")
    return want
