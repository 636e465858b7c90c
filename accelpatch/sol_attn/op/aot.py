"""Ahead-of-time inspection of the Triton Sol-Attn kernel on a machine without a GPU.

`capture_launch` runs the package's own host code (`sol_attn_triton`, which picks the tiles) on small CPU tensors
under a stand-in Triton driver and stops the launch at its compile step; `inspect_launch` compiles it for the target
with Triton's bundled ptxas and reads the resource usage (dynamic shared memory, registers and stack per thread,
cp.async / wgmma instructions). The generic machinery (stand-in driver, capture, compile, usage) is
accelpatch.core.triton_aot, shared with the fused kernels; this module only knows Sol-Attn's launch.
TRITON_INTERPRET must be unset before the kernel module is imported (the interpreter replaces the JIT function).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from accelpatch.core import triton_aot
from accelpatch.core.triton_aot import TARGETS, StandInDriver as _StandInDriver, Usage, _resource_usage  # noqa: F401 (public)


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
        return self._capture().constexpr(name)

    def _capture(self) -> triton_aot.Capture:
        from accelpatch.sol_attn.op.triton_impl import _sol_attn_fwd  # noqa: PLC0415

        return triton_aot.Capture(_sol_attn_fwd, self.arch, self.signature, self.constexprs, self.attrs,
                                  self.options)


def capture_launch(arch: int, dtype: torch.dtype, head_dim: int, kv_splits: int = 1, seq_len: int = 65 * 64,
                   heads: int = 2) -> Launch:
    """The launch `sol_attn_triton` makes for [1, seq_len, heads, head_dim] inputs on target `arch`
    (raises resources.TilesDoNotFit where the package refuses it)."""
    from accelpatch.sol_attn.op.triton_impl import _sol_attn_fwd, sol_attn_triton  # noqa: PLC0415

    x = torch.randn(1, seq_len, heads, head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    captured = triton_aot.capture(
        arch, [_sol_attn_fwd], lambda: sol_attn_triton(x, x, x, head_dim ** -0.5, 1.0, "diag", 0, None,
                                                       kv_splits=kv_splits))
    c = captured[-1]
    return Launch(arch, dtype, head_dim, kv_splits, c.signature, c.constexprs, c.attrs, c.options)


def inspect_launch(launch: Launch) -> Usage:
    """Compile `launch` for its target (Triton's on-disk cache makes a repeat fast) and read its resources."""
    return triton_aot.inspect(launch._capture())
