"""Block summaries, thresholds and sink range of Sol-Attn (sol_attn.md, steps 1-2 and "Sink").

Shared by the PyTorch implementation and by the host side of the Triton kernel, so both route with
the same kc, vc and thresholds. Inputs are BTHD; summaries come out as [B, H, N, D].
Rounding rule: sums are accumulated in fp32 (fp64 for fp64 input) and kc/vc are stored in the input
dtype (so fp32 input keeps fp32 summaries); q-bar and thresholds stay in the accumulation dtype.
"""
from __future__ import annotations

import math

import torch

from accelpatch.sol_attn.op.options import BLOCK

LOG2E = math.log2(math.e)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp64 for fp64 input, fp32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def num_blocks(t: int) -> int:
    return (t + BLOCK - 1) // BLOCK


def block_lengths(t: int, device) -> torch.Tensor:
    """Token count of every 64-block, [N] int64 (the last block may be short)."""
    n = num_blocks(t)
    lens = torch.full((n,), BLOCK, dtype=torch.int64, device=device)
    lens[-1] = t - (n - 1) * BLOCK
    return lens


def block_sums(x: torch.Tensor) -> torch.Tensor:
    """Sum of x [B, T, H, D] over each 64-token block, accumulated in acc dtype -> [B, H, N, D]."""
    b, t, h, d = x.shape
    acc = acc_dtype(x.dtype)
    nfull = t // BLOCK
    parts = []
    if nfull:
        parts.append(x[:, : nfull * BLOCK].reshape(b, nfull, BLOCK, h, d).sum(2, dtype=acc))
    if t % BLOCK:
        parts.append(x[:, nfull * BLOCK :].sum(1, keepdim=True, dtype=acc))
    s = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    return s.permute(0, 2, 1, 3)


def summaries(q, k, v):
    """Return (kc, vc, qbar): kc = mean of K per block and vc = SUM of V per block, both stored in
    the input dtype; qbar = mean of Q per block in the accumulation dtype. Shapes [B, H, N, D]."""
    lens = block_lengths(q.shape[1], q.device).to(acc_dtype(q.dtype))[:, None]
    kc = (block_sums(k) / lens).to(q.dtype)
    vc = block_sums(v).to(q.dtype)
    qbar = block_sums(q) / lens
    return kc, vc, qbar


def thresholds(qbar: torch.Tensor, kc: torch.Tensor, c: float, tau: float, thresh_type: str) -> torch.Tensor:
    """Per-query-block threshold thr = c*(qbar.mu_K) + tau*sqrt(c^2*sigma^2 + 1e-6), [B, H, N]."""
    kcf = kc.to(qbar.dtype)
    mu = kcf.mean(2, keepdim=True)  # [B, H, 1, D], mean over all N blocks
    qmu = (qbar * mu).sum(-1)
    if thresh_type == "diag":
        var = ((kcf - mu) ** 2).mean(2, keepdim=True).clamp_min(0)
        sig2 = (qbar * qbar * var).sum(-1)
    else:
        m = kcf.transpose(-1, -2) @ kcf / kcf.shape[2]  # [B, H, D, D]
        sig2 = (((qbar @ m) * qbar).sum(-1) - qmu * qmu).clamp_min(0)
    return c * qmu + tau * torch.sqrt(c * c * sig2 + 1e-6)


def sink_block_range(t: int, sink_tokens: int, sink_start):
    """Inclusive key-block range [lo, hi] that is always exact, rounded outward and clipped to the
    sequence; (0, -1) when empty. sink_start None means a suffix sink (start = T - sink_tokens)."""
    if sink_tokens <= 0:
        return 0, -1
    s = t - sink_tokens if sink_start is None else sink_start
    lo = max(s // BLOCK, 0)
    hi = min(-(-(s + sink_tokens) // BLOCK) - 1, num_blocks(t) - 1)
    return (lo, hi) if lo <= hi else (0, -1)
