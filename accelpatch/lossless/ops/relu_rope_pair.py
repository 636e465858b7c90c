"""``relu_rope_pair``: SANA-Video's linear-attention prologue, ReLU, interleaved RoPE and the float32 upcast of query
and key, in one pass."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.reference import rotary_interleaved
from accelpatch.lossless.kernels.tables import unary_table
from accelpatch.lossless.verify import FusedOp, register


def relu_rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """SANA-Video's linear-attention prologue on ``[B, N, H, D]`` query and key: ReLU, then RoPE of each, the
    rotated pair upcast to float32 as the processor does after permuting (``.float()`` keeps the layout).
    Returns ``(relu(query), relu(key), rotated query as float32, rotated key as float32)``."""
    query = F.relu(query)
    key = F.relu(key)
    return query, key, rotary_interleaved(query, freqs_cos, freqs_sin).float(), \
        rotary_interleaved(key, freqs_cos, freqs_sin).float()


RELU_ROPE_PAIR = register(FusedOp(
    "relu_rope_pair", relu_rope_pair,
    "ReLU, interleaved RoPE and the float32 upcast of query and key in one pass (SANA-Video linear attention)"))


def _why_cpu(query, key, freqs_cos, freqs_sin) -> Optional[str]:
    reason = cpu.why_rope("relu_rope_pair", query, key, freqs_cos, freqs_sin)
    if reason is None and query.dtype == torch.bfloat16:
        _, reason = cpu.table("relu")
    return reason


def _keeps_cpu(device: torch.device, dtype: torch.dtype) -> None:
    """For a bf16 model, at apply(): eager's ReLU table and whether the kernels' formula reproduces it."""
    if dtype == torch.bfloat16 and cpu.table("relu")[0] is not None:
        cpu.relu_formula_matches()


def _relu_table_arg(query: torch.Tensor) -> Optional[torch.Tensor]:
    """The ReLU table the kernel takes: None (null) for float32, or for bf16 when the formula matched."""
    if query.dtype != torch.bfloat16 or cpu.relu_formula_matches():
        return None
    return cpu.table("relu")[0]


@RELU_ROPE_PAIR.kernel(cpu.LIBRARY, unsupported=_why_cpu, keeps=_keeps_cpu)
def relu_rope_pair_cpu(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """The chain in one pass over query and key, sharing each table load."""
    args = (query, key, freqs_cos, freqs_sin)
    prep = cpu.prepared(RELU_ROPE_PAIR, args, lambda lib: lib.relu_rope.default,
                        lambda: cpu.rope_plan(args, relu_rope_pair))
    outs = cpu.outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, _relu_table_arg(query), prep.size, prep.strides)
    return outs


@RELU_ROPE_PAIR.kernel(triton.LIBRARY, unsupported=triton.why_rope,
                       keeps=triton.keeps_table("relu", F.relu))
def relu_rope_pair_cuda(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """ReLU and interleaved RoPE of query and key in one launch:
    ``(relu(query), relu(key), rotated query as float32, rotated key as float32)``."""
    args = (query, key, freqs_cos, freqs_sin)
    outs = empty_like_eager(relu_rope_pair, args, query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    mode = triton.ROPE_MODES[torch.promote_types(query.dtype, freqs_cos.dtype)]
    if query.dtype == torch.bfloat16:
        table, _ = unary_table("relu", F.relu, query.device)
        keeps = False
    else:
        table = outs[0]  # unused by the fp32 kernel
        keeps = bool(triton.relu_fp32_sign(query.device)[0])
    cos = freqs_cos.expand(b, n, h, d)
    sin = freqs_sin.expand(b, n, h, d)
    size = triton.block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // size))
    strides = [s for t in (query, key, cos, sin, *outs) for s in t.stride()]
    triton.jit()._relu_rope_pair_kernel[grid](query, key, cos, sin, *outs, table, n, *strides, H=h, D=d, MODE=mode,
                                              NEG_ZERO_KEEPS_SIGN=keeps, BLOCK=size, **triton.LAUNCH)
    return outs


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    q, cos, sin = inputs["q"], inputs["cos"], inputs["sin"]
    return [(relu_rope_pair, (q, q.flip(1), cos, sin), lambda a: cpu.rope_plan(a, relu_rope_pair),
             lambda lib, a, o, size, st: lib.relu_rope(*a, *o, None, size, st))]  # float32: no ReLU table
