"""The CUDA (Triton) kernel library of the lossless fused ops: what every op's Triton kernel shares.

:data:`LIBRARY` (the checks every kernel makes), the launch settings and iteration plans, the element-wise launch and
the interleaved-RoPE launch several ops share. The kernels themselves (one launch each, same signatures and outputs
as the op's reference chain: values, dtypes, shapes, strides) are in the ops' files
(``accelpatch/lossless/ops/<name>.py``), registered on their op with ``@OP.kernel(triton_kernels.LIBRARY, ...)``.

Outputs are allocated with eager's strides (``layout.empty_like_eager``); bf16 SiLU/sigmoid/ReLU gather from the
device's own eager table (``tables.unary_table``); the kernels (``triton_jit``, imported on first use by :func:`jit`
so importing accelpatch never imports Triton) round exactly where eager does and are launched with
``enable_fp_fusion=False``. A kernel's ``unsupported`` says why an input cannot run here (None when it can); the
kernels assume it was asked. On CPU the kernels run only in Triton's interpreter (TRITON_INTERPRET=1), which is how
the tests check them.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels.library import KernelLibrary
from accelpatch.lossless.kernels.operands import foreign_operand
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table

LAUNCH = dict(enable_fp_fusion=False, num_warps=4)
MAX_BLOCK = 1024
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
ROPE_MODES = {torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}  # triton_jit._rotate MODE, promoted dtype
_LOCK = threading.Lock()
_RELU_FP32: dict[str, tuple[Optional[bool], Optional[str]]] = {}


def jit():
    """The ``@triton.jit`` kernels (:mod:`.triton_jit`), imported on first use."""
    from accelpatch.lossless.kernels import triton_jit  # noqa: PLC0415

    return triton_jit


def block(n: int) -> int:
    """Elements per program along a row of n: the largest block (1024 down to 128) that pads the row by at most an
    eighth (SANA's 2240 channels: 256, 1120 RoPE pairs: 128 -> 1152), else the least padding; short rows one
    power-of-two block (at least 16)."""
    if n <= MAX_BLOCK:
        return max(16, 1 << max(0, int(n) - 1).bit_length())
    padded = {b: -(-n // b) * b for b in (1024, 512, 256, 128)}
    fits = [b for b, p in padded.items() if 8 * (p - n) <= n]
    return fits[0] if fits else min(padded, key=lambda b: (padded[b], -b))


# ------------------------------------------------------------------------------------------------ what can run

def _tensors(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def _common(args) -> Optional[str]:
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    tensors = _tensors(args)
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"inputs on several devices ({', '.join(sorted(map(str, devices)))})"
    device = devices.pop()
    foreign = foreign_operand(tensors, device.type)  # before anything reads an address
    if foreign:
        return foreign
    if any(t.is_neg() or t.is_conj() for t in tensors):
        return "an input is a lazily negated or conjugated view (the kernels read storage as it is)"
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "the Triton kernels run on CUDA (on CPU only in the interpreter, TRITON_INTERPRET=1)"
    elif device.type != "cuda":
        return f"the Triton kernels run on CUDA, not {device.type}"
    if any(t.requires_grad for t in tensors):
        return "an input requires grad (the fused kernels have no backward)"
    if any(t.dim() > 4 for t in tensors):
        return "more than 4 dimensions"
    return None


def broadcast(*tensors) -> Optional[torch.Size]:
    try:
        return torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        return None


def relu_fp32_sign(device: torch.device) -> tuple[Optional[bool], Optional[str]]:
    """Whether the device's eager fp32 ReLU keeps -0.0 as -0.0 (True) or gives +0.0, probed through its contiguous
    and strided loops; (None, reason) when the two loops disagree or anything else is not clamp_min(x, 0)."""
    key = str(device)
    with _LOCK:
        if key in _RELU_FP32:
            return _RELU_FP32[key]
    probe = torch.tensor([-0.0, 0.0, -1.0, 2.0, float("nan"), float("-inf")] * 16, device=device)
    spread = torch.zeros(2 * probe.numel(), device=device)
    spread[0::2] = probe
    results = []
    for out in (F.relu(probe), F.relu(spread[0::2])):
        out = out[:6].cpu()
        ok = (out[1:4].tolist() == [0.0, 0.0, 2.0] and bool(out[4].isnan()) and out[5].item() == 0.0
              and not any(out[i].item() == 0.0 and torch.signbit(out[i]) for i in (1, 2, 5)))
        results.append(bool(torch.signbit(out[0])) if ok else None)
    if None in results:
        answer = (None, "eager float32 ReLU on this device is not clamp_min(x, 0)")
    elif results[0] != results[1]:
        answer = (None, "eager float32 ReLU gives -0.0 a different sign in its vectorised and scalar loops on this "
                        "device, so no kernel reproduces it everywhere")
    else:
        answer = (results[0], None)
    with _LOCK:
        return _RELU_FP32.setdefault(key, answer)


def _admits(name: str, check: Callable[..., Optional[str]], args: Sequence, values: int = 0) -> Optional[str]:
    """:data:`LIBRARY`'s check of a kernel's arguments: every argument a tensor but the last ``values`` ones, the
    reasons every kernel shares, then the op's own ``check``."""
    tensor_args = args[:len(args) - values]
    if len(_tensors(tensor_args)) != len(tensor_args):
        return "an argument is not a tensor"
    return _common(args) or check(*args)


#: the Triton kernels' library: ``@OP.kernel(LIBRARY, unsupported=...)`` in an op's file
LIBRARY = KernelLibrary("cuda", "Triton", _admits)


def why_rope(query, key, freqs_cos, freqs_sin, relu: bool = True) -> Optional[str]:
    if query.dtype not in (torch.bfloat16, torch.float32) or key.dtype != query.dtype:
        return f"query/key dtypes {query.dtype}/{key.dtype} (bfloat16 or float32, the same)"
    if query.dim() != 4 or key.shape != query.shape:
        return "query and key must be [B, N, H, D] of one shape"
    b, n, _, d = query.shape
    if d % 2:
        return f"odd head dim {d}"
    if freqs_cos.dtype != freqs_sin.dtype or freqs_cos.dtype not in (torch.bfloat16, torch.float16, torch.float32,
                                                                       torch.float64):
        return f"RoPE table dtypes {freqs_cos.dtype}/{freqs_sin.dtype} (one floating dtype)"
    for t in (freqs_cos, freqs_sin):
        if broadcast(t, torch.empty(b, n, 1, d, device="meta")) != (b, n, 1, d):
            return f"RoPE table of shape {tuple(t.shape)} does not broadcast to [B, N, 1, D] = {[b, n, 1, d]}"
    if torch.promote_types(query.dtype, freqs_cos.dtype) not in ROPE_MODES:
        return f"{query.dtype} query with {freqs_cos.dtype} tables"
    if not relu:
        return None
    if query.dtype == torch.bfloat16:
        return unary_table("relu", F.relu, query.device)[1]
    return relu_fp32_sign(query.device)[1]


def why_same_dtype(*tensors) -> Optional[str]:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(FLOATS):
        return f"dtypes {sorted(map(str, dtypes))} (one of bfloat16, float16, float32 for all inputs)"
    if broadcast(*tensors) is None:
        return "shapes do not broadcast"
    return None


def keeps_table(name: str, fn: Callable) -> Callable:
    """A Triton kernel's ``keeps`` (:attr:`~accelpatch.lossless.kernels.library.Kernel.keeps`) where it gathers from
    the device's eager bf16 table of ``name`` (128 KiB): built at apply() for a bf16 model on that device."""
    def keeps(device, dtype) -> None:
        if dtype == torch.bfloat16:
            unary_table(name, fn, device)
    return keeps


def why_bf16(*tensors, table=("silu", F.silu)) -> Optional[str]:
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return f"bfloat16 only (a table of eager's {table[0]})"
    if broadcast(*tensors) is None:
        return "shapes do not broadcast"
    return unary_table(*table, tensors[0].device)[1]


def why_pair(query, key, dtypes) -> Optional[str]:
    if query.dtype not in dtypes or key.dtype != query.dtype:
        return f"query/key dtypes {query.dtype}/{key.dtype} (one of {', '.join(str(d) for d in dtypes)}, the same)"
    if query.dim() != 4 or key.shape != query.shape:
        return f"query and key must be [B, N, H, D] of one shape (got {tuple(query.shape)}, {tuple(key.shape)})"
    return None


# ------------------------------------------------------------------------------------------------ launches

def _plan(out: torch.Tensor, *inputs: torch.Tensor):
    """4-D sizes and per-tensor strides of the iteration space: every input broadcast to ``out``'s shape, all
    permuted alike so the output's fastest dim comes last (one program writes consecutive addresses)."""
    shape = tuple(out.shape)
    views = [out] + [t.expand(shape) for t in inputs]
    pad = 4 - len(shape)
    sizes = [1] * pad + list(shape)
    strides = [[0] * pad + list(v.stride()) for v in views]
    live = [i for i in range(4) if sizes[i] > 1]
    inner = min(live, key=lambda i: (abs(strides[0][i]), -i)) if live else 3
    order = [i for i in range(4) if i != inner] + [inner]
    sizes = [sizes[i] for i in order]
    strides = [[s[i] for i in order] for s in strides]
    size = block(sizes[3])
    grid = (sizes[0] * sizes[1] * sizes[2] * -(-sizes[3] // size),)
    return grid, sizes[1:], [x for s in strides for x in s], size


def elementwise(kernel, out: torch.Tensor, inputs, extra=()) -> torch.Tensor:
    """Launch an element-wise ``kernel`` writing ``out`` from ``inputs`` (then ``extra``, say a table)."""
    if out.numel() == 0:
        return out
    grid, sizes, strides, size = _plan(out, *inputs)
    kernel[grid](out, *inputs, *extra, *sizes, *strides, BLOCK=size, **LAUNCH)
    return out


def plain_rope(ref_fn, args, per_channel: bool):
    """relu_rope_pair's kernel with its ReLU off (its ReLU outputs and table unused), paired or per-channel tables;
    the per-channel chain runs in float32 (x.float()) or float64 (float64 tables) whatever the query's dtype."""
    query, _, freqs_cos, freqs_sin = args
    outs = empty_like_eager(ref_fn, args, query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    chain = torch.float32 if per_channel else query.dtype
    mode = ROPE_MODES[torch.promote_types(chain, freqs_cos.dtype)]
    cos = freqs_cos.expand(b, n, h, d)
    sin = freqs_sin.expand(b, n, h, d)
    size = block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // size))
    strides = [s for t in (query, args[1], cos, sin, *outs, *outs) for s in t.stride()]
    jit()._relu_rope_pair_kernel[grid](query, args[1], cos, sin, *outs, *outs, outs[0], n, *strides, H=h, D=d,
                                         MODE=mode, NEG_ZERO_KEEPS_SIGN=False, BLOCK=size, APPLY_RELU=False,
                                         PER_CHANNEL=per_channel, **LAUNCH)
    return outs
