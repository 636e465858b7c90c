"""Hypothesis properties of the PyTorch Sol-Attn over shapes, dtypes and options: finite output of the
input's shape and dtype, and equality with dense attention at tau=-1e9."""
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from accelpatch.sol_attn.op import sol_attn

DTYPES = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    t=st.integers(1, 260),
    h=st.integers(1, 3),
    d=st.sampled_from([16, 64, 80, 128]),
    dtype=st.sampled_from(list(DTYPES)),
    tau=st.floats(-3, 3),
    thresh_type=st.sampled_from(["diag", "exact"]),
    sink_tokens=st.integers(0, 300),
    sink_start=st.one_of(st.none(), st.integers(0, 300)),
    seed=st.integers(0, 2**16),
)
def test_finite_shape_dtype_and_dense_limit(b, t, h, d, dtype, tau, thresh_type, sink_tokens, sink_start, seed):
    sink_tokens %= t + 1  # a sink inside the sequence (one past it is refused: test_sol_attn.test_bad_options)
    sink_start = None if sink_start is None else sink_start % (t - sink_tokens + 1)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, h, d, generator=g).to(dtype) for _ in range(3))
    kw = dict(thresh_type=thresh_type, sink_tokens=sink_tokens, sink_start=sink_start, impl="torch")
    out, stats = sol_attn(q, k, v, tau=tau, return_stats=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert 0.0 < stats.exact_fraction <= 1.0
    full = sol_attn(q, k, v, tau=-1e9, **kw)
    ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    tol = DTYPES[dtype]
    torch.testing.assert_close(full.float(), ref, atol=tol, rtol=tol)
