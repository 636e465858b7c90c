"""The suite's way to run the CUDA-only fast paths on CPU, where their kernels run their exact CPU emulations (the
BF16-input GEMM of SANA-Video's linear attention, SANA-Video 2.0's BF16 anchor and linear paths), so that their
math, counts and reports are tested where no GPU is.

accelpatch has no switch for this: its guards ask one predicate, :func:`accelpatch.core.sites.runs_cuda_fast_paths`
("do the CUDA-only paths run on this device type?"), and :func:`run_fast_paths_on_cpu` replaces it for the
duration, from outside. Process-global (every thread sees it); the previous predicate comes back on exit, so uses
nest. Around ``apply()`` too: mounting checks the kernels unless the CPU runs the paths.
``benchmarks/gpu/run_all.py --cpu`` (the CPU rehearsal) loads this file by its path.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from accelpatch.core import sites


def _cuda_or_cpu(device_type: str) -> bool:
    return device_type in ("cuda", "cpu")


@contextlib.contextmanager
def run_fast_paths_on_cpu() -> Iterator[None]:
    """Within the block, the CUDA-only fast paths run on CPU too (their CPU emulations), and mount on a machine
    without CUDA."""
    previous = sites.runs_cuda_fast_paths
    sites.runs_cuda_fast_paths = _cuda_or_cpu
    try:
        yield
    finally:
        sites.runs_cuda_fast_paths = previous


def fast_paths_run_on_cpu() -> bool:
    """Whether the CPU runs the CUDA-only fast paths now (inside :func:`run_fast_paths_on_cpu`)."""
    return sites.runs_cuda_fast_paths("cpu")
