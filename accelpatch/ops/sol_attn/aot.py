"""Ahead-of-time inspection of the Triton Sol-Attn kernel on a machine without a GPU.

`capture_launch` runs the package's own host code (`sol_attn_triton`, which picks the tiles) on small CPU tensors
under a stand-in Triton driver that reports only the target, and stops the launch at its compile step: what comes
back is exactly what Triton's binder computed for that call (signature, constexprs, divisibility attributes,
options). `inspect_launch` compiles it for the target with Triton's bundled ptxas and reads the resource usage:
dynamic shared memory (what Triton checks against the device's limit at the first launch), registers and stack
per thread (cuobjdump), and the cp.async / wgmma instructions in the PTX. Nothing touches a device.
TRITON_INTERPRET must be unset before the kernel module is imported (the interpreter replaces the JIT function).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

import torch

TARGETS = (80, 90)  # A100 (sm_80), H100/H200 (sm_90a)


@dataclass(frozen=True)
class Launch:
    """One captured launch: the target and what the binder computed."""

    arch: int
    dtype: torch.dtype
    head_dim: int
    kv_splits: int
    signature: dict
    constexprs: dict
    attrs: dict
    options: object

    def constexpr(self, name: str):
        """A constexpr argument by name (None if the kernel has no such parameter)."""
        from .triton_impl import _sol_attn_fwd  # noqa: PLC0415

        names = _sol_attn_fwd.arg_names
        return self.constexprs.get((names.index(name),)) if name in names else None


@dataclass(frozen=True)
class Usage:
    """Resource usage of one compiled launch."""

    shared: int
    registers: int
    stack: int
    cp_async: int
    wgmma: int
    compile_s: float


class _StandInDriver:
    """Reports a CUDA target, device 0 and stream 0; anything else would need a GPU."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def _stand_in(arch: int, captured: list):
    from triton.runtime import driver  # noqa: PLC0415

    from .triton_impl import _sol_attn_fwd  # noqa: PLC0415

    if os.environ.get("TRITON_INTERPRET") == "1" or not hasattr(_sol_attn_fwd, "device_caches"):
        raise RuntimeError("ahead-of-time inspection needs TRITON_INTERPRET unset before accelpatch is imported")

    params = inspect.signature(type(_sol_attn_fwd)._do_compile).parameters  # bound by name, across Triton versions

    def capture(*args, **kwargs):
        call = dict(zip(list(params)[1:], args), **kwargs)
        captured.append((call["signature"], call["constexprs"], call["attrs"], call["options"]))
        return None  # no kernel: run() returns before any launch

    previous = driver._active  # reset_active() would build the real driver, which fails without a GPU
    driver.set_active(_StandInDriver(arch))
    _sol_attn_fwd.device_caches.clear()  # binders are made per target
    _sol_attn_fwd._do_compile = capture
    try:
        yield
    finally:
        del _sol_attn_fwd._do_compile
        _sol_attn_fwd.device_caches.clear()
        driver._active = previous


def capture_launch(arch: int, dtype: torch.dtype, head_dim: int, kv_splits: int = 1, seq_len: int = 65 * 64,
                   heads: int = 2) -> Launch:
    """The launch `sol_attn_triton` makes for [1, seq_len, heads, head_dim] inputs on target `arch`
    (raises resources.TilesDoNotFit where the package refuses it)."""
    from .triton_impl import sol_attn_triton  # noqa: PLC0415

    captured: list = []
    x = torch.randn(1, seq_len, heads, head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    with _stand_in(arch, captured):
        sol_attn_triton(x, x, x, head_dim ** -0.5, 1.0, "diag", 0, None, kv_splits=kv_splits)
    signature, constexprs, attrs, options = captured[-1]
    return Launch(arch, dtype, head_dim, kv_splits, signature, constexprs, attrs, options)


def inspect_launch(launch: Launch) -> Usage:
    """Compile `launch` for its target (Triton's on-disk cache makes a repeat fast) and read its resources."""
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415

    from .triton_impl import _sol_attn_fwd  # noqa: PLC0415

    start = time.perf_counter()
    src = triton.compiler.ASTSource(fn=_sol_attn_fwd, signature=launch.signature, constexprs=launch.constexprs,
                                    attrs=launch.attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", launch.arch, 32), options=launch.options.__dict__)
    seconds = time.perf_counter() - start
    registers, stack = _resource_usage(kernel.asm["cubin"])
    ptx = kernel.asm["ptx"]
    return Usage(shared=int(kernel.metadata.shared), registers=registers, stack=stack,
                 cp_async=len(re.findall(r"cp\.async\.c[ag]", ptx)), wgmma=ptx.count("wgmma.mma_async"),
                 compile_s=seconds)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) per thread from `cuobjdump --dump-resource-usage` (bundled with Triton)."""
    import triton  # noqa: PLC0415

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    return int(re.search(r"REG:(\d+)", text).group(1)), int(re.search(r"STACK:(\d+)", text).group(1))
