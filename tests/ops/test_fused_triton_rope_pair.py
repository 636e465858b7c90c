"""The Triton rope_pair (relu_rope_pair's kernel with its ReLU off: Wan's interleaved RoPE of query and key, in
their dtype) against reference.rope_pair, bit for bit, in Triton's interpreter on CPU (TRITON_INTERPRET=1), with
the helpers of test_fused_triton: edge values, every table dtype, strided and broadcast views;
a contracted RoPE is caught."""
import pytest
import torch

from .test_fused_triton import TABLE_DTYPES, _rope_tables, _rotate_contracted, assert_same_outputs, check, edge

from _by_name import REFERENCE as reference, TRITON as tk  # noqa: E402
from accelpatch.lossless.kernels import triton_jit as j  # noqa: E402


@pytest.mark.parametrize("table_dtype", TABLE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_pair_every_table_dtype(dtype, table_dtype):
    for tokens, magnitude in ((1, 200.0), (17, 0.005), (17, 1.0)):
        q = edge((2, tokens, 2, 16), dtype, 14, magnitude)
        k = edge((2, tokens, 2, 16), dtype, 15, magnitude)
        check("rope_pair", q, k, *_rope_tables(tokens, 16, table_dtype))


def test_rope_pair_strided_views_and_table_shapes():
    packed = edge((1, 33, 3, 2, 8), torch.bfloat16, 16)  # q, k as views of a packed projection
    q, k = packed[:, :, 0], packed[:, :, 1]
    check("rope_pair", q, k, *_rope_tables(33, 8, torch.float64))
    qt = edge((2, 2, 17, 8), torch.bfloat16, 17).transpose(1, 2)  # [B, N, H, D] with heads outermost
    kt = edge((2, 17, 2, 8), torch.bfloat16, 18)
    cos, sin = _rope_tables(17, 8, torch.bfloat16, shape="plain")
    check("rope_pair", qt, kt, cos[:, None], sin[:, None])  # [N, 1, D] tables
    cos, sin = _rope_tables(17, 8, torch.float32)
    check("rope_pair", qt, kt, cos.expand(2, 17, 1, 8), sin.expand(2, 17, 1, 8).contiguous())


def test_rope_pair_refusals_name_the_reason():
    q = torch.zeros(1, 4, 2, 8)
    tables = _rope_tables(4, 8, torch.float32)
    assert "bfloat16 or float32" in tk.unsupported("rope_pair", q.half(), q.half(), *tables)
    assert "odd head dim" in tk.unsupported("rope_pair", q[..., :7], q[..., :7], tables[0][..., :7],
                                            tables[1][..., :7])


@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_a_contracted_rope_pair_is_caught(monkeypatch, dtype, table_dtype):
    q, k = edge((2, 17, 2, 16), dtype, 21), edge((2, 17, 2, 16), dtype, 22)
    args = (q, k, *_rope_tables(17, 16, table_dtype))
    assert_same_outputs(tk.rope_pair(*args), reference.rope_pair(*args))
    monkeypatch.setattr(j, "_rotate", _rotate_contracted)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_same_outputs(tk.rope_pair(*args), reference.rope_pair(*args))
