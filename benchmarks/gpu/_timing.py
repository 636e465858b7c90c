"""Timing and comparison helpers of the GPU evidence run.

Times are medians over repeats after a warm-up (kernel selection, Triton compiles), measured with CUDA events on
a GPU and with the wall clock on a CPU dry run. Comparisons are made in float64 so that bf16 outputs compare
fairly, and hashes are over the raw bytes so that "identical" means bit for bit.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass
class Timing:
    """Median seconds per call, the last call's result and how many calls ran in all (warm-up included)."""

    seconds: float
    result: Any
    calls: int

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


def _one_call(fn: Callable[[], Any], cuda: bool) -> tuple[float, Any]:
    if not cuda:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3, out


def timed(fn: Callable[[], Any], repeats: int, device: str, *, warmup: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; no grad is recorded."""
    cuda = torch.device(device).type == "cuda"
    out = None
    with torch.no_grad():
        for _ in range(warmup):
            out = fn()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(max(1, repeats)):
            seconds, out = _one_call(fn, cuda)
            times.append(seconds)
    return Timing(statistics.median(times), out, warmup + len(times))


def psnr(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """PSNR in dB with the reference's range as the peak (inf when the two are equal)."""
    ref, cand = reference.double(), candidate.double()
    mse = torch.mean((ref - cand) ** 2).item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse)


def rel_l2(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """‖candidate − reference‖ / ‖reference‖ in float64."""
    ref = reference.double()
    return ((candidate.double() - ref).norm() / ref.norm()).item()


def sha256_hex(tensor: torch.Tensor) -> str:
    """SHA-256 of the tensor's bytes (its dtype and memory layout as stored, on the host)."""
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()
