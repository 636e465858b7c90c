"""Backward of the Sol-Attn custom ops (backward.py): gradients of the forward with the routing held fixed.

The backbone is the augmented-key formulation (softmax attention over [K ; kc] with values [V ; vc/len],
a logit bias ln(len_j) on the centroids and a per-(head, query block) mask); it must reproduce the
forward, and its gradients must pass gradcheck, equal dense SDPA's at tau=-1e9 and survive
torch.compile / opcheck. Shapes are tiny (CPU, one thread)."""
import pytest
import torch
import torch.nn.functional as F

from accelpatch.sol_attn.op import sol_attn, sol_attn_varlen
from accelpatch.sol_attn.op import backward as bw
from accelpatch.sol_attn.op.routing import LOG2E, summaries, thresholds


def smooth(shape, dtype, seed):
    """Slowly varying along T, so intermediate tau gives a mix of exact and approximate blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).cumsum(1) / 4 + 0.5 * torch.randn(shape, generator=g)
    return x.to(dtype)


def qkv(b, t, h, d, dtype=torch.float64, seed=0, requires_grad=False):
    return [smooth((b, t, h, d), dtype, seed + i).requires_grad_(requires_grad) for i in range(3)]


def route_margin(q, k, v, tau, thresh_type, scale=None):
    """Smallest |route score - threshold| over all (query block, key block) pairs. Finite differences of
    size eps move route scores and thresholds by O(eps), so a margin >> eps means no routing flips."""
    c = (q.shape[-1] ** -0.5 if scale is None else scale) * LOG2E
    kc, _, qbar = summaries(q.detach(), k.detach(), v.detach())
    thr = thresholds(qbar, kc, c, tau, thresh_type)
    r = c * qbar @ kc.to(qbar.dtype).transpose(-1, -2)
    return float((r - thr[..., None]).abs().min())


def grads(fn, inputs, grad_out):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, grad_out)


def dense(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def mixed(stats):
    return 0.0 < stats.exact_fraction < 1.0


# T=200 (N=4, last block short), seed 6, tau=0.5: every configuration below routes a real mix of exact and
# approximate blocks, and every route score sits >= 1.6e-2 away from its threshold (asserted), so the
# finite differences of gradcheck (eps=1e-6) cannot flip a routing decision.
GC_SHAPE, GC_SEED, GC_TAU = (1, 200, 2, 8), 6, 0.5
SINKS = [(0, None), (20, 0)]
GC_TOL = dict(atol=1e-8, rtol=1e-5)  # float64 central differences (eps=1e-6) are good to ~1e-10


@pytest.mark.parametrize("thresh_type", ["diag", "exact"])
@pytest.mark.parametrize("sink", SINKS)
def test_augmented_formulation_equals_forward(thresh_type, sink):
    q, k, v = qkv(2, 200, 3, 16, seed=GC_SEED)
    kw = dict(tau=GC_TAU, thresh_type=thresh_type, sink_tokens=sink[0], sink_start=sink[1])
    out, stats = sol_attn(q, k, v, impl="torch", return_stats=True, **kw)
    assert mixed(stats)
    # the backward's routing is the forward's (same slices, same ops)
    passes = list(bw._route_passes(q, k, v, 16 ** -0.5, GC_TAU, thresh_type, sink[0], sink[1]))
    assert torch.equal(sum(ex.sum((1, 2)) for _, ex, _, _ in passes), stats.exact_pairs)
    aug = bw.sol_attn_augmented(q, k, v, 16 ** -0.5, kw["tau"], thresh_type, sink[0], sink[1])
    assert aug.dtype == torch.float64
    torch.testing.assert_close(aug, out, atol=1e-10, rtol=1e-10)


def test_attention_vjp_matches_autograd():
    """The written-out vjp of the augmented attention against autograd on the same function, with -inf
    (hidden) entries and a bias, two head groups and two query blocks."""
    g = torch.Generator().manual_seed(1)
    q, ka, va = (torch.randn(2, n, 8, generator=g, dtype=torch.float64) for n in (128, 75, 75))
    bias = torch.randn(2, 2, 75, generator=g, dtype=torch.float64)
    bias[torch.rand(2, 2, 75, generator=g) < 0.4] = float("-inf")
    bias[..., 0] = 0.0  # no fully hidden row
    go = torch.randn(2, 128, 8, generator=g, dtype=torch.float64)
    want = grads(lambda a, b, c: bw.augmented_attention(a, b, c, bias, 0.3), (q, ka, va), go)
    got = bw.augmented_attention_vjp(q, ka, va, bias, 0.3, go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("thresh_type", ["diag", "exact"])
@pytest.mark.parametrize("sink", SINKS)
def test_gradcheck_float64(thresh_type, sink):
    q, k, v = qkv(*GC_SHAPE, seed=GC_SEED, requires_grad=True)
    kw = dict(tau=GC_TAU, thresh_type=thresh_type, sink_tokens=sink[0], sink_start=sink[1], impl="torch")
    _, stats = sol_attn(q, k, v, return_stats=True, **kw)
    assert mixed(stats)
    assert route_margin(q, k, v, GC_TAU, thresh_type) > 1e-2
    # Fast mode (one random projection v^T J u per input): the full Jacobian of this size takes ~40 s. Its u, v
    # are non-negative and its atol is scaled by sum(u) * sum(v) (~2400 here), so the default atol=1e-5 lets
    # even a wrong centroid bias through; with these tolerances a 1 % error in dq fails.
    assert torch.autograd.gradcheck(lambda a, b, c: sol_attn(a, b, c, **kw), (q, k, v), fast_mode=True,
                                    **GC_TOL)


def test_gradcheck_full_jacobian_tiny():
    q, k, v = qkv(1, 150, 1, 4, seed=GC_SEED, requires_grad=True)
    kw = dict(tau=0.0, impl="torch")
    _, stats = sol_attn(q, k, v, return_stats=True, **kw)
    assert mixed(stats)
    assert route_margin(q, k, v, 0.0, "diag") > 1e-2
    assert torch.autograd.gradcheck(lambda a, b, c: sol_attn(a, b, c, **kw), (q, k, v), **GC_TOL)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
def test_all_exact_grads_equal_dense_sdpa(dtype, tol):
    q, k, v = qkv(2, 150, 2, 16, dtype=dtype, seed=2)
    go = smooth(q.shape, dtype, 9)
    got = grads(lambda a, b, c: sol_attn(a, b, c, tau=-1e9, impl="torch"), (q, k, v), go)
    want = grads(dense, (q, k, v), go)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype):
    q, k, v = qkv(1, 200, 2, 16, dtype=dtype, seed=GC_SEED)
    kw = dict(tau=GC_TAU, impl="torch")
    qf, kf, vf = (x.float() for x in (q, k, v))
    # same routing for the half inputs and their fp32 upcasts (else the grads are of different functions)
    scale = 16 ** -0.5
    ex_half = bw.route_for_backward(q, k, v, scale, GC_TAU, "diag", 0, None)[0]
    ex_f32 = bw.route_for_backward(qf, kf, vf, scale, GC_TAU, "diag", 0, None)[0]
    assert torch.equal(ex_half, ex_f32) and not ex_half.all()
    go = smooth(q.shape, torch.float32, 9)
    got = grads(lambda a, b, c: sol_attn(a, b, c, **kw), (q, k, v), go.to(dtype))
    want = grads(lambda a, b, c: sol_attn(a, b, c, **kw), (qf, kf, vf), go)
    for a, b in zip(got, want):
        assert a.dtype == dtype and torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b, atol=3e-2, rtol=3e-2)


def test_varlen_grads_equal_per_segment_grads():
    lens = [70, 0, 129, 1, 64]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    t = int(cu[-1])
    q, k, v = (x[0] for x in qkv(1, t, 2, 8, seed=4))
    go = smooth((t, 2, 8), torch.float64, 5)
    kw = dict(tau=0.3, sink_tokens=16, sink_start=8, impl="torch")
    got = grads(lambda a, b, c: sol_attn_varlen(a, b, c, cu, max(lens), **kw), (q, k, v), go)
    mixed_seen = False
    for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == a:
            continue
        seg = [x[None, a:e] for x in (q, k, v)]
        n = e - a  # varlen clips the sink to a shorter segment; sol_attn takes only a sink inside the sequence
        seg_kw = dict(kw, sink_start=min(8, n), sink_tokens=min(24, n) - min(8, n))
        mixed_seen |= mixed(sol_attn(*seg, return_stats=True, **seg_kw)[1])
        want = grads(lambda x, y, z: sol_attn(x, y, z, **seg_kw), seg, go[None, a:e])
        for g_all, g_seg in zip(got, want):
            torch.testing.assert_close(g_all[a:e], g_seg[0], atol=1e-12, rtol=1e-12)
    assert mixed_seen
    # a trailing empty segment (H3's alignment padding shape) changes nothing
    cu2 = torch.tensor([0, 70, 70], dtype=torch.int32)
    got2 = grads(lambda a, b, c: sol_attn_varlen(a, b, c, cu2, 70, **kw), [x[:70] for x in (q, k, v)], go[:70])
    torch.testing.assert_close(got2[0], got[0][:70], atol=1e-12, rtol=1e-12)


def test_chunked_backward_matches_single_chunk(monkeypatch):
    """Tiny budgets: one head per route pass, one head per group and 64 query rows per chunk, so the
    k/v grads accumulate over query chunks and over passes."""
    from accelpatch.sol_attn.op import torch_impl

    q, k, v = qkv(2, 200, 3, 8, seed=GC_SEED)
    go = smooth(q.shape, torch.float64, 7)
    kw = dict(tau=GC_TAU, impl="torch")
    whole = grads(lambda a, b, c: sol_attn(a, b, c, **kw), (q, k, v), go)
    assert bw._chunking(200, 4, 3, 8) == (3, 256)  # the default budget fits everything in one chunk
    monkeypatch.setattr(bw, "_CHUNK_SCORE_BYTES", 1)
    monkeypatch.setattr(torch_impl, "_MAX_ROUTE_ELEMS", 1)
    assert bw._chunking(200, 4, 3, 8) == (1, 64)
    chunked = grads(lambda a, b, c: sol_attn(a, b, c, **kw), (q, k, v), go)
    for a, b in zip(chunked, whole):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_backward_with_return_stats_and_sum_loss():
    """return_stats=True: the integer stats are not differentiable and do not disturb the backward;
    .sum() gives an expanded (stride-0) grad_out."""
    q, k, v = qkv(1, 130, 2, 8, seed=3, requires_grad=True)
    out, stats = sol_attn(q, k, v, tau=0.3, impl="torch", return_stats=True)
    assert not stats.exact_pairs.requires_grad
    out.sum().backward()
    want = grads(lambda a, b, c: sol_attn(a, b, c, tau=0.3, impl="torch"), (q, k, v), torch.ones_like(out))
    for x, g in zip((q, k, v), want):
        torch.testing.assert_close(x.grad, g, atol=1e-12, rtol=1e-12)
        assert x.grad.abs().sum() > 0


def test_compile_aot_eager_fullgraph_matches_eager():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    q, k, v = qkv(1, 150, 2, 8, dtype=torch.float32, seed=8)
    kw = dict(tau=0.5, sink_tokens=8, impl="torch")

    def loss(a, b, c):
        return (sol_attn(a * 2, b, c, **kw) ** 2).sum()

    want = grads(loss, (q, k, v), torch.tensor(1.0))
    torch._dynamo.reset()
    got = grads(torch.compile(loss, backend="aot_eager", fullgraph=True), (q, k, v), torch.tensor(1.0))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)

    # the backward graph holds the opaque backward op (traced through its fake impl, no graph break)
    codes = []

    def keep(gm, _example_inputs):
        codes.append(gm.code)
        return make_boxed_func(gm)

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    got2 = grads(compiled, (q, k, v), torch.tensor(1.0))
    assert len(codes) == 2 and "accelpatch.sol_attn_backward" in codes[1]
    for a, b in zip(got2, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not hasattr(torch._dynamo.config, "trace_autograd_ops"),
                    reason="this torch cannot trace Tensor.backward() inside a compiled function")
def test_compile_with_backward_inside_the_function():
    q, k, v = qkv(1, 150, 2, 8, dtype=torch.float32, seed=8, requires_grad=True)

    def step(a, b, c):
        sol_attn(a, b, c, tau=0.5, sink_tokens=8, impl="torch").sum().backward()

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v)
    got = [x.grad.clone() for x in (q, k, v)]
    want = grads(lambda a, b, c: sol_attn(a, b, c, tau=0.5, sink_tokens=8, impl="torch"), (q, k, v),
                 torch.ones_like(q))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_opcheck():
    from accelpatch.sol_attn.op import custom_op  # noqa: F401  (registers the ops)

    ops = torch.ops.accelpatch
    q, k, v = qkv(1, 130, 2, 8, dtype=torch.float32, seed=3, requires_grad=True)
    args = (q, k, v, 8 ** -0.5, 0.3, "diag", 1, 8, None, "torch", True)
    torch.library.opcheck(ops.sol_attn.default, args)
    qv, kv, vv = (x.detach()[0].requires_grad_() for x in (q, k, v))
    cu = torch.tensor([0, 50, 50, 130], dtype=torch.int32)
    torch.library.opcheck(ops.sol_attn_varlen.default, (qv, kv, vv, cu, 80, 8 ** -0.5, 0.3, "exact", 1, 8, 0,
                                                        "torch", True))
    go = smooth(q.shape, torch.float32, 4)
    torch.library.opcheck(ops.sol_attn_backward.default, (go, *(x.detach() for x in (q, k, v)), 8 ** -0.5, 0.3,
                                                           "diag", 8, None))
    torch.library.opcheck(ops.sol_attn_varlen_backward.default, (go[0], qv.detach(), kv.detach(), vv.detach(), cu,
                                                                 8 ** -0.5, 0.3, "exact", 8, 0))


def test_works_under_a_dispatch_mode():
    """Training tooling (FLOP counters, memory trackers) runs the backward under a TorchDispatchMode."""
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(1, 130, 1, 8, dtype=torch.float32, seed=3, requires_grad=True)
    with FlopCounterMode(display=False):
        sol_attn(q, k, v, tau=0.3, impl="torch").sum().backward()
    assert all(torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0 for x in (q, k, v))


def test_triton_forward_backward_matches_torch():
    pytest.importorskip("triton")
    q, k, v = qkv(1, 130, 1, 16, dtype=torch.float32, seed=11)
    go = smooth(q.shape, torch.float32, 12)
    kw = dict(tau=0.0, thresh_type="diag")
    out_t, stats_t = sol_attn(q, k, v, impl="triton", return_stats=True, **kw)
    out_p, stats_p = sol_attn(q, k, v, impl="torch", return_stats=True, **kw)
    assert mixed(stats_p) and torch.equal(stats_t.exact_pairs, stats_p.exact_pairs)
    # the backward differentiates the function the kernel computed: same routing, same output
    torch.testing.assert_close(bw.sol_attn_augmented(q, k, v, 0.25, 0.0, "diag", 0, None).float(), out_t,
                               atol=2e-5, rtol=2e-5)
    got = grads(lambda a, b, c: sol_attn(a, b, c, impl="triton", **kw), (q, k, v), go)
    want = grads(lambda a, b, c: sol_attn(a, b, c, impl="torch", **kw), (q, k, v), go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
