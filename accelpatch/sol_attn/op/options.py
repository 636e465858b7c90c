"""Argument validation and the stats object shared by every Sol-Attn implementation.

Kept free of Triton and of any heavy import so that `import accelpatch.ops` stays cheap.
Validation runs in the public wrappers, before the custom op, so errors name the user's argument.
"""
from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import torch

BLOCK = 64
THRESH_TYPES = ("diag", "exact")
KV_SPLITS = (1, 2, 4)
IMPLS = ("auto", "torch", "triton", "upstream")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class SolAttnStats:
    """Routing statistics of one call.

    `exact_pairs[h]` counts the (query block, key block) pairs of head h that were computed exactly,
    summed over the batch (or the varlen segments); `total_pairs` is the number of pairs per head
    (B * N**2, or sum of N_s**2 over segments). Both are tensors so that no host sync happens during
    the call (torch.compile-friendly); the fractions below are computed on first access.
    """

    exact_pairs: torch.Tensor  # [H] int64
    total_pairs: torch.Tensor  # [] int64

    @property
    def exact_fraction(self) -> float:
        """Fraction of (query block, key block) pairs computed exactly, whole call (all heads)."""
        tot = int(self.total_pairs) * self.exact_pairs.numel()
        return float(self.exact_pairs.sum()) / tot if tot else 1.0

    @property
    def exact_fraction_per_head(self) -> torch.Tensor:
        """Exact fraction per head, float64 tensor [H]."""
        tot = int(self.total_pairs)
        if tot == 0:
            return torch.ones(self.exact_pairs.shape, dtype=torch.float64)
        return self.exact_pairs.detach().cpu().double() / tot


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def validate_options(*, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start, impl, head_dim):
    """Check the scalar options; return the effective scale (default head_dim ** -0.5)."""
    if thresh_type not in THRESH_TYPES:
        raise ValueError(f"thresh_type must be one of {THRESH_TYPES}, got {thresh_type!r}")
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(float(tau)):
        raise ValueError(f"tau must be a finite real number, got {tau!r}")
    if not _is_int(kv_splits) or int(kv_splits) not in KV_SPLITS:
        raise ValueError(f"kv_splits must be one of {KV_SPLITS}, got {kv_splits!r}")
    if not _is_int(sink_tokens) or sink_tokens < 0:
        raise ValueError(f"sink_tokens must be an int >= 0, got {sink_tokens!r}")
    if sink_start is not None and (not _is_int(sink_start) or sink_start < 0):
        raise ValueError(f"sink_start must be None or an int >= 0, got {sink_start!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if scale is None:
        return float(head_dim) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)) or scale <= 0:
        raise ValueError(f"scale must be None or a finite real number > 0, got {scale!r}")
    return float(scale)


def validate_sink(sink_tokens: int, sink_start, seq_len, what: str = "T") -> None:
    """The sink must lie inside the sequence (``what`` names its length in the message), as upstream requires: a
    sink past it would be clipped without a word."""
    start = seq_len - sink_tokens if sink_start is None else sink_start
    if sink_tokens > seq_len or start + sink_tokens > seq_len:
        raise ValueError(f"the sink (sink_tokens={sink_tokens}, sink_start={sink_start}) reaches past the sequence: "
                         f"{what}={seq_len}; valid: sink_tokens <= {seq_len} and sink_start + sink_tokens <= "
                         f"{seq_len} (sink_start None: the last sink_tokens rows)")


def validate_max_seqlen(max_seqlen) -> int:
    """Any integral ``max_seqlen`` >= 1 (a Python or NumPy int, a 0-d integer tensor) as an int."""
    try:
        value = operator.index(max_seqlen) if not isinstance(max_seqlen, bool) else None
    except TypeError:
        value = None
    if value is None or value < 1:
        raise ValueError(f"max_seqlen must be an integer >= 1 (the longest segment's length), got {max_seqlen!r} "
                         f"({type(max_seqlen).__name__})")
    return value


def validate_qkv(q, k, v, rank: int, layout: str):
    """Check types, rank, shapes, dtypes and devices of q, k, v (self-attention: identical shapes)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must have the same shape {layout}, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if q.dtype not in DTYPES:
        raise TypeError(f"q dtype must be one of {[str(d) for d in DTYPES]}, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}")
    seq_dim = rank - 3
    if q.shape[seq_dim] < 1:
        raise ValueError(f"q sequence length T must be >= 1, got shape {tuple(q.shape)}")
    if q.shape[-1] < 1 or q.shape[-2] < 1:
        raise ValueError(f"q must have at least one head and head dim >= 1, got shape {tuple(q.shape)}")
