"""How the device's eager float32 ``addcmul_`` rounds ``self + t1 * t2``, probed, so a kernel can replay it.

LTX-2.3's split RoPE (diffusers ``apply_split_rotary_emb``) adds its second product by ``addcmul_``. ATen computes
``self + value * t1 * t2`` and whether that becomes an FMA is the build's choice: measured on this CPU (torch
2.13, AVX-512), both the vectorised and the scalar loop keep the product exact (one rounding: an fma); CUDA's
functor rounds ``t1 * t2`` before the add (as read, not measured here). Each loop is classified as ``SEPARATE``
(the product rounded, then the sum) or ``FMA`` on random finite float32 values where the two forms differ.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

SEPARATE, FMA = 0, 1
FORMS = ("the product rounded, then the sum", "an fma (the product kept exact)")
_LOCK = threading.Lock()
_FORMS: dict[str, tuple[Optional[int], Optional[str]]] = {}


def _classify(got: torch.Tensor, separate: torch.Tensor, fused: torch.Tensor) -> Optional[int]:
    if torch.equal(got, separate):
        return SEPARATE
    if torch.equal(got, fused):
        return FMA
    return None


def loop_forms(device: torch.device, n: int = 1024) -> dict[str, Optional[int]]:
    """``{"vectorised": form, "scalar": form}`` of eager float32 ``addcmul_`` on ``device`` (None where neither form
    matches), through a contiguous and a strided (element-by-element on CPU) operand set. The expected values are
    computed on CPU: the separate form as two eager ops, the fma in float64 (the product of two floats is exact
    there; the sum's rounding to double and then to float differs from one rounding with a probability ~2^-29)."""
    g = torch.Generator().manual_seed(4321)
    base, t1, t2 = torch.randn(3, n, generator=g)
    t1 = -t1  # as the split RoPE's -sin
    separate = base + t1 * t2
    fused = (base.double() + t1.double() * t2.double()).float()
    out = {}
    with torch.no_grad():
        for name, stride in (("vectorised", 1), ("scalar", 2)):
            spread = [torch.zeros(stride * n, device=device) for _ in range(3)]
            for s, v in zip(spread, (base, t1, t2)):
                s[0::stride] = v.to(device)
            self_ = spread[0][0::stride]
            self_.addcmul_(spread[1][0::stride], spread[2][0::stride])
            out[name] = _classify(self_.cpu(), separate, fused)
    return out


def addcmul_form(device: torch.device) -> tuple[Optional[int], Optional[str]]:
    """``(form, None)`` of the device's eager float32 ``addcmul_`` (the same in its vectorised and scalar loops),
    or ``(None, reason)`` where a loop is neither form or the two loops differ (no one kernel replays it then)."""
    key = str(device)
    known = _FORMS.get(key)  # every launch asks: a plain dict read (atomic); only the first probe takes the lock
    if known is not None:
        return known
    loops = loop_forms(device)
    if None in loops.values():
        answer = (None, f"eager float32 addcmul_ on {device.type} is neither {FORMS[0]} nor {FORMS[1]} ({loops})")
    elif loops["vectorised"] != loops["scalar"]:
        answer = (None, f"eager float32 addcmul_ rounds differently in its vectorised and scalar loops on "
                        f"{device.type} ({loops}), so no kernel reproduces it everywhere")
    else:
        answer = (loops["vectorised"], None)
    with _LOCK:
        return _FORMS.setdefault(key, answer)
