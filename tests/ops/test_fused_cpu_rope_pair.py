"""The CPU kernel of rope_pair (interleaved RoPE of query and key without ReLU, Wan's self-attention) against its
eager reference chain (accelpatch.lossless.ops.rope_pair.rope_pair), bit for bit, with the helpers of test_fused_cpu.

Inputs: ties, specials (NaN, +-inf, +-0.0, subnormals), every bf16 value (the unit-stride and the strided loop),
bf16/float32/float64 tables (float64 rounded double -> float -> bf16 as c10 does), Wan's [1, N, 1, D] tables
and other broadcasts, transposed and strided views. Also: a contracted (single-rounding) RoPE is caught, and the
reference is Wan's own processor step and the adapter's ``_rotate``.
"""
from __future__ import annotations

import pytest
import torch

from accelpatch.lossless.kernels import cpu
from _by_name import CPU, REFERENCE as ref

from .test_fused_cpu import BF16, F32, F64, assert_same, check, mixed, needs_kernels, tie_heavy
from .test_fused_cpu import ROPE_DTYPES, _tables  # the relu_rope tests' operands

@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_rope_pair(qdtype, tdtype, tokens):
    q, k = mixed((1, tokens, 2, 16), qdtype, 1), mixed((1, tokens, 2, 16), qdtype, 2)
    check("rope_pair", q, k, *_tables(1, tokens, 16, tdtype, 3))
    check("rope_pair", *(tie_heavy((2, tokens, 3, 8), qdtype, s) for s in (4, 5)),
          *_tables(2, tokens, 8, tdtype, 6, ties=True))


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
def test_rope_pair_layouts(qdtype, tdtype):
    """Query/key as views of a packed projection and of a [B, H, N, D] tensor (transposed), a strided head dim,
    and tables broadcast from [N, 1, D], [1, N, 1, D] or per batch, and strided along D."""
    qkv = mixed((2, 17, 3, 2, 24), qdtype, 10)
    cos, sin = _tables(1, 17, 24, tdtype, 11)
    check("rope_pair", qkv[:, :, 0], qkv[:, :, 1], cos, sin)
    heads_first = mixed((2, 2, 17, 24), qdtype, 12).transpose(1, 2)
    check("rope_pair", heads_first, qkv[:, :, 2], cos, sin)
    check("rope_pair", heads_first, heads_first.contiguous(), cos[0], sin[0])
    wide = mixed((2, 17, 2, 48), qdtype, 13)[..., ::2]
    check("rope_pair", wide, qkv[:, :, 0], *_tables(2, 17, 24, tdtype, 14))
    cos_wide = mixed((1, 17, 1, 48), tdtype, 15)[..., 1::2]
    check("rope_pair", qkv[:, :, 0], qkv[:, :, 1], cos_wide, sin)


@needs_kernels
@pytest.mark.parametrize("tdtype", [BF16, F32, F64])
def test_rope_pair_every_bf16_value(tdtype):
    """Every bf16 bit pattern as query (and reversed as key), in the unit-stride loop and in the strided one."""
    from accelpatch.lossless.kernels.tables import all_bf16_values

    q = all_bf16_values(torch.device("cpu")).view(1, 512, 4, 32)
    check("rope_pair", q, q.flip(1), *_tables(1, 512, 32, tdtype, 30, ties=True))
    strided = all_bf16_values(torch.device("cpu")).view(1, 256, 4, 64)[..., ::2]
    check("rope_pair", strided, strided.flip(1), *_tables(1, 256, 32, tdtype, 31))


@needs_kernels
def test_rope_pair_double_rounding_through_float():
    """float64 tables: eager rounds double -> float -> bf16; 1 * (1 + 2^-8 + 2^-40) is 1.0 in bf16 that
    way (a direct double -> bf16 rounding would give 1.0078125)."""
    q = torch.ones(1, 1, 1, 2, dtype=BF16)
    cos = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -40, 0.0], dtype=F64).view(1, 1, 1, 2)
    sin = torch.zeros(1, 1, 1, 2, dtype=F64)
    assert CPU.rope_pair(q, q, cos, sin)[0][0, 0, 0, 0].item() == 1.0
    check("rope_pair", q, q, cos, sin)


@needs_kernels
def test_a_contracted_rope_pair_is_caught():
    """The float32 RoPE rounded once per output (what an FMA would give) differs from eager and is caught by the
    same comparison; the kernel is not."""
    q = mixed((1, 257, 2, 16), F32, 7)
    cos, sin = _tables(1, 257, 16, F32, 8)
    expected = ref.rope_pair(q, q, cos, sin)[0]
    x = q.double()
    once = torch.empty_like(expected)
    once[..., 0::2] = (x[..., 0::2] * cos[..., 0::2].double() - x[..., 1::2] * sin[..., 1::2].double()).float()
    once[..., 1::2] = (x[..., 0::2] * sin[..., 1::2].double() + x[..., 1::2] * cos[..., 0::2].double()).float()
    with pytest.raises(AssertionError, match="differ|NaN"):  # (float32 overflows that double does not: NaN too)
        assert_same(once, expected)
    finite = torch.isfinite(expected) & torch.isfinite(once)
    assert not torch.equal(once[finite], expected[finite])  # and rounding differences among the finite values
    assert_same(CPU.rope_pair(q, q, cos, sin)[0], expected)


def test_the_reference_is_wans_rope():
    """reference.rope_pair is WanAttnProcessor's apply_rotary_emb on query and key (the adapter's ``_rotate``,
    which restates it) with the tables WanRotaryPosEmbed builds, bit for bit."""
    from accelpatch.models.wan.high import _rotate
    from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs

    for dtype in (F32, BF16):  # float32 tables with float32 or bf16 activations
        model = tiny_wan_transformer(num_layers=1, dtype=dtype)
        inputs = wan_transformer_inputs(model, num_frames=2, height=8, width=8)
        cos, sin = model.rope(inputs["hidden_states"])
        assert cos.dtype == F32 and cos.dim() == 4 and cos.shape[0] == 1 and cos.shape[2] == 1
        heads = model.blocks[0].attn1.heads
        q = mixed((1, cos.shape[1], heads, cos.shape[-1]), dtype, 40)
        k = mixed((1, cos.shape[1], heads, cos.shape[-1]), dtype, 41)
        for got, want in zip(ref.rope_pair(q, k, cos, sin), (_rotate(q, cos, sin), _rotate(k, cos, sin))):
            assert_same(got, want)
