"""CUDA (Triton) implementations of the lossless fused ops: same signatures and outputs (values, dtypes, shapes,
strides) as the chains in ``reference``, each in one launch.

Outputs are allocated with eager's strides (``layout.empty_like_eager``); bf16 SiLU/sigmoid/ReLU gather from the
device's own eager table (``tables.unary_table``); the kernels (``triton_jit``, imported on first use so importing
accelpatch never imports Triton) round exactly where eager does and are launched with ``enable_fp_fusion=False``.
The complex128 RoPE replays the device's eager complex multiply in the form ``complex_mul`` probed (every product
rounded, or an fma where the build contracts). ``unsupported(op, *args)`` says why an input cannot run here (None
when it can); the wrappers assume it was asked.
On CPU the kernels run only in Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check them.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import reference, split_rope
from accelpatch.lossless.kernels.addcmul import FMA, addcmul_form
from accelpatch.lossless.kernels.complex_mul import complex_mul_modes
from accelpatch.lossless.kernels.operands import foreign_operand
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table

LAUNCH = dict(enable_fp_fusion=False, num_warps=4)
MAX_BLOCK = 1024
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_ROPE_MODES = {torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}  # triton_jit._rotate MODE, promoted dtype
_LOCK = threading.Lock()
_RELU_FP32: dict[str, tuple[Optional[bool], Optional[str]]] = {}


def _jit():
    from accelpatch.lossless.kernels import triton_jit  # noqa: PLC0415

    return triton_jit


def _block(n: int) -> int:
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


def _broadcast(*tensors) -> Optional[torch.Size]:
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


def unsupported(op_name: str, *args) -> Optional[str]:
    """Why the Triton implementation of ``op_name`` cannot run these arguments (the reference's), or None."""
    checks = {"relu_rope_pair": _why_rope, "rope_pair": _why_plain_rope,
              "rope_pair_per_channel": _why_plain_rope,
              "modulate": _why_same_dtype, "gated_residual": _why_same_dtype,
              "silu": _why_bf16, "glu_gate": _why_bf16, "sigmoid_gate": _why_sigmoid_gate,
              "scale_to_tokens": _why_scale_to_tokens,
              "rotate_half_pair": _why_rotate_half, "rotary_complex_pair": _why_rotary_complex,
              "rope_split_pair": _why_split}
    if op_name not in checks:
        return f"no Triton kernel for {op_name!r}"
    tensor_args = args[:-1] if op_name == "scale_to_tokens" else args
    if len(_tensors(tensor_args)) != len(tensor_args):
        return "an argument is not a tensor"
    return _common(args) or checks[op_name](*args)


def _why_plain_rope(query, key, freqs_cos, freqs_sin) -> Optional[str]:
    return _why_rope(query, key, freqs_cos, freqs_sin, relu=False)


def _why_rope(query, key, freqs_cos, freqs_sin, relu: bool = True) -> Optional[str]:
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
        if _broadcast(t, torch.empty(b, n, 1, d, device="meta")) != (b, n, 1, d):
            return f"RoPE table of shape {tuple(t.shape)} does not broadcast to [B, N, 1, D] = {[b, n, 1, d]}"
    if torch.promote_types(query.dtype, freqs_cos.dtype) not in _ROPE_MODES:
        return f"{query.dtype} query with {freqs_cos.dtype} tables"
    if not relu:
        return None
    if query.dtype == torch.bfloat16:
        return unary_table("relu", F.relu, query.device)[1]
    return relu_fp32_sign(query.device)[1]


def _why_same_dtype(*tensors) -> Optional[str]:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(_FLOATS):
        return f"dtypes {sorted(map(str, dtypes))} (one of bfloat16, float16, float32 for all inputs)"
    if _broadcast(*tensors) is None:
        return "shapes do not broadcast"
    return None


def _why_bf16(*tensors, table=("silu", F.silu)) -> Optional[str]:
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return f"bfloat16 only (a table of eager's {table[0]})"
    if _broadcast(*tensors) is None:
        return "shapes do not broadcast"
    return unary_table(*table, tensors[0].device)[1]


def _why_sigmoid_gate(x, gate) -> Optional[str]:
    return _why_bf16(x, gate, table=("sigmoid", torch.sigmoid))


def _why_scale_to_tokens(x, z, dtype) -> Optional[str]:
    if x.dtype != torch.float32 or z.dtype not in _FLOATS:
        return f"x {x.dtype}, z {z.dtype} (float32 x, floating z)"
    if dtype not in _FLOATS:
        return f"output dtype {dtype}"
    if x.dim() != 4 or _broadcast(x, z) != x.shape:
        return "x must be [B, H, D, N] with z broadcasting to it"
    return None


def _why_pair(query, key, dtypes) -> Optional[str]:
    if query.dtype not in dtypes or key.dtype != query.dtype:
        return f"query/key dtypes {query.dtype}/{key.dtype} (one of {', '.join(str(d) for d in dtypes)}, the same)"
    if query.dim() != 4 or key.shape != query.shape:
        return f"query and key must be [B, N, H, D] of one shape (got {tuple(query.shape)}, {tuple(key.shape)})"
    return None


def _why_rotate_half(query, key, cos, sin) -> Optional[str]:
    why = _why_pair(query, key, _FLOATS)
    if why:
        return why
    floats = _FLOATS + (torch.float64,)
    if cos.dtype not in floats or sin.dtype not in floats:
        return f"RoPE table dtypes {cos.dtype}/{sin.dtype} (floating)"
    _, n, _, d = query.shape
    rotary = cos.shape[-1]
    if cos.dim() != 2 or sin.shape != cos.shape or cos.shape[0] not in (1, n):
        return f"tables must be one [N, R] shape with N = {n} or 1 (got {tuple(cos.shape)}, {tuple(sin.shape)})"
    if rotary % 2 or not 0 < rotary <= d:
        return f"rotary dim {rotary} (an even number from 2 to the head dim {d})"
    return None


def _why_split(query, key, cos, sin) -> Optional[str]:
    return split_rope.mismatch(query, key, cos, sin) or addcmul_form(query.device)[1]


def _why_rotary_complex(query, key, freqs) -> Optional[str]:
    why = _why_pair(query, key, (torch.bfloat16, torch.float16, torch.float32, torch.float64))
    if why:
        return why
    _, n, _, d = query.shape
    if d % 2:
        return f"odd head dim {d}"
    if freqs.dtype != torch.complex128:
        return f"freqs dtype {freqs.dtype} (complex128)"
    if freqs.dim() != 2 or freqs.shape[0] not in (1, n) or freqs.shape[1] != d // 2:
        return f"freqs of shape {tuple(freqs.shape)} (must be [N, D/2] = {[n, d // 2]}, or [1, D/2])"
    try:
        eager_layouts(reference.rotary_complex_pair, (query, key, freqs))
    except RuntimeError as error:  # e.g. float64 channels that view_as_complex cannot pair (stride of D not 1)
        return f"the reference chain itself refuses these inputs ({str(error).splitlines()[0]})"
    return complex_mul_modes(query.device)[1]


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
    block = _block(sizes[3])
    grid = (sizes[0] * sizes[1] * sizes[2] * -(-sizes[3] // block),)
    return grid, sizes[1:], [x for s in strides for x in s], block


def _elementwise(kernel, out: torch.Tensor, inputs, extra=()):
    if out.numel() == 0:
        return out
    grid, sizes, strides, block = _plan(out, *inputs)
    kernel[grid](out, *inputs, *extra, *sizes, *strides, BLOCK=block, **LAUNCH)
    return out


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` as eager rounds it (reference.modulate)."""
    (out,) = empty_like_eager(reference.modulate, (x, scale, shift), x.device)
    return _elementwise(_jit()._modulate_kernel, out, (x, scale, shift))


def gated_residual(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``residual + gate * x`` as eager rounds it (reference.gated_residual)."""
    (out,) = empty_like_eager(reference.gated_residual, (residual, gate, x), x.device)
    return _elementwise(_jit()._gated_residual_kernel, out, (residual, gate, x))


def silu(x: torch.Tensor) -> torch.Tensor:
    """bf16 ``F.silu`` by a gather from eager's table (reference.silu)."""
    table, _ = unary_table("silu", F.silu, x.device)
    (out,) = empty_like_eager(reference.silu, (x,), x.device)
    return _elementwise(_jit()._silu_kernel, out, (x,), (table,))


def glu_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * silu(gate)`` (reference.glu_gate)."""
    table, _ = unary_table("silu", F.silu, x.device)
    (out,) = empty_like_eager(reference.glu_gate, (x, gate), x.device)
    return _elementwise(_jit()._glu_gate_kernel, out, (x, gate), (table,))


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * sigmoid(gate)`` (reference.sigmoid_gate): glu_gate's kernel gathering from eager's sigmoid table."""
    table, _ = unary_table("sigmoid", torch.sigmoid, x.device)
    (out,) = empty_like_eager(reference.sigmoid_gate, (x, gate), x.device)
    return _elementwise(_jit()._glu_gate_kernel, out, (x, gate), (table,))


def scale_to_tokens(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(x * z).flatten(1, 2).transpose(1, 2).to(dtype)`` in one pass, into eager's (N-minor) layout."""
    (out,) = empty_like_eager(reference.scale_to_tokens, (x, z, dtype), x.device)
    b, h, d, n = x.shape
    sb, sn, sc = out.stride()
    as_bhdn = out.as_strided((b, h, d, n), (sb, d * sc, sc, sn))  # token (b, n), channel h*D + d
    _elementwise(_jit()._scale_cast_kernel, as_bhdn, (x, z))
    return out


def relu_rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """ReLU and interleaved RoPE of query and key in one launch (reference.relu_rope_pair):
    ``(relu(query), relu(key), rotated query as float32, rotated key as float32)``."""
    args = (query, key, freqs_cos, freqs_sin)
    outs = empty_like_eager(reference.relu_rope_pair, args, query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    mode = _ROPE_MODES[torch.promote_types(query.dtype, freqs_cos.dtype)]
    if query.dtype == torch.bfloat16:
        table, _ = unary_table("relu", F.relu, query.device)
        keeps = False
    else:
        table = outs[0]  # unused by the fp32 kernel
        keeps = bool(relu_fp32_sign(query.device)[0])
    cos = freqs_cos.expand(b, n, h, d)
    sin = freqs_sin.expand(b, n, h, d)
    block = _block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // block))
    strides = [s for t in (query, key, cos, sin, *outs) for s in t.stride()]
    _jit()._relu_rope_pair_kernel[grid](query, key, cos, sin, *outs, table, n, *strides, H=h, D=d, MODE=mode,
                                         NEG_ZERO_KEEPS_SIGN=keeps, BLOCK=block, **LAUNCH)
    return outs


def _plain_rope(ref_fn, args, per_channel: bool):
    """relu_rope_pair's kernel with its ReLU off (its ReLU outputs and table unused), paired or per-channel tables;
    the per-channel chain runs in float32 (x.float()) or float64 (float64 tables) whatever the query's dtype."""
    query, _, freqs_cos, freqs_sin = args
    outs = empty_like_eager(ref_fn, args, query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    chain = torch.float32 if per_channel else query.dtype
    mode = _ROPE_MODES[torch.promote_types(chain, freqs_cos.dtype)]
    cos = freqs_cos.expand(b, n, h, d)
    sin = freqs_sin.expand(b, n, h, d)
    block = _block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // block))
    strides = [s for t in (query, args[1], cos, sin, *outs, *outs) for s in t.stride()]
    _jit()._relu_rope_pair_kernel[grid](query, args[1], cos, sin, *outs, *outs, outs[0], n, *strides, H=h, D=d,
                                         MODE=mode, NEG_ZERO_KEEPS_SIGN=False, BLOCK=block, APPLY_RELU=False,
                                         PER_CHANNEL=per_channel, **LAUNCH)
    return outs


def rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """Interleaved RoPE of query and key in one launch, in their dtype (reference.rope_pair)."""
    return _plain_rope(reference.rope_pair, (query, key, freqs_cos, freqs_sin), per_channel=False)


def rope_pair_per_channel(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Interleaved RoPE of query and key in one launch, each channel its own table entry, float32 chain
    (reference.rope_pair_per_channel: HunyuanVideo 1.5, LTX-2)."""
    return _plain_rope(reference.rope_pair_per_channel, (query, key, cos, sin), per_channel=True)


def rotate_half_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """MiniMax-H3's partial rotate-half RoPE of query and key in one launch, contiguous outputs
    (reference.rotate_half_pair)."""
    outs = empty_like_eager(reference.rotate_half_pair, (query, key, cos, sin), query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    rotary = cos.shape[-1]
    cos, sin = cos.expand(n, rotary), sin.expand(n, rotary)
    block = _block(h * d)
    grid = (b * n, -(-(h * d) // block))
    tables = [[0, t.stride(0), 0, t.stride(1)] for t in (cos, sin)]  # along (b, n, h, entry)
    strides = [s for per in [query.stride(), key.stride(), *tables, *(o.stride() for o in outs)] for s in per]
    _jit()._rotate_half_pair_kernel[grid](query, key, cos, sin, *outs, n, *strides, H=h, D=d, R=rotary, BLOCK=block,
                                          **LAUNCH)
    return outs


def rope_split_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """LTX-2.3's split RoPE of [B, T, C] query and key in one launch, contiguous outputs (reference.rope_split_pair):
    the rotate-half kernel with SPLIT (one float32 table entry per pair), the second product added as this device's
    eager addcmul_ adds it (FMA as probed)."""
    outs = empty_like_eager(reference.rope_split_pair, (query, key, cos, sin), query.device)
    b, n, _ = query.shape
    if query.numel() == 0:
        return outs
    h, d = split_rope.heads(query, cos)
    block = _block(h * d)
    grid = (b * n, -(-(h * d) // block))
    strides = [s for per in split_rope.strides(query, key, cos, sin) for s in per]
    _jit()._rotate_half_pair_kernel[grid](query, key, cos, sin, *outs, n, *strides, H=h, D=d, R=d, BLOCK=block,
                                          SPLIT=True, FMA=addcmul_form(query.device)[0] == FMA, **LAUNCH)
    return outs


def rotary_complex_pair(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """SANA-Video 2.0's complex128 RoPE of query and key (any strides) in one launch, into eager's output layouts
    (reference.rotary_complex_pair)."""
    outs = empty_like_eager(reference.rotary_complex_pair, (query, key, freqs), query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    (re_mode, im_mode), _ = complex_mul_modes(query.device)
    table = torch.view_as_real(freqs.expand(n, d // 2))  # [N, D/2, 2] float64
    block = _block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // block))
    strides = [s for t in (query, key, table, *outs) for s in t.stride()]
    _jit()._rotary_complex_pair_kernel[grid](query, key, table, *outs, n, *strides, H=h, P=d // 2, RE_MODE=re_mode,
                                             IM_MODE=im_mode, BLOCK=block, **LAUNCH)
    return outs
