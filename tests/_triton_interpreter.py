"""What the installed Triton interpreter can run, found by running it (never by its version string).

``scalar_loop_bounds()``: Triton's interpreter holds every scalar (``tl.program_id``, a scalar argument) as a
1-element array and converts a tensor used as a loop bound with ``int(array)``. NumPy 2.4 refuses ``int()`` of an
array with ndim > 0, so with triton 3.6's interpreter any kernel whose ``range`` bounds are runtime scalars (legal
Triton: dynamic loop bounds) fails with "only 0-dimensional arrays can be converted to Python scalars"; triton 3.9's
interpreter squeezes the array first. That is the interpreter's bug, not the kernel's: where the probe fails, the
tests install triton 3.9's conversion into the interpreter for the test process (:func:`fix_scalar_loop_bounds`) and
probe again, so the kernels' logic is still checked on that triton.

``fma_is_fused()``: ``tl.fma`` computes ``x * y + z`` with one rounding on GPUs and in triton 3.9's interpreter;
older interpreters (3.4, 3.6) compute it in NumPy as a rounded product plus a rounded sum, two roundings, so a test
that tells a contracted kernel from a separately rounded one cannot run there.
"""
from __future__ import annotations

import functools
import os

FMA_REASON = ("this Triton interpreter computes tl.fma as a rounded product plus a rounded sum (two roundings; "
              "triton 3.4/3.6 do, 3.9 does not): it cannot tell an fma kernel from a separately rounded one")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _loop_bound_probe() -> bool:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def count_from_program_id(OUT, N):
        pid = tl.program_id(0)
        acc = tl.zeros([], tl.int32)
        for _ in range(pid, N):
            acc += 1
        tl.store(OUT + pid, acc)

    out = torch.zeros(3, dtype=torch.int32)
    try:
        count_from_program_id[(3,)](out, 5)
    except Exception as error:  # the interpreter wraps the TypeError in its InterpreterError
        if "0-dimensional arrays" in str(error):
            return False
        raise
    return out.tolist() == [5, 4, 3]


@functools.lru_cache(maxsize=None)
def scalar_loop_bounds() -> bool:
    """True when this interpreter runs a loop whose bounds are runtime scalars."""
    return _loop_bound_probe()


def fix_scalar_loop_bounds() -> str | None:
    """Where the interpreter cannot use runtime scalars as loop bounds (see the module doc), give it triton 3.9's
    conversion (``int(data.squeeze())``) for this process; returns what was done (None: nothing was needed).
    Raises when the fix does not make the probe pass (then the interpreter differs in some other way)."""
    if not interpreting() or scalar_loop_bounds():
        return None
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_tensor_with_scalar_index
    scalar_loop_bounds.cache_clear()
    if not scalar_loop_bounds():
        raise RuntimeError("the Triton interpreter still refuses runtime-scalar loop bounds after the fix")
    return ("this Triton interpreter converts a scalar loop bound with int() of a 1-element array, which NumPy >= 2.4 "
            "refuses: the tests gave it triton 3.9's int(array.squeeze())")


@functools.lru_cache(maxsize=None)
def fma_is_fused() -> bool:
    """True when this interpreter's ``tl.fma`` rounds once: (1 + 2^-23)^2 - (1 + 2^-22) is 2^-46 with one rounding,
    0 with a rounded product."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def fma(X, Z, OUT):
        x = tl.load(X)
        tl.store(OUT, tl.fma(x, x, tl.load(Z)))

    x = torch.tensor([1 + 2.0 ** -23], dtype=torch.float32)
    z = torch.tensor([-(1 + 2.0 ** -22)], dtype=torch.float32)
    out = torch.zeros(1, dtype=torch.float32)
    fma[(1,)](x, z, out)
    return out.item() == 2.0 ** -46
