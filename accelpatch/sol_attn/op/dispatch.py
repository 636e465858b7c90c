"""Choose and run one implementation for a (contiguous, validated) call; the varlen segment loop.

impl: "torch" | "triton" | "upstream" | "auto" (Triton for CUDA tensors when triton imports, else PyTorch).
A "triton" or "auto" call whose head dim and dtype no tiles of the kernel can hold on the device
(resources.unfit_reason) runs PyTorch instead, recorded as a fallback (resources.record_fallback).
"upstream" runs the upstream package when `upstream.unsupported_reason` accepts the call, and "auto"
otherwise; if the upstream call itself raises a non-fatal exception, that is recorded as a fallback too
and "auto" runs instead (fatal errors, see `accelpatch.core.errors.is_fatal`, re-raise). Triton modules are
imported here lazily, never at package import.
"""
from __future__ import annotations

import os

import torch

from accelpatch.core.errors import is_fatal
from accelpatch.sol_attn.op import resources, upstream
from accelpatch.sol_attn.op.routing import num_blocks


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001  (any import failure means "not available")
        return False
    return True


def impl_unavailable_reason(impl: str) -> str | None:
    """Why ``impl`` cannot run in this process at all (None when it can, on some device): asked by ``apply()``
    so that an impossible choice is said there, not at the first call. Only impl='triton' can be impossible:
    "auto" and "upstream" fall back to a kernel that runs."""
    if impl != "triton":
        return None
    if not _triton_importable():
        return "sol_attn impl='triton' needs the triton package, which does not import; use impl='auto' or 'torch'"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return ("sol_attn impl='triton' needs CUDA, and no CUDA device is visible (the Triton interpreter, "
                "TRITON_INTERPRET=1 set before importing accelpatch, runs it on CPU for tests only); use impl='auto' "
                "or 'torch'")
    return None


def resolve(impl: str, q: torch.Tensor, kv_splits: int, sink_tokens: int = 0, sink_start: int | None = None) -> str:
    """Concrete implementation name for this call ("torch", "triton" or "upstream"); an "upstream" call
    that upstream cannot run is recorded as a fallback and resolved as "auto"."""
    if impl == "upstream":
        reason = upstream.unsupported_reason(q, kv_splits, sink_tokens, sink_start)
        if reason is None:
            return "upstream"
        upstream.record_fallback(reason)
        impl = "auto"
    if impl == "auto":
        if q.device.type != "cuda" or not _triton_importable():
            return "torch"
        impl = "triton"
    if impl == "triton":
        if not _triton_importable():
            raise RuntimeError("sol_attn impl='triton' needs the triton package, which does not import")
        if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "sol_attn impl='triton' got CPU tensors: use CUDA tensors, or set TRITON_INTERPRET=1 in the "
                "environment before importing accelpatch to run the Triton interpreter (slow; tests only)"
            )
        reason = resources.unfit_reason(q)
        if reason is not None:  # no tiles fit this GPU: the PyTorch implementation runs, counted and warned once
            resources.record_fallback(reason)
            return "torch"
    return impl


def _run_ours(which, q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start):
    """Our PyTorch ("torch") or Triton ("triton") implementation; returns (out, exact pairs [H])."""
    args = (scale, tau, thresh_type, sink_tokens, sink_start)
    if which == "torch":
        from accelpatch.sol_attn.op.torch_impl import sol_attn_torch  # noqa: PLC0415

        return sol_attn_torch(q, k, v, *args)
    from accelpatch.sol_attn.op.triton_impl import sol_attn_triton  # noqa: PLC0415

    return sol_attn_triton(q, k, v, *args, kv_splits=kv_splits)


def run_dense_batch(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start, impl, want_stats):
    """One call on [B, T, H, D]; returns (out, exact pairs per head [H] int64)."""
    which = resolve(impl, q, kv_splits, sink_tokens, sink_start)
    if which != "upstream":
        return _run_ours(which, q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start)
    try:
        out = upstream.call(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start)
    except Exception as error:  # noqa: BLE001  (upstream rejects what our gate accepted: fall back unless fatal)
        if is_fatal(error):
            raise
        upstream.record_fallback(f"upstream sol_attn raised {type(error).__name__}: {error}")
        return _run_ours(resolve("auto", q, kv_splits), q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens,
                         sink_start)
    if want_stats:
        from accelpatch.sol_attn.op.torch_impl import route  # noqa: PLC0415

        pairs = route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start)[0].sum((0, 2, 3))
    else:
        pairs = torch.full((q.shape[2],), -1, dtype=torch.int64, device=q.device)
    return out, pairs


def run_varlen(q, k, v, cu_seqlens, max_seqlen, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start, impl,
               want_stats):
    """Packed [T, H, D] input: each segment [cu[i], cu[i+1]) is attended on its own, blocks and
    sink_start counted from the segment start. Returns (out, exact pairs [H], total pairs per head [])."""
    t = q.shape[0]
    cu = [int(x) for x in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != t or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, start at 0 and end at T={t}, got {cu}")
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if max_seqlen < longest:
        raise ValueError(f"max_seqlen must be >= the longest segment ({longest}), got {max_seqlen}")
    out = torch.zeros_like(q)
    pairs = torch.zeros(q.shape[1], dtype=torch.int64, device=q.device)
    total = 0
    for a, b in zip(cu, cu[1:]):
        if b == a:
            continue
        o, p = run_dense_batch(q[None, a:b], k[None, a:b], v[None, a:b], scale, tau, thresh_type, kv_splits,
                               sink_tokens, sink_start, impl, want_stats)
        out[a:b] = o[0]
        pairs += p
        total += num_blocks(b - a) ** 2
    return out, pairs, torch.tensor(total, dtype=torch.int64)
