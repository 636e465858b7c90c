"""Triton Sol-Attn kernel against the PyTorch implementation, on CPU through the Triton interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py before any kernel module is imported), tiny shapes only.
kv_splits > 1 is exercised with route groups of 1-2 blocks so that the splits own different key ranges. What the
real compiler makes of the kernel (shared memory, pipelining) is checked ahead of time in test_sol_attn_aot.py."""
import pytest
import torch

from accelpatch.sol_attn.op import sol_attn, sol_attn_varlen

pytest.importorskip("triton")


def smooth(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).cumsum(1) / 4 + 0.5 * torch.randn(shape, generator=g)
    return x.to(dtype)


def qkv(b, t, h, d, dtype=torch.float32, seed=0):
    return [smooth((b, t, h, d), dtype, seed + i) for i in range(3)]


def kernel(q, k, v, tau, *, thresh_type="diag", sink_tokens=0, sink_start=None, kv_splits=1, group=None):
    from accelpatch.sol_attn.op.triton_impl import sol_attn_triton

    return sol_attn_triton(q, k, v, q.shape[-1] ** -0.5, tau, thresh_type, sink_tokens, sink_start,
                           kv_splits=kv_splits, group=group)


def torch_ref(q, k, v, tau, **kw):
    out, stats = sol_attn(q, k, v, tau=tau, impl="torch", return_stats=True, **kw)
    return out, stats.exact_pairs


TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.parametrize(
    "t,d,tau,thresh_type,sink",
    [
        (1, 64, 0.5, "diag", (0, None)),
        (63, 64, -1e9, "diag", (0, None)),
        (130, 64, 0.5, "exact", (20, None)),
        (200, 64, 1e9, "diag", (10, 64)),
        (200, 64, 0.0, "diag", (0, None)),
        (150, 128, 0.5, "diag", (5, 0)),
        (100, 80, 0.3, "exact", (0, None)),
    ],
)
def test_fp32_matches_torch(t, d, tau, thresh_type, sink):
    q, k, v = qkv(2, t, 1 if d > 64 else 2, d, seed=t)
    kw = dict(thresh_type=thresh_type, sink_tokens=sink[0], sink_start=sink[1])
    out, pairs = kernel(q, k, v, tau, **kw)
    ref, ref_pairs = torch_ref(q, k, v, tau, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])
    assert pairs.tolist() == ref_pairs.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_matches_torch(dtype):
    q, k, v = qkv(1, 200, 2, 64, dtype, seed=3)
    out, pairs = kernel(q, k, v, 0.5, sink_tokens=16)
    ref, ref_pairs = torch_ref(q, k, v, 0.5, sink_tokens=16)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype] * 4, rtol=TOL[dtype])
    assert pairs.tolist() == ref_pairs.tolist()


@pytest.mark.parametrize("block_n", [16, 32])
def test_key_sub_tiles_match_torch(block_n):
    """Exact blocks taken in sub-tiles of 16 or 32 keys (the tiles that fit smaller GPUs), a short last block."""
    from accelpatch.sol_attn.op.resources import Tiles

    q, k, v = qkv(1, 200, 2, 64, seed=11)
    tiles = Tiles(block_n=block_n, num_stages=2, group=32, num_warps=4, block_d=64)
    from accelpatch.sol_attn.op.triton_impl import sol_attn_triton

    out, pairs = sol_attn_triton(q, k, v, 64 ** -0.5, 0.3, "diag", 10, None, tiles=tiles)
    ref, ref_pairs = torch_ref(q, k, v, 0.3, sink_tokens=10)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])
    assert pairs.tolist() == ref_pairs.tolist()


@pytest.mark.parametrize("kv_splits,group", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_kv_splits_merge_through_lse(kv_splits, group):
    q, k, v = qkv(1, 256, 1, 64, seed=5)
    ref, ref_pairs = torch_ref(q, k, v, 0.5, sink_tokens=30)
    one, _ = kernel(q, k, v, 0.5, sink_tokens=30, group=group)
    split, pairs = kernel(q, k, v, 0.5, sink_tokens=30, kv_splits=kv_splits, group=group)
    torch.testing.assert_close(split, one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])
    assert pairs.tolist() == ref_pairs.tolist()


def test_public_api_and_varlen_through_interpreter():
    q, k, v = qkv(2, 100, 2, 64, seed=7)
    out, stats = sol_attn(q, k, v, tau=0.5, sink_tokens=8, sink_start=0, kv_splits=2, impl="triton",
                          return_stats=True)
    ref, ref_stats = sol_attn(q, k, v, tau=0.5, sink_tokens=8, sink_start=0, impl="torch", return_stats=True)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert stats.exact_fraction == ref_stats.exact_fraction
    cu = torch.tensor([0, 40, 40, 100])
    vo = sol_attn_varlen(q[0], k[0], v[0], cu, 60, tau=0.5, impl="triton")
    vr = sol_attn_varlen(q[0], k[0], v[0], cu, 60, tau=0.5, impl="torch")
    torch.testing.assert_close(vo, vr, atol=2e-5, rtol=2e-5)


def test_fp64_is_rejected_by_triton():
    q, k, v = qkv(1, 10, 1, 64, torch.float64)
    with pytest.raises(TypeError, match="impl='triton'"):
        sol_attn(q, k, v, impl="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only; the same kernel logic runs above in the interpreter")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cuda_bf16_matches_torch(d):
    q, k, v = (x.cuda() for x in qkv(2, 1000, 2, d, torch.bfloat16, seed=d))
    out, stats = sol_attn(q, k, v, tau=1.0, sink_tokens=100, impl="triton", return_stats=True)
    ref, ref_stats = sol_attn(q, k, v, tau=1.0, sink_tokens=100, impl="torch", return_stats=True)
    torch.testing.assert_close(out.float(), ref.float(), atol=0.1, rtol=3e-2)
    assert abs(stats.exact_fraction - ref_stats.exact_fraction) < 0.01
