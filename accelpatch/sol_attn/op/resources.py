"""Resource model of the Triton Sol-Attn kernel: the tiles a GPU target can hold, and why a call cannot run.

One program keeps its query block q [64, BLOCK_D] in shared memory and streams the exact key blocks in sub-tiles
K, V [BLOCK_N, BLOCK_D] through Triton's software pipeline (cp.async, `num_stages` deep); the route group's block
summaries kc, vc [GROUP, BLOCK_D] and the probability tile p [64, BLOCK_N] need shared memory too.
`shared_bytes` is the compiler's allocation for those tiles as measured with Triton 3.9 (Ampere-style pipelining,
used on sm_8x and for fp32 everywhere: num_stages - 1 K/V buffers plus p; Hopper's wgmma path: num_stages buffers
plus kc, vc). It is an upper bound, checked against compiled kernels at every configuration the package launches
(tests/ops/test_sol_attn_aot.py), never more than _SLACK above them. `choose_tiles` takes the first candidate that
fits the target's per-block opt-in limit; `unfit_reason` says why none does: such a call runs the PyTorch
implementation instead (dispatch.py), recorded in `FALLBACKS` and warned once per reason.
Registers never stop a launch (ptxas caps them so that a block fits the SM's 65,536 and spills the rest to the
stack); with shared memory they set how many blocks an SM holds (`blocks_per_sm`, from compiled numbers, shown by
benchmarks/bench_sol_attn_triton_aot.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from accelpatch.sol_attn.op.fallbacks import ImplFallbacks
from accelpatch.sol_attn.op.options import BLOCK

# Per-block shared memory a kernel may opt in to, by compute capability major*10 + minor (CUDA programming guide,
# "Technical Specifications per Compute Capability"); Triton checks the device's value at the first launch.
SHARED_LIMIT = {80: 166_912, 86: 101_376, 87: 166_912, 89: 101_376, 90: 232_448, 100: 232_448, 103: 232_448,
                120: 101_376}
REGISTERS_PER_SM = 65_536
GROUP = 32  # route-group size in 64-blocks on CUDA (kc, vc tiles of GROUP rows)
# Candidates in order of preference: (BLOCK_N keys per sub-tile, num_stages, GROUP). Pipelined loads first, then
# smaller key sub-tiles, then smaller route groups (speed only), unpipelined last.
CANDIDATES = ((64, 2, GROUP), (32, 2, GROUP), (16, 2, GROUP), (16, 2, 16), (32, 1, GROUP), (16, 1, 16))
_SLACK = 9 * 1024  # the model may exceed the compiled allocation by at most this much (tests check it)
_SCRATCH = 256  # reduction scratch the Ampere-style pipelined kernels allocate beside the tiles


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: the key sub-tile, pipeline depth, route group, warps, and padded head dim."""

    block_n: int
    num_stages: int
    group: int
    num_warps: int
    block_d: int


def block_d_of(head_dim: int) -> int:
    """The kernel's padded head dim: the next power of two, at least 16."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def num_warps_of(block_d: int) -> int:
    return 4 if block_d <= 64 else 8


def shared_bytes(arch: int, dtype: torch.dtype, block_d: int, block_n: int, num_stages: int, group: int) -> int:
    """Dynamic shared memory (bytes) the compiled kernel asks for with these tiles (an upper bound). q stays for
    the whole program; the route group's kc, vc and the pipelined K/V buffers share the rest. Measured on sm_80,
    sm_86, sm_90, sm_100 and sm_120: bf16/fp16 lower to wgmma on sm_90, whose pipeline holds num_stages buffers
    beside kc, vc; to mma.sync on sm_8x and sm_12x, and fp32 "ieee" dots to plain FMA everywhere, both with
    num_stages - 1 buffers plus p reusing kc, vc's space. Other targets (sm_100's bf16/fp16) take the larger of
    the two forms."""
    esz = dtype.itemsize
    q = BLOCK * block_d * esz
    kv = 2 * block_n * block_d * esz
    kcvc = 2 * group * block_d * esz
    if num_stages <= 1:
        return q + max(kv, kcvc)
    hopper = q + num_stages * kv + kcvc
    ampere = q + max((num_stages - 1) * kv + BLOCK * block_n * esz + _SCRATCH, kcvc)
    if arch // 10 in (8, 12) or dtype == torch.float32:
        return ampere
    if arch == 90:
        return hopper
    return max(hopper, ampere)


def blocks_per_sm(arch: int, shared: int, registers: int, num_warps: int) -> int:
    """Blocks of a compiled kernel one SM holds at once (occupancy): bounded by its shared memory (the per-block
    limit plus the 1 KiB the runtime reserves per block), by its 65,536 registers (allocated per warp in units of
    256) and by 2,048 threads."""
    by_shared = (shared_limit(arch) + 1024) // (shared + 1024)
    warp_registers = -(-registers * 32 // 256) * 256
    by_registers = REGISTERS_PER_SM // (warp_registers * num_warps)
    return min(by_shared, by_registers, 2048 // (32 * num_warps))


def shared_limit(arch: int) -> int:
    """Per-block opt-in shared memory of a target; the nearest known lower architecture for an unknown one."""
    if arch in SHARED_LIMIT:
        return SHARED_LIMIT[arch]
    known = [a for a in SHARED_LIMIT if a <= arch]
    return SHARED_LIMIT[max(known)] if known else 48 * 1024


class TilesDoNotFit(ValueError):
    """No tile configuration of the Triton kernel fits the target; the message says what is needed and allowed."""


def _fit(dtype: torch.dtype, head_dim: int, arch: Optional[int]) -> tuple[Optional[Tiles], Optional[str]]:
    """(tiles, None) for the first candidate that fits `arch` (None: no limit, e.g. the interpreter), else
    (None, why not)."""
    block_d = block_d_of(head_dim)
    for block_n, stages, group in CANDIDATES:
        if arch is None or shared_bytes(arch, dtype, block_d, block_n, stages, group) <= shared_limit(arch):
            return Tiles(block_n, stages, group, num_warps_of(block_d), block_d), None
    smallest = min(shared_bytes(arch, dtype, block_d, n, s, g) for n, s, g in CANDIDATES)
    return None, (
        f"the Triton sol_attn kernel cannot hold a head dim {head_dim} {str(dtype).replace('torch.', '')} query "
        f"block on sm_{arch}: its smallest tiles need {smallest:,} B of shared memory per block, the limit is "
        f"{shared_limit(arch):,} B; head dims up to {max_head_dim(dtype, arch)} fit this dtype there (bf16/fp16 "
        f"need half the memory of fp32), or use impl='torch'")


def choose_tiles(dtype: torch.dtype, head_dim: int, arch: Optional[int]) -> Tiles:
    """The first candidate tiles whose shared memory fits `arch`; raises TilesDoNotFit (with the numbers and
    the head dims that do fit) when none does."""
    tiles, reason = _fit(dtype, head_dim, arch)
    if tiles is None:
        raise TilesDoNotFit(reason)
    return tiles


def max_head_dim(dtype: torch.dtype, arch: int) -> int:
    """The largest padded head dim (a power of two) whose smallest tiles fit `arch`; 0 if none."""
    best, block_d = 0, 16
    while block_d <= 1 << 14:
        if min(shared_bytes(arch, dtype, block_d, n, s, g) for n, s, g in CANDIDATES) > shared_limit(arch):
            break
        best, block_d = block_d, block_d * 2
    return best


def device_arch(device: torch.device) -> Optional[int]:
    """Compute capability major*10 + minor of a CUDA device; None for any other device (no limit applies)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def unfit_reason(q: torch.Tensor) -> Optional[str]:
    """Why the Triton kernel cannot run on q's device at q's dtype and head dim (None when it can). Pure."""
    arch = device_arch(q.device)
    return None if arch is None else _fit(q.dtype, q.shape[-1], arch)[1]


FALLBACKS = ImplFallbacks("sol_attn runs the PyTorch implementation instead of the Triton kernel")


def record_fallback(reason: str) -> None:
    """A call that would have run the Triton kernel runs the PyTorch implementation: recorded in ``FALLBACKS``."""
    FALLBACKS.record(reason)
