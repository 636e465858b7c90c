"""How the device's eager complex128 multiply rounds ``(a + bi)(c + di)``, probed, so a kernel can replay it.

c10::complex computes ``a*c - b*d`` and ``a*d + b*c``, and whether the compiler contracts either into an FMA is
the build's choice: measured on this CPU (torch 2.13, AVX-512), the vectorised loop rounds every product and the
scalar loop (strided pairs, short rows) computes ``fma(a, c, -(b*d))`` and ``fma(a, d, b*c)``; nvcc contracts by
default, in a form only the device can tell. Each part is classified as one of three forms (``SEPARATE``,
``FMA_FIRST``: the first product kept exact, ``FMA_SECOND``: the second), per loop, on random finite values where
the forms differ (the expected values are exact: Python's Fraction, rounded once).
"""
from __future__ import annotations

import threading
from fractions import Fraction
from typing import Optional

import torch

SEPARATE, FMA_FIRST, FMA_SECOND = 0, 1, 2
FORMS = ("separately rounded", "fma on the first product", "fma on the second product")
_LOCK = threading.Lock()
_MODES: dict[str, tuple[Optional[tuple[int, int]], Optional[str]]] = {}


def _fma(x: float, y: float, z: float) -> float:
    return float(Fraction(x) * Fraction(y) + Fraction(z))  # int / int true division rounds to nearest even


def _candidates(a, b, c, d):
    """Per part (real, imaginary), the values each form gives, indexed by form."""
    real = ([x * z - y * w for x, y, z, w in zip(a, b, c, d)],
            [_fma(x, z, -(y * w)) for x, y, z, w in zip(a, b, c, d)],
            [_fma(-y, w, x * z) for x, y, z, w in zip(a, b, c, d)])
    imag = ([x * w + y * z for x, y, z, w in zip(a, b, c, d)],
            [_fma(x, w, y * z) for x, y, z, w in zip(a, b, c, d)],
            [_fma(y, z, x * w) for x, y, z, w in zip(a, b, c, d)])
    return real, imag


def _classify(got: list, forms) -> Optional[int]:
    for mode, want in enumerate(forms):
        if got == want:
            return mode
    return None


def loop_modes(device: torch.device, n: int = 1024) -> dict[str, tuple[Optional[int], Optional[int]]]:
    """``{"vectorised": (real form, imaginary form), "scalar": ...}`` of eager's complex128 multiply on ``device``
    (None where no form matches), through a contiguous and a strided (element-by-element on CPU) input."""
    g = torch.Generator().manual_seed(1234)
    a, b, c, d = torch.randn(4, n, dtype=torch.float64, generator=g)
    real, imag = _candidates(a.tolist(), b.tolist(), c.tolist(), d.tolist())
    x, f = torch.complex(a, b), torch.complex(c, d)
    spread_x = torch.zeros(2 * n, dtype=torch.complex128, device=device)
    spread_f = torch.zeros(2 * n, dtype=torch.complex128, device=device)
    spread_x[0::2], spread_f[0::2] = x.to(device), f.to(device)
    out = {}
    with torch.no_grad():
        for name, product in (("vectorised", x.to(device) * f.to(device)),
                              ("scalar", spread_x[0::2] * spread_f[0::2])):
            product = product.cpu()
            out[name] = (_classify(product.real.tolist(), real), _classify(product.imag.tolist(), imag))
    return out


def complex_mul_modes(device: torch.device) -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """``((real form, imaginary form), None)`` the device's eager complex128 multiply uses, or ``(None, reason)``.

    On CUDA both loops run the same functor, so they must agree (else no kernel reproduces eager everywhere). On CPU
    (where the Triton kernels run only in the interpreter, for the tests) the vectorised loop's forms are taken: the
    models' widths (head dims 128, 256: 64 or 128 pairs) take it; strided pairs and short rows do not."""
    key = str(device)
    with _LOCK:
        if key in _MODES:
            return _MODES[key]
    loops = loop_modes(device)
    vec, scalar = loops["vectorised"], loops["scalar"]
    if None in vec or (device.type != "cpu" and None in scalar):
        answer = (None, f"eager complex128 multiply on {device.type} is none of the forms "
                        f"{', '.join(FORMS)} ({loops})")
    elif device.type != "cpu" and vec != scalar:
        answer = (None, f"eager complex128 multiply rounds differently in its vectorised and scalar loops on "
                        f"{device.type} ({loops}), so no kernel reproduces it everywhere")
    else:
        answer = (vec, None)
    with _LOCK:
        return _MODES.setdefault(key, answer)
