"""The kind of CPU the suite runs on, read from /proc/cpuinfo here (not through accelpatch), for the tests whose
expectation depends on it.

The ``pointwise_conv`` and ``linear`` ops replay the summation order of oneDNN's emulated-bf16 kernels, which eager
runs on AVX-512 CPUs without bf16 instructions (seen: an AVX-512 Xeon). There they fuse. On any other CPU (seen: an
AVX2 EPYC; in principle one with avx512_bf16 or AMX) they run the reference, counted as
``"not applicable: not this CPU: ..."``, never declined or warned, and the output stays bit-identical. A test asserts the
outcome of the CPU it runs on; the statements about eager's order itself are skipped elsewhere, naming the features.
"""
from __future__ import annotations

from typing import Mapping, Optional


def _features() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


FEATURES = _features()
#: AVX-512 (oneDNN's avx512_core: F, BW, VL, DQ) without bf16 instructions: eager's bf16 1x1 convolutions and GEMMs
#: are oneDNN's emulated-bf16 kernels, whose order the ops replay
ONEDNN_EMULATED_BF16 = ({"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FEATURES
                        and not {"avx512_bf16", "amx_bf16"} & FEATURES)
KIND = ("AVX-512 without bf16 instructions" if ONEDNN_EMULATED_BF16 else
        "AVX-512 with bf16 instructions" if {"avx512_bf16", "amx_bf16"} & FEATURES else
        "AVX2 without AVX-512" if "avx2" in FEATURES else "another CPU")
NEEDS_EMULATED_BF16 = ("needs avx512f/bw/vl/dq without avx512_bf16 and amx_bf16 (the CPU kind whose oneDNN bf16 "
                       f"order this states); this CPU: {KIND}")
NOT_THIS_CPU = "not applicable: not this CPU: "


def check_onednn_counts(fusion, fused: int, reference: Optional[Mapping[str, int]] = None) -> None:
    """A pointwise_conv or linear fusion's counts: ``fused`` calls ran the kernel on the CPU kind it replays, and
    ran the reference counted "not this CPU" anywhere else; ``reference`` counts the other reference outcomes (the
    same on every CPU). Never a declined signature."""
    reference = dict(reference or {})
    assert not fusion.declined, fusion.declined
    other = {k: v for k, v in fusion.reference_calls.items() if k.startswith(NOT_THIS_CPU)}
    rest = {k: v for k, v in fusion.reference_calls.items() if not k.startswith(NOT_THIS_CPU)}
    assert rest == reference, (KIND, fusion.reference_calls)
    if ONEDNN_EMULATED_BF16:
        assert fusion.fused_calls == fused and not other, (KIND, fusion.fused_calls, other)
    else:
        assert fusion.fused_calls == 0 and sum(other.values()) == fused and len(other) <= 1, (KIND, other)
