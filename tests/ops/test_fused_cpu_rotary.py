"""The CPU kernels of MiniMax-H3's rotate-half RoPE and SANA-Video 2.0's complex RoPE against their eager
reference chains (accelpatch.lossless.kernels.reference), bit for bit, with the helpers of test_fused_cpu.

Inputs: ties, specials (NaN, +-inf, +-0.0, subnormals), every bf16 value, rotary dims below the head dim, table
dtypes, tables with one row or strided, query/key as chunks of a fused projection, transposed and strided views,
D/2 pair counts with and without a vector tail. Also: deliberately wrong kernels (one rounding where eager has
several, tables not rounded first, float arithmetic for the complex product) are caught, and what is declined says
why.
"""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from accelpatch.lossless.kernels import cpu, cpu_build
from _by_name import CPU, REFERENCE as ref
from accelpatch.lossless.ops import rotary_complex_pair as complex_op

from .test_fused_cpu import BF16, F16, F32, F64, assert_all_same, assert_same, check, mixed, needs_kernels, tie_heavy


def _qk(shape, dtype, seed, ties=False):
    make = tie_heavy if ties else mixed
    return make(shape, dtype, seed), make(shape, dtype, seed + 1)


# ---- rotate_half_pair ------------------------------------------------------------------------------------------

HALF_DTYPES = [(q, t) for q in (BF16, F16, F32) for t in (F32, BF16)]


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", HALF_DTYPES)
@pytest.mark.parametrize("tokens", [1, 17, 257])
@pytest.mark.parametrize("head_dim,rotary", [(16, 16), (16, 6), (128, 96), (8, 2)])
def test_rotate_half_pair(qdtype, tdtype, tokens, head_dim, rotary):
    q, k = _qk((2, tokens, 3, head_dim), qdtype, 1)
    cos, sin = mixed((tokens, rotary), tdtype, 3), mixed((tokens, rotary), tdtype, 4)
    check("rotate_half_pair", q, k, cos, sin)
    q, k = _qk((1, tokens, 2, head_dim), qdtype, 5, ties=True)
    check("rotate_half_pair", q, k, tie_heavy((tokens, rotary), tdtype, 7), tie_heavy((tokens, rotary), tdtype, 8))


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", HALF_DTYPES)
def test_rotate_half_pair_layouts(qdtype, tdtype):
    """Query/key as chunks of a fused [B, S, 3 * H * D] projection, as a transposed [B, H, S, D] tensor, strided
    along D; tables of one row, transposed ([R, S] storage) and sliced from wider ones."""
    qkv = mixed((2, 17, 3 * 2 * 24), qdtype, 10)
    q, k, _ = (t.unflatten(-1, (2, 24)) for t in qkv.chunk(3, dim=-1))
    cos, sin = mixed((17, 12), tdtype, 11), mixed((17, 12), tdtype, 12)
    check("rotate_half_pair", q, k, cos, sin)
    heads_first = mixed((2, 2, 17, 24), qdtype, 13).transpose(1, 2)
    check("rotate_half_pair", heads_first, q, cos, sin)
    wide = mixed((2, 17, 2, 48), qdtype, 14)[..., 1::2]
    check("rotate_half_pair", wide, heads_first, cos, sin)
    check("rotate_half_pair", q, k, cos[:1], sin[:1])
    check("rotate_half_pair", q, k, mixed((12, 17), tdtype, 15).t(), mixed((17, 40), tdtype, 16)[:, 3:15])


@needs_kernels
def test_rotate_half_pair_release_shape():
    """MiniMax-H3: head dim 128, rotary dim 96, float32 tables, bf16 and float32 queries."""
    for dtype in (BF16, F32):
        q, k = _qk((1, 64, 4, 128), dtype, 20)
        check("rotate_half_pair", q, k, mixed((64, 96), F32, 22), mixed((64, 96), F32, 23))


@needs_kernels
def test_rotate_half_pair_every_bf16_value():
    from accelpatch.lossless.kernels.tables import all_bf16_values
    q = all_bf16_values(torch.device("cpu")).view(1, 256, 2, 128)
    for tdtype in (F32, BF16):
        cos, sin = mixed((256, 96), tdtype, 30), mixed((256, 96), tdtype, 31)
        check("rotate_half_pair", q, q.flip(1), cos, sin)
        check("rotate_half_pair", q, q, tie_heavy((256, 128), tdtype, 32), tie_heavy((256, 128), tdtype, 33))


def _rotate_half_once(x, cos, sin):
    """A wrong fusion: the whole rotation in float32, rounded once at the end."""
    r = cos.shape[-1]
    xf = x.float()
    rot = torch.cat((-xf[..., r // 2:r], xf[..., :r // 2]), dim=-1)
    out = xf.clone()
    out[..., :r] = xf[..., :r] * cos.float()[None, :, None] + rot * sin.float()[None, :, None]
    return out.to(x.dtype)


@needs_kernels
def test_comparison_catches_wrong_rotate_half():
    """One rounding at the end, and float32 tables not rounded to bf16 first: both differ from eager and are
    caught; the kernel's result passes."""
    q = tie_heavy((1, 33, 2, 16), BF16, 40)
    cos, sin = mixed((33, 12), F32, 41), mixed((33, 12), F32, 42)
    expected = ref.rotate_half(q, cos, sin)
    with pytest.raises(AssertionError, match="differ"):
        assert_same(_rotate_half_once(q, cos, sin), expected)
    unrounded = ref.rotate_half(q.float(), cos, sin).to(BF16)  # the tables kept in float32
    with pytest.raises(AssertionError, match="differ"):
        assert_same(unrounded, expected)
    assert_same(CPU.rotate_half_pair(q, q, cos, sin)[0], expected)


# ---- rotary_complex_pair ---------------------------------------------------------------------------------------

def _freqs(tokens, pairs, seed, specials=False):
    g = torch.Generator().manual_seed(seed)
    angles = torch.randn(tokens, pairs, generator=g, dtype=F64) * 50
    freqs = torch.polar(torch.ones_like(angles), angles)
    if specials:
        parts = torch.view_as_real(freqs).clone()
        flat = parts.view(-1)
        flat[:: 7] = mixed((flat[:: 7].numel(),), F64, seed + 1)
        freqs = torch.view_as_complex(parts)
    return freqs


COMPLEX_DTYPES = [BF16, F32]  # float64 is declined: see test_eager_float64_complex_rope_depends_on_its_loop


@needs_kernels
@pytest.mark.parametrize("dtype", COMPLEX_DTYPES)
@pytest.mark.parametrize("tokens", [1, 17, 257])
@pytest.mark.parametrize("head_dim", [10, 16, 112])
def test_rotary_complex_pair(dtype, tokens, head_dim):
    """Pair counts 5 (a vector tail in eager: declined, its scalar loop contracts the product), 8 and 56
    (SANA-Video 2.0's 112-wide heads); tables with specials."""
    q, k = _qk((2, tokens, 3, head_dim), dtype, 1)
    if head_dim // 2 % 8:
        assert "scalar loop" in CPU.unsupported("rotary_complex_pair", q, k, _freqs(tokens, head_dim // 2, 3))
        return
    check("rotary_complex_pair", q, k, _freqs(tokens, head_dim // 2, 3))
    check("rotary_complex_pair", q, k, _freqs(tokens, head_dim // 2, 4, specials=True))
    q, k = _qk((1, tokens, 2, head_dim), dtype, 5, ties=True)
    check("rotary_complex_pair", q, k, _freqs(tokens, head_dim // 2, 6))


@needs_kernels
@pytest.mark.parametrize("dtype", COMPLEX_DTYPES)
def test_rotary_complex_pair_layouts(dtype):
    """The model's q/k: chunks of a fused qkv projection, unflattened (non-contiguous); also transposed views, a
    table of one row, a transposed table, and (bf16, float32) a query strided along D."""
    qkv = mixed((2, 17, 3 * 4 * 16), dtype, 10)
    q, k, _ = (t.unflatten(-1, (4, 16)) for t in qkv.chunk(3, dim=-1))
    freqs = _freqs(17, 8, 11)
    check("rotary_complex_pair", q, k, freqs)
    heads_first = mixed((2, 4, 17, 16), dtype, 12).transpose(1, 2)
    check("rotary_complex_pair", heads_first, q, freqs)
    check("rotary_complex_pair", heads_first, heads_first, freqs[:1])
    # where eager would take its scalar loop (strided table or pairs), declined: it contracts the product there
    check("rotary_complex_pair", q, k, freqs[:, :1])  # one factor for every pair of a token (broadcast: vector loop)
    for args in ((q, k, _freqs(8, 17, 13).t()), (mixed((2, 17, 4, 32), dtype, 14)[..., ::2], k, freqs)):
        assert "scalar loop" in CPU.unsupported("rotary_complex_pair", *args)


@needs_kernels
def test_rotary_complex_pair_runs_with_one_thread_only():
    q, k = _qk((1, 17, 2, 16), BF16, 1)
    freqs = _freqs(17, 8, 3)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert "one CPU thread" in CPU.unsupported("rotary_complex_pair", q, k, freqs)
    finally:
        torch.set_num_threads(previous)
    check("rotary_complex_pair", q, k, freqs)


@needs_kernels
def test_rotary_complex_pair_every_bf16_value():
    from accelpatch.lossless.kernels.tables import all_bf16_values
    q = all_bf16_values(torch.device("cpu")).view(1, 256, 2, 128)
    check("rotary_complex_pair", q, q.flip(1), _freqs(256, 64, 20, specials=True))


@needs_kernels
def test_rotary_complex_pair_double_rounding_through_float():
    """1 * (1 + 2^-8 + 2^-40) is 1 + 2^-8 in float, a tie that goes to 1.0 in bf16 (a direct double -> bf16
    rounding would give 1.0078125); eager rounds through float, and so does the kernel."""
    q = torch.ones(1, 1, 1, 16, dtype=BF16)  # 8 pairs: a row eager runs through its vector loop
    freqs = torch.full((1, 8), complex(1 + 2.0 ** -8 + 2.0 ** -40, 0.0), dtype=torch.complex128)
    assert CPU.rotary_complex_pair(q, q, freqs)[0][0, 0, 0, 0].item() == 1.0
    check("rotary_complex_pair", q, q, freqs)


def _complex_fused_once(x, freqs):
    """A wrong kernel: ac - bd and ad + bc each rounded once in double (what a contracted multiply-add pair
    does, here exactly, by rational arithmetic), then cast as eager does."""
    xs = x.double().unflatten(-1, (-1, 2))
    f = torch.view_as_real(freqs)[None, :, None]
    a, b = xs[..., 0].reshape(-1).tolist(), xs[..., 1].reshape(-1).tolist()
    full = f.expand(*xs.shape)
    c, d = full[..., 0].reshape(-1).tolist(), full[..., 1].reshape(-1).tolist()
    re = [float(Fraction(p) * Fraction(r) - Fraction(q) * Fraction(s)) for p, q, r, s in zip(a, b, c, d)]
    im = [float(Fraction(p) * Fraction(s) + Fraction(q) * Fraction(r)) for p, q, r, s in zip(a, b, c, d)]
    out = torch.stack((torch.tensor(re, dtype=F64), torch.tensor(im, dtype=F64)), -1)
    return out.view(xs.shape).flatten(-2).to(x.dtype)


def _kernel_f64(q, k, freqs):
    """The float64 complex kernel called directly (the op declines float64; the self-check runs it like this)."""
    library, _ = cpu_build.load()
    args = (q, k, freqs)
    outs = tuple(torch.empty_like(t) for t in ref.rotary_complex_pair(*args))
    size, strides = cpu.flat_plan(complex_op._cpu_plan(args))
    library.rotary_complex(*args, *outs, size, strides)
    return outs


@needs_kernels
def test_comparison_catches_wrong_complex_rope():
    """On float64, where nothing hides the product's rounding: contracted products (one rounding for ac - bd) and
    float32 arithmetic both differ from eager (whose vector loop runs all 8 pairs of these rows) and are caught;
    the kernel's own float64 result passes."""
    q = mixed((1, 17, 2, 16), F64, 50).clamp(-1e6, 1e6).nan_to_num(0.0)
    freqs = _freqs(17, 8, 51)
    expected = ref.rotary_complex(q, freqs)
    with pytest.raises(AssertionError, match="differ"):
        assert_same(_complex_fused_once(q, freqs), expected)
    in_float = ref.rotary_complex(q.float(), freqs.to(torch.complex64)).double()
    with pytest.raises(AssertionError, match="differ"):
        assert_same(in_float, expected)
    assert_all_same(_kernel_f64(q, q.flip(1), freqs), ref.rotary_complex_pair(q, q.flip(1), freqs))


@needs_kernels
def test_eager_float64_complex_rope_depends_on_its_loop():
    """Records why float64 is declined: with 5 pairs per row eager's vector loop (8 complex values per step here)
    never runs, and its scalar loop's result differs from the separately rounded products that the vector loop
    (and the kernel) give (a multiply-add in its scalar loop, as far as can be told from outside). If this starts
    failing, eager no longer differs there and float64 could be taken."""
    q = mixed((1, 17, 2, 10), F64, 60).clamp(-1e6, 1e6).nan_to_num(0.0)
    freqs = _freqs(17, 5, 61)
    eager = ref.rotary_complex(q, freqs)
    with pytest.raises(AssertionError, match="differ"):
        assert_same(_kernel_f64(q, q, freqs)[0], eager)
    assert "float64" in CPU.unsupported("rotary_complex_pair", q, q, freqs)


# ---- what is declined, with a reason ---------------------------------------------------------------------------

@needs_kernels
def test_rotary_unsupported_reasons():
    q = torch.zeros(1, 4, 2, 16, dtype=BF16)
    t = torch.zeros(4, 12)
    assert CPU.unsupported("rotate_half_pair", q, q, t, t) is None
    assert "dtype" in CPU.unsupported("rotate_half_pair", q.double(), q.double(), t, t)
    assert "one dtype" in CPU.unsupported("rotate_half_pair", q, q.float(), t, t)
    assert "tables" in CPU.unsupported("rotate_half_pair", q, q, t.double(), t.double())
    assert "even rotary dim" in CPU.unsupported("rotate_half_pair", q, q, t[:, :7], t[:, :7])
    assert "even rotary dim" in CPU.unsupported("rotate_half_pair", q, q, torch.zeros(4, 18), torch.zeros(4, 18))
    assert "broadcast" in CPU.unsupported("rotate_half_pair", q, q, t[:3], t[:3])
    assert "[S, R]" in CPU.unsupported("rotate_half_pair", q, q, t[None], t[None])
    freqs = torch.ones(4, 8, dtype=torch.complex128)
    assert CPU.unsupported("rotary_complex_pair", q, q, freqs) is None
    assert "dtype" in CPU.unsupported("rotary_complex_pair", q.half(), q.half(), freqs)
    assert "complex128" in CPU.unsupported("rotary_complex_pair", q, q, freqs.to(torch.complex64))
    assert "conjugated" in CPU.unsupported("rotary_complex_pair", q, q, freqs.conj())
    assert "broadcast" in CPU.unsupported("rotary_complex_pair", q, q, freqs[:, :5])
    assert "even D" in CPU.unsupported("rotary_complex_pair", q[..., :15], q[..., :15], freqs)
    assert "float64" in CPU.unsupported("rotary_complex_pair", q.double(), q.double(), freqs)
    assert "dense real" in CPU.unsupported("rotate_half_pair", q, q, t, t.to(torch.complex64))


@needs_kernels
def test_a_library_failing_the_rotary_known_answer_check_is_refused(monkeypatch):
    """The self-check covers the new kernels: a rotate-half op that swaps the rounding policies (MiniMax-H3's
    rounding in the activations' dtype and the split RoPE's float32 chain, which also reads its tables otherwise)
    fails it."""
    library, _ = cpu_build.load()

    class Wrong:
        def __getattr__(self, name):
            return getattr(library, name)

        @staticmethod
        def rotate_half(*args):
            *rest, policy = args
            return library.rotate_half(*rest, cpu.SPLIT_MUL_ADD if policy == cpu.ROTATE_HALF_IN_Q
                                       else cpu.ROTATE_HALF_IN_Q)

    monkeypatch.setattr(cpu, "_SELF_CHECK", [])
    monkeypatch.setattr(cpu_build, "_RESULT", (Wrong(), None))
    reason = CPU.unsupported("rotate_half_pair", torch.zeros(1, 4, 2, 16), torch.zeros(1, 4, 2, 16),
                             torch.zeros(4, 12), torch.zeros(4, 12))
    assert reason is not None and "known-answer" in reason
