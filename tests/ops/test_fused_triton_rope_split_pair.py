"""The Triton rope_split_pair (the rotate-half kernel with SPLIT on: LTX-2.3's split RoPE, one float32 table entry
per pair for both halves, the second product added as the device's eager addcmul_ adds it) against
reference.rope_split_pair, bit for bit, in Triton's interpreter on CPU (TRITON_INTERPRET=1), with the helpers of
test_fused_triton: edge values, float32 and bf16 tables, [B, H, T, D/2] and [B, T, C/2] tables, strided and broadcast
views. This CPU's eager addcmul_ is an fma (accelpatch.lossless.kernels.addcmul), so the kernel runs with FMA here; with
the other form (CUDA's functor) it is caught, and so is a chain contracted throughout."""
import pytest
import torch
import triton
import triton.language as tl

from _triton_interpreter import FMA_REASON, fma_is_fused

from .test_fused_cpu_rope_split_pair import assert_split_refusals
from .test_fused_triton import assert_same_outputs, check, edge

from _by_name import REFERENCE as reference, TRITON as tk  # noqa: E402
from accelpatch.lossless.kernels import addcmul  # noqa: E402
from accelpatch.lossless.ops import rope_split_pair as split_op  # noqa: E402
from accelpatch.lossless.kernels import triton_jit as j  # noqa: E402

OP = "rope_split_pair"


def skip_where_the_interpreter_cannot_round_an_fma_once():
    """Where this CPU's addcmul_ is an fma, the kernel runs tl.fma: an interpreter that rounds it twice cannot
    match eager bit for bit."""
    if addcmul.addcmul_form(torch.device("cpu"))[0] == addcmul.FMA and not fma_is_fused():
        pytest.skip(FMA_REASON)


def _tables(b, h, t, r, dtype, seed=0):
    """[B, H, T, R] cos and sin as swapaxes views of [B, T, H, R] angles' cos/sin, with a NaN and a subnormal."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.rand(b, t, h, r, generator=g, dtype=torch.float64) * 6.3
    cos, sin = theta.cos(), theta.sin()
    cos[0, 0, 0, 0] = float("nan")
    sin[-1, -1, -1, -1] = 1e-40
    return cos.to(dtype).transpose(1, 2), sin.to(dtype).transpose(1, 2)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_rope_split_pair_edge_values_and_table_dtypes(dtype, table_dtype):
    if dtype == torch.float16 and table_dtype != torch.float32:
        assert "float32 for fp16" in tk.unsupported(OP, *(torch.zeros(1, 2, 16, dtype=dtype),) * 2,
                                                    *_tables(1, 2, 2, 4, table_dtype))
        return
    skip_where_the_interpreter_cannot_round_an_fma_once()
    for tokens, magnitude in ((1, 200.0), (17, 0.005), (17, 1.0)):
        q = edge((2, tokens, 3 * 16), dtype, 14, magnitude)
        k = edge((2, tokens, 3 * 16), dtype, 15, magnitude)
        check(OP, q, k, *_tables(2, 3, tokens, 8, table_dtype))
        check(OP, q, k, *(t.transpose(1, 2).flatten(2) for t in _tables(2, 3, tokens, 8, table_dtype, 1)))


def test_rope_split_pair_strided_views_and_broadcast_tables():
    skip_where_the_interpreter_cannot_round_an_fma_once()
    packed = edge((2, 17, 3 * 32), torch.bfloat16, 16)  # q, k as chunks of a packed projection
    q, k, _ = packed.chunk(3, dim=-1)
    cos, sin = _tables(2, 2, 17, 8, torch.float32)
    check(OP, q, k, cos, sin)
    check(OP, q, k, cos.contiguous(), sin[:1].expand(2, 2, 17, 8))  # contiguous; broadcast over the batch
    wide_cos, wide_sin = _tables(2, 2, 17, 16, torch.float32)
    check(OP, q, k, wide_cos[..., 1::2], wide_sin[..., ::2])  # tables strided along the entry
    strided = edge((2, 17, 64), torch.bfloat16, 17)[..., ::2]  # a channel stride of 2
    check(OP, strided, k, cos, sin)
    check(OP, q, k, cos[:1, 0].expand(2, 17, 8).repeat(1, 1, 2), sin[0, :1].repeat(1, 1, 2))  # [B, T, C/2], [1, T, C/2]


def test_rope_split_pair_refusals_name_the_reason():
    assert_split_refusals(tk.unsupported)


def _one_contracted(IN, OUT, base_in, base_out, s_in, s_out, d, partner, first, rot, mask, c, s,
                    SPLIT: tl.constexpr, FMA: tl.constexpr):
    """Wrong: the whole row rounded once (x*cos kept exact too: fma(x, cos, rotated*sin))."""
    DT: tl.constexpr = OUT.dtype.element_ty
    raw = tl.load(IN + base_in + d * s_in, mask=mask)
    y = j._widen(tl.load(IN + base_in + partner * s_in, mask=mask & rot))
    rotated = tl.where(first, -y, y)
    out = tl.fma(j._widen(raw), c, rotated * s)
    tl.store(OUT + base_out + d * s_out, tl.where(rot, j._narrow(out, DT), raw), mask=mask)


def test_this_devices_form_runs_and_the_other_form_and_a_contracted_chain_are_caught(monkeypatch):
    """float32 q and k: the probed form (an fma on this CPU) equals the reference; the mul-then-add form (CUDA's)
    and a fully contracted chain differ from it, and the comparison catches them."""
    skip_where_the_interpreter_cannot_round_an_fma_once()
    assert addcmul.addcmul_form(torch.device("cpu")) == (addcmul.FMA, None)
    q, k = edge((2, 17, 48), torch.float32, 21), edge((2, 17, 48), torch.float32, 22)
    args = (q, k, *_tables(2, 3, 17, 8, torch.float32))
    expected = reference.rope_split_pair(*args)
    assert_same_outputs(tk.rope_split_pair(*args), expected)
    with monkeypatch.context() as patched:
        patched.setattr(split_op, "addcmul_form", lambda device: (addcmul.SEPARATE, None))
        with pytest.raises(AssertionError, match="differ|NaN"):
            assert_same_outputs(tk.rope_split_pair(*args), expected)
    monkeypatch.setattr(j, "_rotate_half_one", triton.jit(_one_contracted))
    with pytest.raises(AssertionError, match="differ|NaN"):
        assert_same_outputs(tk.rope_split_pair(*args), expected)
