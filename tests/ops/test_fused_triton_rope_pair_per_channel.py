"""The Triton rope_pair_per_channel (relu_rope_pair's kernel with its ReLU off and PER_CHANNEL on: HunyuanVideo
1.5's / LTX-2's interleaved RoPE, each channel its own cos and sin, float32 chain) against
reference.rope_pair_per_channel, bit for bit, in Triton's interpreter on CPU (TRITON_INTERPRET=1), with the helpers
of test_fused_triton: edge values, every table dtype, per-channel tables, strided and broadcast views; Wan's paired
kernel and a contracted RoPE are caught."""
import pytest
import torch

from .test_fused_triton import TABLE_DTYPES, _rope_tables, _rotate_contracted, assert_same_outputs, check, edge

from _by_name import REFERENCE as reference, TRITON as tk  # noqa: E402
from accelpatch.lossless.kernels import triton_jit as j  # noqa: E402

OP = "rope_pair_per_channel"


def _per_channel_tables(tokens, d, dtype, seed=0):
    """_rope_tables (angles with a NaN and a subnormal) with every odd entry replaced by another angle's, so the
    two entries of a pair differ; [1, N, 1, D]."""
    cos, sin = _rope_tables(tokens, d, torch.float64)
    g = torch.Generator().manual_seed(seed)
    other = torch.rand(1, tokens, 1, d // 2, generator=g, dtype=torch.float64) * 6.3
    cos[..., 1::2], sin[..., 1::2] = other.cos(), other.sin()
    return cos.to(dtype), sin.to(dtype)


@pytest.mark.parametrize("table_dtype", TABLE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_pair_per_channel_every_table_dtype(dtype, table_dtype):
    for tokens, magnitude in ((1, 200.0), (17, 0.005), (17, 1.0)):
        q = edge((2, tokens, 2, 16), dtype, 14, magnitude)
        k = edge((2, tokens, 2, 16), dtype, 15, magnitude)
        check(OP, q, k, *_per_channel_tables(tokens, 16, table_dtype))
        check(OP, q, k, *_rope_tables(tokens, 16, table_dtype))  # paired tables too


def test_rope_pair_per_channel_strided_views_and_table_shapes():
    packed = edge((1, 33, 3, 2, 8), torch.bfloat16, 16)  # q, k as views of a packed projection
    q, k = packed[:, :, 0], packed[:, :, 1]
    check(OP, q, k, *_per_channel_tables(33, 8, torch.float64))
    qt = edge((2, 2, 17, 8), torch.bfloat16, 17).transpose(1, 2)  # [B, N, H, D] with heads outermost
    kt = edge((2, 17, 2, 8), torch.bfloat16, 18)
    cos, sin = _per_channel_tables(17, 8, torch.bfloat16)
    check(OP, qt, kt, cos[0], sin[0])  # [N, 1, D] tables
    cos, sin = _per_channel_tables(17, 8, torch.float32)
    check(OP, qt, kt, cos.expand(2, 17, 1, 8), sin.expand(2, 17, 1, 8).contiguous())  # per batch (LTX-2)
    wide_cos, wide_sin = _per_channel_tables(17, 16, torch.float32)
    check(OP, qt, kt, wide_cos[..., 1::2], wide_sin[..., ::2])  # tables strided along D


def test_rope_pair_per_channel_refusals_name_the_reason():
    q = torch.zeros(1, 4, 2, 8)
    tables = _per_channel_tables(4, 8, torch.float32)
    assert "bfloat16 or float32" in tk.unsupported(OP, q.half(), q.half(), *tables)
    assert "odd head dim" in tk.unsupported(OP, q[..., :7], q[..., :7], tables[0][..., :7], tables[1][..., :7])


@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_wans_kernel_and_a_contracted_rope_are_caught(monkeypatch, dtype, table_dtype):
    q, k = edge((2, 17, 2, 16), dtype, 21), edge((2, 17, 2, 16), dtype, 22)
    args = (q, k, *_per_channel_tables(17, 16, table_dtype))
    expected = reference.rope_pair_per_channel(*args)
    assert_same_outputs(tk.rope_pair_per_channel(*args), expected)
    with pytest.raises(AssertionError, match="differ"):  # cos read at even channels only (values, NaN places)
        assert_same_outputs(tk.rope_pair(*args), expected)
    monkeypatch.setattr(j, "_rotate", _rotate_contracted)
    if dtype == torch.float32:  # bf16 outputs hide a contraction at this size (test_fused_triton says so)
        with pytest.raises(AssertionError, match="elements differ"):
            assert_same_outputs(tk.rope_pair_per_channel(*args), expected)
