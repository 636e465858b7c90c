"""The CPU the suite runs on, read from /proc/cpuinfo here (not through accelpatch): the suite's first line names it
(tests/_suite_guard.py), and so does a skip where a dependency crashes by itself on it (tests/_works_with_tools.py).
The machine changes between runs (seen: AVX2 EPYC, AVX-512 Xeon without bf16 instructions, AVX-512 EPYC with
avx512_bf16), and some dependencies' native kernels behave differently on each."""
from __future__ import annotations

import os


def _cpuinfo(key: str) -> str:
    """The first value of ``key`` in /proc/cpuinfo ('' where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.partition(":")[2].strip() for line in f if line.split(":")[0].strip() == key), "")
    except OSError:
        return ""


FEATURES = frozenset(_cpuinfo("flags").split())
MODEL = _cpuinfo("model name") or "unknown model"


def describe() -> str:
    """'AMD EPYC, AVX-512 with avx512_bf16, 2 cores': the model and the instruction sets that decide which native
    kernels run (AVX2 / AVX-512 with or without avx512_bf16 / AMX)."""
    has = FEATURES.__contains__
    kind = ("AVX-512" if has("avx512f") else "AVX2, no AVX-512" if has("avx2") else
            "no AVX2" if FEATURES else "instruction sets unknown")
    if has("avx512f"):
        kind += " with avx512_bf16" if has("avx512_bf16") else " without avx512_bf16"
    amx = sorted(name for name in FEATURES if name.startswith("amx"))
    if amx:
        kind += f", AMX ({' '.join(amx)})"
    return f"{MODEL}, {kind}, {os.cpu_count()} cores"
