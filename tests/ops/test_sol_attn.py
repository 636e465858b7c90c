"""Sol-Attn PyTorch implementation and public API against dense SDPA and an independent float64 reference.

The reference below is deliberately simple float64 code written from sol_attn.md (one query row at a time),
sharing nothing with accelpatch."""
import math
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from accelpatch.sol_attn.op import SolAttnStats, sol_attn, sol_attn_varlen

# ---- independent float64 reference ----

BLOCK = 64


def always_exact_blocks(t, sink_tokens, sink_start):
    """Per query block, the set of key blocks that are exact whatever tau is (neighbours and sink)."""
    n = math.ceil(t / BLOCK)
    sink = set()
    if sink_tokens > 0:
        s = t - sink_tokens if sink_start is None else sink_start
        first, last = math.floor(s / BLOCK), math.ceil((s + sink_tokens) / BLOCK) - 1
        sink = {j for j in range(n) if first <= j <= last}
    return [{j for j in range(n) if abs(i - j) <= 1} | sink for i in range(n)]


def reference_sol_attn(q, k, v, *, scale=None, tau=1.0, thresh_type="diag", sink_tokens=0, sink_start=None):
    """q, k, v [B, T, H, D] -> float64 output [B, T, H, D] and the exact-pair count per head."""
    q, k, v = q.double(), k.double(), v.double()
    b_, t, h_, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    c = scale * math.log2(math.e)
    n = math.ceil(t / BLOCK)
    spans = [(j * BLOCK, min(t, (j + 1) * BLOCK)) for j in range(n)]
    forced = always_exact_blocks(t, sink_tokens, sink_start)
    out = torch.zeros(b_, t, h_, d, dtype=torch.float64)
    pairs = [0] * h_
    for b in range(b_):
        for h in range(h_):
            Q, K, V = q[b, :, h], k[b, :, h], v[b, :, h]
            kc = torch.stack([K[a:e].mean(0) for a, e in spans])
            vc = torch.stack([V[a:e].sum(0) for a, e in spans])
            qbar = torch.stack([Q[a:e].mean(0) for a, e in spans])
            mu = kc.mean(0)
            if thresh_type == "diag":
                var = ((kc - mu) ** 2).mean(0)
                sig2 = [float((qbar[i] ** 2 * var).sum()) for i in range(n)]
            else:
                m = kc.T @ kc / n
                sig2 = [max(float(qbar[i] @ m @ qbar[i] - (qbar[i] @ mu) ** 2), 0.0) for i in range(n)]
            for i, (a, e) in enumerate(spans):
                thr = c * float(qbar[i] @ mu) + tau * math.sqrt(c * c * sig2[i] + 1e-6)
                exact = [j in forced[i] or c * float(qbar[i] @ kc[j]) > thr for j in range(n)]
                pairs[h] += sum(exact)
                for row in range(a, e):
                    logits, values, weights = [], [], []
                    for j, (ka, ke) in enumerate(spans):
                        if exact[j]:
                            logits.append(c * (K[ka:ke] @ Q[row]))
                            values.append(V[ka:ke])
                            weights.append(torch.ones(ke - ka, dtype=torch.float64))
                        else:  # rank-1 correction: every key of the block taken as kc_j
                            logits.append((c * (kc[j] @ Q[row])).reshape(1))
                            values.append(vc[j][None])
                            weights.append(torch.tensor([float(ke - ka)], dtype=torch.float64))
                    lg = torch.cat(logits)
                    p = torch.exp2(lg - lg.max())
                    num = (p[:, None] * torch.cat(values)).sum(0)
                    den = (p * torch.cat(weights)).sum()
                    out[b, row, h] = num / den
    return out, pairs


# ---- tests ----

def rand(shape, dtype=torch.float32, seed=0, smooth=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if smooth:  # slowly varying along T, so intermediate tau gives a mix of exact and approximate blocks
        x = x.cumsum(1) / 4 + 0.5 * torch.randn(shape, generator=g)
    return x.to(dtype)


def qkv(b, t, h, d, dtype=torch.float32, seed=0, smooth=False):
    return [rand((b, t, h, d), dtype, seed + i, smooth) for i in range(3)]


def dense(q, k, v, scale=None):
    o = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v)), scale=scale)
    return o.transpose(1, 2)


@pytest.mark.parametrize("t", [1, 37, 64, 65, 200])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_all_exact_equals_dense(t, dtype, atol):
    q, k, v = qkv(2, t, 2, 64, dtype)
    out, stats = sol_attn(q, k, v, tau=-1e9, impl="torch", return_stats=True)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), dense(q, k, v), atol=atol, rtol=atol)
    assert stats.exact_fraction == 1.0


def _sink_fits(t, sink):
    tokens, start = sink
    return tokens <= t and (t - tokens if start is None else start) + tokens <= t


@pytest.mark.parametrize("thresh_type", ["diag", "exact"])
@pytest.mark.parametrize("t,sink", [(t, sink) for t in (1, 100, 257)
                                    for sink in [(0, None), (1, None), (1, 0), (70, None), (10, 0), (40, 150)]
                                    if _sink_fits(t, sink)])
def test_only_forced_blocks_matches_float64_reference(t, thresh_type, sink):
    q, k, v = qkv(1, t, 2, 64, seed=3)
    kw = dict(tau=1e9, thresh_type=thresh_type, sink_tokens=sink[0], sink_start=sink[1])
    out, stats = sol_attn(q, k, v, impl="torch", return_stats=True, **kw)
    ref, pairs = reference_sol_attn(q, k, v, **kw)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    forced = always_exact_blocks(t, sink[0], sink[1])
    n = math.ceil(t / 64)
    assert stats.exact_fraction == pytest.approx(sum(map(len, forced)) / n**2)
    assert stats.exact_pairs.tolist() == pairs


@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("thresh_type", ["diag", "exact"])
def test_intermediate_tau_matches_float64_reference(tau, thresh_type):
    q, k, v = qkv(1, 448, 2, 64, seed=7, smooth=True)
    out, stats = sol_attn(q, k, v, tau=tau, thresh_type=thresh_type, impl="torch", return_stats=True)
    ref, pairs = reference_sol_attn(q, k, v, tau=tau, thresh_type=thresh_type)
    assert stats.exact_pairs.tolist() == pairs
    n = 7
    assert all(3 * n - 2 < p < n * n for p in pairs), "test data must route some blocks each way"
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out.float(), dense(q, k, v), atol=1e-3)


def test_sinks_and_ragged_t_with_scale():
    q, k, v = qkv(2, 300, 1, 64, seed=11, smooth=True)
    for st, ss in [(50, None), (64, 0), (1, 299), (100, 30)]:
        kw = dict(tau=0.7, sink_tokens=st, sink_start=ss, scale=0.1)
        out = sol_attn(q, k, v, impl="torch", **kw)
        ref, _ = reference_sol_attn(q, k, v, **kw)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_head_dims(d):
    q, k, v = qkv(1, 130, 1, d, seed=d, smooth=True)
    out = sol_attn(q, k, v, tau=0.5, impl="torch")
    ref, _ = reference_sol_attn(q, k, v, tau=0.5)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_follow_reference_within_half_tolerance(dtype):
    q, k, v = qkv(1, 200, 2, 64, dtype, seed=5)
    out = sol_attn(q, k, v, tau=1e9, sink_tokens=20, impl="torch")
    assert out.dtype == dtype
    ref, _ = reference_sol_attn(q, k, v, tau=1e9, sink_tokens=20)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_batch_items_never_mix():
    q, k, v = qkv(3, 150, 2, 64, seed=1, smooth=True)
    kw = dict(tau=0.5, sink_tokens=30, sink_start=10, impl="torch")
    base = sol_attn(q, k, v, **kw)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[1] = torch.randn_like(x[1]) * 3
    changed = sol_attn(q2, k2, v2, **kw)
    assert torch.equal(base[0], changed[0]) and torch.equal(base[2], changed[2])
    assert not torch.equal(base[1], changed[1])
    alone = sol_attn(q[:1], k[:1], v[:1], **kw)
    torch.testing.assert_close(alone[0], base[0], atol=1e-6, rtol=1e-6)


def test_non_contiguous_inputs():
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv(2, 100, 2, 64, seed=2))
    assert not q.is_contiguous()
    out = sol_attn(q, k, v, tau=0.3, impl="torch")
    torch.testing.assert_close(out, sol_attn(q.contiguous(), k.contiguous(), v.contiguous(), tau=0.3, impl="torch"))


def test_varlen_segments_are_independent():
    lens = [70, 0, 129, 1, 64]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    t = int(cu[-1])
    q, k, v = (x[0] for x in qkv(1, t, 2, 64, seed=4, smooth=True))
    kw = dict(tau=0.5, sink_tokens=16, sink_start=8, impl="torch")
    out, stats = sol_attn_varlen(q, k, v, cu, max(lens), return_stats=True, **kw)
    total = 0
    for a, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == a:
            continue
        ref, _ = reference_sol_attn(q[None, a:e], k[None, a:e], v[None, a:e], tau=0.5, sink_tokens=16, sink_start=8)
        torch.testing.assert_close(out[a:e].double(), ref[0], atol=1e-5, rtol=1e-5)
        total += math.ceil((e - a) / 64) ** 2
    assert int(stats.total_pairs) == total
    # changing one segment leaves the others bitwise unchanged
    q2 = q.clone()
    q2[70:199] = torch.randn(129, 2, 64)
    k2 = k.clone()
    k2[70:199] = torch.randn(129, 2, 64)
    out2 = sol_attn_varlen(q2, k2, v, cu, max(lens), **kw)
    assert torch.equal(out2[:70], out[:70]) and torch.equal(out2[199:], out[199:])
    assert not torch.equal(out2[70:199], out[70:199])


def test_stats_per_head():
    q, k, v = qkv(2, 256, 3, 64, seed=9, smooth=True)
    _, s_dense = sol_attn(q, k, v, tau=-1e9, impl="torch", return_stats=True)
    assert isinstance(s_dense, SolAttnStats)
    assert s_dense.exact_fraction == 1.0 and torch.equal(s_dense.exact_fraction_per_head, torch.ones(3, dtype=torch.float64))
    _, s = sol_attn(q, k, v, tau=1e9, sink_tokens=64, sink_start=0, impl="torch", return_stats=True)
    forced = always_exact_blocks(256, 64, 0)
    expected = sum(map(len, forced)) / 16
    assert s.exact_fraction == pytest.approx(expected)
    assert s.exact_fraction_per_head.tolist() == pytest.approx([expected] * 3)
    _, s_mid = sol_attn(q, k, v, tau=0.5, impl="torch", return_stats=True)
    assert expected - 0.1 < s_mid.exact_fraction < 1.0


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(thresh_type="full"), ValueError, "thresh_type"),
        (dict(tau=float("nan")), ValueError, "tau"),
        (dict(tau=float("inf")), ValueError, "tau"),
        (dict(kv_splits=3), ValueError, "kv_splits"),
        (dict(sink_tokens=-1), ValueError, "sink_tokens"),
        (dict(sink_start=-5), ValueError, "sink_start"),
        (dict(scale=0.0), ValueError, "scale"),
        (dict(impl="cuda"), ValueError, "impl.*auto.*torch.*triton.*upstream"),
    ],
)
def test_bad_options(kw, exc, match):
    q, k, v = qkv(1, 10, 1, 64)
    with pytest.raises(exc, match=match):
        sol_attn(q, k, v, **kw)


def test_bad_tensors():
    q, k, v = qkv(1, 10, 1, 64)
    with pytest.raises(ValueError, match="q must be 4-D"):
        sol_attn(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="same shape"):
        sol_attn(q, k[:, :5], v)
    with pytest.raises(TypeError, match="same dtype"):
        sol_attn(q, k.half(), v)
    with pytest.raises(TypeError, match="q dtype"):
        sol_attn(q.int(), k.int(), v.int())
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        sol_attn(q, None, v)
    with pytest.raises(ValueError, match="T must be >= 1"):
        sol_attn(q[:, :0], k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="q must be 3-D"):
        sol_attn_varlen(q, k, v, torch.tensor([0, 10]), 10)
    with pytest.raises(TypeError, match="cu_seqlens"):
        sol_attn_varlen(q[0], k[0], v[0], [0, 10], 10)
    with pytest.raises(ValueError, match="cu_seqlens"):
        sol_attn_varlen(q[0], k[0], v[0], torch.tensor([0, 4]), 10)
    with pytest.raises(ValueError, match="max_seqlen"):
        sol_attn_varlen(q[0], k[0], v[0], torch.tensor([0, 10]), 4)


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v = qkv(1, 10, 1, 64)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        sol_attn(q, k, v, impl="triton")


def test_upstream_falls_back_with_recorded_reason():
    from accelpatch.sol_attn.op import upstream

    q, k, v = qkv(1, 70, 1, 64)
    upstream.FALLBACKS.reset()
    before = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sol_attn(q, k, v, impl="upstream")
        sol_attn(q, k, v, impl="upstream")
    assert sum(upstream.FALLBACKS.counts.values()) == before + 2
    assert upstream.FALLBACKS.last_reason  # e.g. "not importable" or "needs CUDA tensors"
    assert len([w for w in caught if "falls back" in str(w.message)]) == 1
    torch.testing.assert_close(out, sol_attn(q, k, v, impl="torch"))


def test_auto_on_cpu_is_torch():
    q, k, v = qkv(1, 70, 1, 64, seed=6)
    assert torch.equal(sol_attn(q, k, v), sol_attn(q, k, v, impl="torch"))


def test_compiles_without_graph_break():
    q, k, v = qkv(1, 70, 2, 64, seed=8)

    def f(q, k, v):
        out, stats = sol_attn(q * 2, k, v, tau=0.5, sink_tokens=8, impl="torch", return_stats=True)
        seg = sol_attn_varlen(q[0], k[0], v[0], torch.tensor([0, 30, 70]), 40, impl="torch")
        return out + 1, stats.exact_pairs, seg

    torch._dynamo.reset()
    explain = torch._dynamo.explain(f)(q, k, v)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v)
    want = f(q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_package_import_does_not_import_triton():
    code = "import sys, accelpatch.sol_attn.op; assert 'triton' not in sys.modules, 'triton imported'; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_head_chunking_matches_single_pass(monkeypatch):
    from accelpatch.sol_attn.op import torch_impl

    q, k, v = qkv(1, 200, 5, 64, seed=12, smooth=True)
    whole = sol_attn(q, k, v, tau=0.5, impl="torch", return_stats=True)
    monkeypatch.setattr(torch_impl, "_MAX_ROUTE_ELEMS", 2 * 256 * 4)  # two heads per pass
    chunked = sol_attn(q, k, v, tau=0.5, impl="torch", return_stats=True)
    torch.testing.assert_close(chunked[0], whole[0], atol=1e-6, rtol=1e-6)
    assert torch.equal(chunked[1].exact_pairs, whole[1].exact_pairs)


# ---- block-clustered ("scattered") inputs, D = 256, and every chunking path of the fp32/fp64 implementation ----

def scattered_qkv(t, h, d, dtype=torch.float32, seed=0, spread=2.0):
    """Keys clustered per 64-block around a random centroid per block, queries and values i.i.d.: a query
    block's exact key blocks are then scattered over the sequence instead of sitting near the diagonal."""
    g = torch.Generator().manual_seed(seed)
    n = math.ceil(t / BLOCK)
    cent = spread * torch.randn(1, n, 1, h, d, generator=g)
    k = cent.expand(1, n, BLOCK, h, d).reshape(1, n * BLOCK, h, d)[:, :t] + torch.randn(1, t, h, d, generator=g)
    q, v = torch.randn(1, t, h, d, generator=g), torch.randn(1, t, h, d, generator=g)
    return [x.to(dtype) for x in (q, k.contiguous(), v)]


_REF_CACHE = {}


def cached_reference(key, q, k, v, **kw):
    if key not in _REF_CACHE:
        _REF_CACHE[key] = reference_sol_attn(q, k, v, **kw)
    return _REF_CACHE[key]


def test_scattered_inputs_route_off_the_diagonal():
    """The scattered family really has exact blocks far from the diagonal (not only neighbours)."""
    from accelpatch.sol_attn.op.torch_impl import route

    q, k, v = scattered_qkv(1024, 2, 64, seed=1)
    exact = route(q, k, v, 64**-0.5, 1.0, "diag", 0, None)[0][0]  # [H, N, N]
    ar = torch.arange(exact.shape[-1])
    far = exact & ((ar[:, None] - ar[None, :]).abs() > 2)
    assert far.sum() > 0.5 * (exact.sum() - 3 * exact.shape[-1] * exact.shape[0])


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("piece_blocks,batch_blocks", [(None, None), (1, 1), (2, 5)])
def test_chunking_paths_match_float64_reference(monkeypatch, d, dtype, tol, piece_blocks, batch_blocks):
    """Ragged T (last block of 9 tokens), two heads, scattered exact blocks, a sink, some items with every block
    exact: with the default workspaces, with one-item chunks gathered one key block per piece, and with small
    batched chunks (padding slots and the short last block masked), the output matches the float64 reference."""
    from accelpatch.sol_attn.op import torch_impl

    esz = torch.tensor([], dtype=dtype).element_size()
    if piece_blocks:
        monkeypatch.setattr(torch_impl, "_PIECE_BYTES", piece_blocks * BLOCK * d * esz)
    if batch_blocks:
        monkeypatch.setattr(torch_impl, "_BATCH_BYTES", batch_blocks * BLOCK * d * esz)
    t = 457
    q, k, v = scattered_qkv(t, 2, d, torch.float64, seed=d)
    for tau, kw in [(0.5, {}), (-0.3, dict(sink_tokens=70, sink_start=130)), (1.5, dict(thresh_type="exact"))]:
        out, stats = sol_attn(q.to(dtype), k.to(dtype), v.to(dtype), tau=tau, impl="torch", return_stats=True, **kw)
        ref, pairs = cached_reference((d, tau), q, k, v, tau=tau, **kw)
        assert out.dtype == dtype
        assert stats.exact_pairs.tolist() == pairs
        torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("d", [64, 256])
def test_chunking_covers_full_and_sparse_items(d):
    """The data of test_chunking_paths_match_float64_reference has items of every kind: all blocks exact, many
    exact blocks, few exact blocks, and the short last key block exact for some."""
    from accelpatch.sol_attn.op.torch_impl import route

    q, k, v = scattered_qkv(457, 2, d, torch.float64, seed=d)
    n = math.ceil(457 / BLOCK)
    exact = route(q, k, v, d**-0.5, -0.3, "diag", 70, 130)[0]
    counts = exact.sum(-1).flatten().tolist()
    assert n in counts and any(c < n for c in counts) and exact[..., n - 1].any()
    counts = route(q, k, v, d**-0.5, 1.5, "exact", 0, None)[0].sum(-1).flatten().tolist()
    assert min(counts) <= 3 and max(counts) < n and len(set(counts)) > 2


def test_head_dim_256_matches_float64_reference():
    q, k, v = qkv(2, 200, 2, 256, seed=21, smooth=True)
    for tau, kw in [(0.0, dict(sink_tokens=30)), (0.8, dict(thresh_type="exact", scale=0.05))]:
        out, stats = sol_attn(q, k, v, tau=tau, impl="torch", return_stats=True, **kw)
        ref, pairs = reference_sol_attn(q, k, v, tau=tau, **kw)
        assert stats.exact_pairs.tolist() == pairs
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    full = sol_attn(q, k, v, tau=-1e9, impl="torch")
    torch.testing.assert_close(full, dense(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_head_dim_256_half_follows_reference(dtype, atol):
    q, k, v = scattered_qkv(150, 1, 256, dtype, seed=5)
    out = sol_attn(q, k, v, tau=0.7, sink_tokens=20, impl="torch")
    ref, _ = reference_sol_attn(q, k, v, tau=0.7, sink_tokens=20)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)


def test_triton_interpreter_head_dim_256():
    """The Triton kernel (BLOCK_D = next power of two = 256) in the interpreter, tiny shape, against the
    PyTorch implementation and the float64 reference."""
    pytest.importorskip("triton")
    q, k, v = scattered_qkv(130, 1, 256, seed=3)
    kw = dict(tau=0.5, sink_tokens=10)
    out, stats = sol_attn(q, k, v, impl="triton", return_stats=True, **kw)
    want, want_stats = sol_attn(q, k, v, impl="torch", return_stats=True, **kw)
    assert stats.exact_pairs.tolist() == want_stats.exact_pairs.tolist()
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    ref, _ = reference_sol_attn(q, k, v, **kw)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)
