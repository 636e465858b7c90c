"""Timing and comparison helpers shared by the prepared GPU scripts: CUDA-event timing after a warm-up (wall clock
on a CPU dry run), and the PSNR of a result against its reference."""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch


def timed(fn: Callable[[], Any], repeats: int, device: str) -> tuple[float, Any]:
    """(seconds per call, the last result) of ``fn`` after one warm-up call (kernel selection, Triton compiles)."""
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            out = fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats, out
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return (time.perf_counter() - t0) / repeats, out


def psnr(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """PSNR in dB with the reference's range as the peak (inf when equal)."""
    ref, cand = reference.double(), candidate.double()
    mse = torch.mean((ref - cand) ** 2).item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse)
