"""Delegation to the upstream `sol_attn` package (NVlabs Sana, sol-engine branch) when it fits.

`unsupported_reason` mirrors upstream's own checks, so a call it accepts should not be rejected there:
the package imports; CUDA tensors of compute capability >= 8.0; [B, T, H, 128] bf16, contiguous, T >= 1;
sink_tokens in [0, T], sink_start None or in [0, T] and sink_start + sink_tokens <= T (our own op
refuses others too); kv_splits in {1, 2, 4}. Upstream picks its backend by architecture: SM 9.0, 10.0 and
12.0 run the CuTe DSL backend when its runtime imports (`cuda.bindings.driver` and `cutlass.cute`), every
other device, or those without the runtime, the Triton backend. kv_splits > 1 needs the CuTe backend on
SM 9.0, and each KV split must hold at least one route group of 64 key blocks (kv_splits=2 needs T > 4096,
kv_splits=4 needs T > 12288). The device probes are the module-level `device_capability` and
`cute_runtime_available`, so tests can simulate a device.

A call outside these limits falls back to our own implementation ("auto"), and so does a call that
upstream rejects anyway with a non-fatal exception (dispatch.py; `accelpatch.core.errors.is_fatal` says which
errors re-raise instead). Every fallback is recorded in `FALLBACKS` (counts by reason, the latest reason, one warning
per distinct reason).
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from accelpatch.sol_attn.op.fallbacks import ImplFallbacks

FALLBACKS = ImplFallbacks("sol_attn impl='upstream' falls back to our implementation")
_importable: bool | None = None

HEAD_DIM = 128
KV_SPLITS = (1, 2, 4)
# Architectures on which upstream uses its CuTe DSL backend (when the CuTe runtime imports).
CUTE_ARCHS = ((9, 0), (10, 0), (12, 0))
# Architecture on which upstream supports kv_splits > 1 (CuTe backend only).
KV_SPLIT_ARCH = (9, 0)
_ROUTE_BLOCK = 64  # tokens per key block
_ROUTE_GROUP = 64  # key blocks per route group (upstream's "N64 route group")

def importable() -> bool:
    """Whether the upstream `sol_attn` package can be imported (cached)."""
    global _importable
    if _importable is None:
        _importable = importlib.util.find_spec("sol_attn") is not None
    return _importable


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device; None for any other device type."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def cute_runtime_available() -> bool:
    """Whether upstream's CuTe DSL runtime imports (`cuda.bindings.driver` and `cutlass.cute`; cached)."""
    try:
        import cuda.bindings.driver  # noqa: F401, PLC0415
        import cutlass.cute  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001  (any import failure means "not available")
        return False
    return True


def route_groups(t: int) -> int:
    """Number of upstream route groups (64 key blocks of 64 tokens each) for sequence length t."""
    blocks = -(-t // _ROUTE_BLOCK)
    return -(-blocks // _ROUTE_GROUP)


def unsupported_reason(q: torch.Tensor, kv_splits: int, sink_tokens: int = 0, sink_start: int | None = None,
                       *, contiguous: bool | None = None) -> str | None:
    """Why upstream cannot run this call, or None if it can. Pure: records nothing.

    q stands for q, k and v: the public wrappers have already checked that they share shape, dtype and
    device, and made them contiguous. ``contiguous=True`` says q will be made contiguous before the call (a
    caller asking ahead of the public wrapper)."""
    if not importable():
        return "upstream sol_attn package is not importable"
    cap = device_capability(q.device)
    if cap is None:
        return f"upstream needs CUDA tensors, got device {q.device.type}"
    major, minor = cap
    if major < 8:
        return f"upstream needs compute capability >= 8.0, got {major}.{minor}"
    if q.dtype != torch.bfloat16:
        return f"upstream supports bf16 only, got {q.dtype}"
    if q.dim() != 4:
        return f"upstream needs 4-D [B, T, H, {HEAD_DIM}] inputs, got shape {tuple(q.shape)}"
    if q.shape[-1] != HEAD_DIM:
        return f"upstream supports head dim {HEAD_DIM} only, got {q.shape[-1]}"
    t = q.shape[1]
    if t < 1:
        return f"upstream needs sequence length T >= 1, got {t}"
    if not (q.is_contiguous() if contiguous is None else contiguous):
        return "upstream needs contiguous inputs"
    if not 0 <= sink_tokens <= t:
        return f"upstream needs sink_tokens in [0, T={t}], got {sink_tokens}"
    if sink_start is not None:
        if not 0 <= sink_start <= t:
            return f"upstream needs sink_start None or in [0, T={t}], got {sink_start}"
        if sink_start + sink_tokens > t:
            return (f"upstream needs sink_start + sink_tokens <= T={t}, got {sink_start} + {sink_tokens} = "
                    f"{sink_start + sink_tokens}")
    if kv_splits not in KV_SPLITS:
        return f"upstream needs kv_splits in {{1, 2, 4}}, got {kv_splits}"
    if kv_splits != 1:
        arch = f"{major}.{minor}"
        if (major, minor) != KV_SPLIT_ARCH:
            return f"upstream kv_splits={kv_splits} needs SM 9.0 (kv_splits > 1 is SM90 only), got SM {arch}"
        if not cute_runtime_available():
            return (f"upstream kv_splits={kv_splits} needs the CuTe DSL backend, whose runtime (cuda.bindings, "
                    f"cutlass.cute) does not import; the Triton backend supports kv_splits=1 only")
        groups = route_groups(t)
        if kv_splits > groups:
            return (f"upstream kv_splits={kv_splits} needs at least {kv_splits} N64 route groups (one per KV "
                    f"split, T > {(kv_splits - 1) * _ROUTE_BLOCK * _ROUTE_GROUP}), got {groups} route group(s) "
                    f"for T={t}")
    return None


def record_fallback(reason: str) -> None:
    FALLBACKS.record(reason)


def call(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start) -> torch.Tensor:
    """Run the upstream kernel on [B, T, H, 128] bf16 CUDA tensors."""
    import sol_attn as upstream_sol_attn  # noqa: PLC0415  (optional dependency)

    return upstream_sol_attn.sol_attn(
        q, k, v, scale=scale, tau=tau, thresh_type=thresh_type, kv_splits=kv_splits,
        sink_tokens=sink_tokens, sink_start=sink_start,
    )
