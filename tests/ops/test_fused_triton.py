"""The fused ops' Triton kernels (accelpatch.lossless.ops) against the eager reference chains, bit for bit,
in Triton's interpreter on CPU (TRITON_INTERPRET=1, set by the test command).

Inputs are built to hit the edges: bf16/fp32 rounding ties (small integers times powers of two, whose sums and
products land halfway between two bf16 values), NaN, +-inf, +-0.0, subnormals, magnitudes 0.005 / 1 / 200, token
counts 1 / 17 / 257, and transposed, strided and broadcast views. Raw bits are compared (NaN: same positions, any
payload) with dtype, shape and strides. Deliberately wrong kernels (a missing bf16 rounding, a contracted FMA, a
rotate-half RoPE rounded once, each wrong form of the complex multiply) must be caught by the same check. Shapes
stay small: the interpreter runs a program in numpy ops.
"""
import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1", allow_module_level=True)

from _triton_interpreter import FMA_REASON, fma_is_fused  # noqa: E402

from _by_name import REFERENCE as reference, TRITON as tk  # noqa: E402
from accelpatch.lossless.kernels.tables import all_bf16_values, unary_table  # noqa: E402
from accelpatch.lossless.ops import rotary_complex_pair as complex_op, sigmoid_gate as sigmoid_gate_op  # noqa: E402
from accelpatch.lossless.verify import FusedOp  # noqa: E402

MAGNITUDES = (0.005, 1.0, 200.0)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bit_identical(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape, strides and bits; NaN at the same positions (payloads may differ, as in eager)."""
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), what
    nan_got, nan_want = got.isnan(), want.isnan()
    assert torch.equal(nan_got, nan_want), f"{what}: NaN positions differ"
    bits = _BITS[got.element_size()]
    differ = (got.view(bits) != want.view(bits)) & ~nan_want
    assert not differ.any(), (f"{what}: {int(differ.sum())} of {got.numel()} elements differ, first at "
                              f"{differ.nonzero()[0].tolist()}: {got[differ][0].item()!r} vs "
                              f"{want[differ][0].item()!r}")


def assert_same_outputs(got, want, what=""):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bit_identical(g, w, f"{what} output {i}")


def edge(shape, dtype, seed, magnitude=1.0):
    """Random values of `magnitude` (normal and tie-heavy small integers times powers of two), with NaN, +-inf,
    +-0.0, subnormals and the largest finite value at the first positions."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    normal = torch.randn(n, generator=g) * magnitude
    exp2 = 2.0 ** torch.round(torch.log2(torch.tensor(magnitude))).item()
    ties = torch.randint(-600, 600, (n,), generator=g).float() * (exp2 / 256)
    flat = torch.where(torch.rand(n, generator=g) < 0.5, normal, ties)
    info = torch.finfo(dtype)
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, info.smallest_normal / 4,
                            -info.smallest_normal / 8, info.smallest_normal, info.max, -1.0, 1.0 + info.eps / 2],
                           dtype=torch.float64)
    flat = flat.to(torch.float64)
    flat[: min(n, special.numel())] = special[: n]
    return flat.to(dtype).view(shape)


def check(name, *args):
    assert tk.unsupported(name, *args) is None, tk.unsupported(name, *args)
    assert_same_outputs(getattr(tk, name)(*args), getattr(reference, name)(*args), name)


# ---------------------------------------------------------------------------------------- modulate, residual

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_modulate_rows_and_per_token_views(dtype):
    rows = edge((2, 1, 2, 32), dtype, 2, 1.0)  # [B, 1, 2, C]: the T2V modulation rows
    for tokens, magnitude in ((1, 200.0), (17, 1.0)):
        x = edge((2, tokens, 32), dtype, 1, magnitude)
        check("modulate", x, rows[:, :, 0], rows[:, :, 1])
        table = edge((2, tokens, 6, 32), dtype, 3, magnitude)  # I2V: per-token rows, token stride 6C
        check("modulate", x, table[:, :, 1], table[:, :, 0])
    x = edge((1, 32, 257), dtype, 4, 0.005).transpose(1, 2)  # 257 tokens, a transposed normalised input
    check("modulate", x, rows[:1, :, 0], rows[:1, :, 1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gated_residual_transposed_residual_and_gates(dtype):
    for batch, tokens, magnitude in ((2, 1, 1.0), (2, 17, 200.0), (1, 257, 0.005)):
        residual = edge((batch, 32, tokens), dtype, 5, magnitude).transpose(1, 2)  # the patch-embedding view
        x = edge((batch, tokens, 32), dtype, 6, magnitude)
        gates = edge((batch, tokens, 6, 32), dtype, 7, 1.0)
        check("gated_residual", residual, gates[:, :, 2], x)  # N-minor output: one program per channel row
        if tokens < 257:
            check("gated_residual", residual.contiguous(), gates[:, :1, 5], x)
            check("gated_residual", x, edge((32,), dtype, 8), residual)  # 1-D gate, transposed third operand


# ---------------------------------------------------------------------------------------- SiLU, GLU (tables)

def test_silu_every_bf16_value_contiguous_and_strided():
    values = all_bf16_values(torch.device("cpu"))
    check("silu", values)
    check("silu", values.view(256, 256).t())
    check("silu", values.view(64, 1024)[:, ::3])


def test_glu_gate_every_bf16_value_of_the_gate():
    g = torch.Generator().manual_seed(9)
    gate = all_bf16_values(torch.device("cpu"))
    x = edge((65536,), torch.bfloat16, 10)[torch.randperm(65536, generator=g)]
    check("glu_gate", x, gate)
    check("glu_gate", x.view(64, 1024).t(), gate.view(1024, 64))  # channels-last-like mixed layouts
    check("glu_gate", x.view(4, 16384)[:, :1024], gate.view(64, 1024)[0])  # broadcast gate


def test_sigmoid_gate_every_bf16_value_of_the_gate():
    g = torch.Generator().manual_seed(11)
    gate = all_bf16_values(torch.device("cpu"))
    x = edge((65536,), torch.bfloat16, 12)[torch.randperm(65536, generator=g)]
    check("sigmoid_gate", x, gate)
    check("sigmoid_gate", x.view(256, 256).t(), gate.view(256, 256))  # transposed (non-contiguous) x


@pytest.mark.parametrize("tokens", [1, 17])
def test_sigmoid_gate_key_and_output_gates(tokens):
    """SANA-Video 2.0's gates: sigmoid(beta) [B, N, H, 1] over the head dim of a qkv-chunk key, and the output
    gate [B, N, C] on a contiguous and on an N-minor (transposed) attention output."""
    key = edge((2, tokens, 3 * 4 * 16), torch.bfloat16, 13).chunk(3, dim=-1)[1].unflatten(-1, (4, 16))
    check("sigmoid_gate", key, edge((2, tokens, 4), torch.bfloat16, 14, 200.0)[..., None])
    gate = edge((2, tokens, 32), torch.bfloat16, 15)
    check("sigmoid_gate", edge((2, tokens, 32), torch.bfloat16, 16, 0.005), gate)
    check("sigmoid_gate", edge((2, 32, tokens), torch.bfloat16, 17).transpose(1, 2), gate)


def test_sigmoid_gate_with_the_silu_table_is_caught(monkeypatch):
    """The same launch gathering from the SiLU table (glu_gate's) instead of the sigmoid one is caught."""
    gate = all_bf16_values(torch.device("cpu"))
    x = edge((65536,), torch.bfloat16, 18)
    want = reference.sigmoid_gate(x, gate)
    assert_bit_identical(tk.sigmoid_gate(x, gate), want)
    silu_table = unary_table("silu", F.silu, x.device)
    monkeypatch.setattr(sigmoid_gate_op, "unary_table", lambda *args: silu_table)
    with pytest.raises(AssertionError, match="differ"):
        assert_bit_identical(tk.sigmoid_gate(x, gate), want)


# ---------------------------------------------------------------------------------------- scale_to_tokens

@pytest.mark.parametrize("z_dtype,dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.bfloat16),
                                           (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16),
                                           (torch.float32, torch.float16), (torch.bfloat16, torch.float32)])
def test_scale_to_tokens_n_minor_output(z_dtype, dtype):
    """SANA-Video's normaliser z is bf16 (1 / (k.sum @ q + 1e-15) on bf16 q, k): x * z promotes to fp32 with z
    widened exactly, and the one rounding is the final cast."""
    for tokens, magnitude in ((1, 1.0), (17, 200.0), (257, 0.005)):
        x = edge((2, 3, 8, tokens), torch.float32, 11, magnitude)
        z = edge((2, 3, 1, tokens), z_dtype, 12, 1.0)
        check("scale_to_tokens", x, z, dtype)
    x = edge((2, 17, 3, 8), torch.float32, 13).permute(0, 2, 3, 1)  # a permuted x: eager copies in flatten
    check("scale_to_tokens", x, z[..., :17], dtype)


def test_scale_to_tokens_with_the_normaliser_sana_video_makes():
    """z as the SANA-Video processor computes it on bf16 q, k ([B, H, D, N] permuted views): a bf16 [B, H, 1, N]."""
    q = F.relu(edge((1, 40, 2, 16), torch.bfloat16, 41)).permute(0, 2, 3, 1)
    k = F.relu(edge((1, 40, 2, 16), torch.bfloat16, 42)).permute(0, 2, 3, 1)
    z = 1 / (k.sum(dim=-1, keepdim=True).transpose(-2, -1) @ q + 1e-15)
    x = torch.matmul(edge((1, 2, 16, 16), torch.float32, 43, 0.005), q.float())
    assert z.dtype == torch.bfloat16 and z.shape == (1, 2, 1, 40) and x.is_contiguous()
    check("scale_to_tokens", x, z, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_of_random_fp32_bit_patterns(dtype):
    """The kernels' fp32 -> bf16/fp16 rounding (integer RTNE for bf16) on random fp32 bit patterns of every exponent,
    a quarter of them exact ties and some subnormal, through scale_to_tokens with z = 1 (x * 1 == x)."""
    g = torch.Generator().manual_seed(23)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32)
    bits[0::4] = (bits[0::4] & ~0xFFFF) | 0x8000  # halfway between two bf16 values
    bits[1::8] &= 0x807FFFFF  # subnormal
    x = bits.view(torch.float32).view(1, 1, 1, -1)
    check("scale_to_tokens", x, torch.ones(1, 1, 1, 1), dtype)


# ---------------------------------------------------------------------------------------- ReLU + RoPE

TABLE_DTYPES = [torch.float32, torch.bfloat16, torch.float64, torch.float16]


def _rope_tables(tokens, d, dtype, shape="diffusers"):
    theta = torch.arange(tokens, dtype=torch.float64)[:, None] * (1e4 ** (-torch.arange(0, d, 2) / d))
    theta = theta.repeat_interleave(2, -1)
    cos, sin = theta.cos(), theta.sin()
    cos[0, :2] = float("nan")  # a NaN and a subnormal in the tables too
    sin[-1, -2:] = 1e-40
    if shape == "diffusers":
        cos, sin = cos[None, :, None], sin[None, :, None]  # [1, N, 1, D]
    return cos.to(dtype), sin.to(dtype)


@pytest.mark.parametrize("table_dtype", TABLE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_relu_rope_pair_every_table_dtype(dtype, table_dtype):
    for tokens, magnitude in ((1, 200.0), (17, 0.005), (17, 1.0)):
        q = edge((2, tokens, 2, 16), dtype, 14, magnitude)
        k = edge((2, tokens, 2, 16), dtype, 15, magnitude)
        check("relu_rope_pair", q, k, *_rope_tables(tokens, 16, table_dtype))


def test_relu_rope_pair_257_tokens_strided_views_and_table_shapes():
    packed = edge((1, 257, 3, 2, 8), torch.bfloat16, 16)  # q, k as views of a packed projection
    q, k = packed[:, :, 0], packed[:, :, 1]
    check("relu_rope_pair", q, k, *_rope_tables(257, 8, torch.float32))
    qt = edge((2, 2, 17, 8), torch.bfloat16, 17).transpose(1, 2)  # [B, N, H, D] with heads outermost
    kt = edge((2, 17, 2, 8), torch.bfloat16, 18)
    cos, sin = _rope_tables(17, 8, torch.bfloat16, shape="plain")
    check("relu_rope_pair", qt, kt, cos[:, None], sin[:, None])  # [N, 1, D] tables
    cos, sin = _rope_tables(17, 8, torch.float32)
    check("relu_rope_pair", qt, kt, cos.expand(2, 17, 1, 8), sin.expand(2, 17, 1, 8).contiguous())


# ---------------------------------------------------------------------------------------- refusals

def test_unsupported_names_the_reason(monkeypatch):
    b16 = torch.ones(2, 3, 4, dtype=torch.bfloat16)
    q = torch.ones(1, 3, 2, 8, dtype=torch.bfloat16)
    tables = _rope_tables(3, 8, torch.float32)
    assert "bfloat16 or float32" in tk.unsupported("relu_rope_pair", q.half(), q.half(), *tables)
    assert "odd head dim" in tk.unsupported("relu_rope_pair", q[..., :7], q[..., :7], tables[0][..., :7],
                                            tables[1][..., :7])
    assert "does not broadcast" in tk.unsupported("relu_rope_pair", q, q, tables[0][:, :2], tables[1])
    assert "requires grad" in tk.unsupported("modulate", b16, b16, b16.clone().requires_grad_())
    assert "one of bfloat16" in tk.unsupported("modulate", b16, b16.float(), b16)
    assert "bfloat16 only" in tk.unsupported("silu", b16.float())
    assert "float32 x" in tk.unsupported("scale_to_tokens", b16[None], b16[None], torch.bfloat16)
    assert "more than 4" in tk.unsupported("silu", b16[None, None])
    assert "no Triton kernel" in FusedOp("layer_norm", F.layer_norm, "a norm").unsupported("cuda", b16)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in tk.unsupported("silu", b16)


# ---------------------------------------------------------------------------------------- the check can fail

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from accelpatch.lossless.kernels import triton_jit as j  # noqa: E402


@triton.jit
def _wrong_modulate_parts(X, SCALE, SHIFT, size1, size2, size3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3,
                          BLOCK: tl.constexpr):
    i0, i1, i2, cols, mask = j._tile(size1, size2, size3, BLOCK)
    x = j._widen(tl.load(j._at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask))
    scale = j._widen(tl.load(j._at(SCALE, i0, i1, i2, cols, a0, a1, a2, a3), mask=mask))
    shift = j._widen(tl.load(j._at(SHIFT, i0, i1, i2, cols, b0, b1, b2, b3), mask=mask))
    return i0, i1, i2, cols, mask, x, scale, shift


@triton.jit
def _modulate_rounded_once(OUT, X, SCALE, SHIFT, size1, size2, size3,
                           o0, o1, o2, o3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, BLOCK: tl.constexpr):
    """Wrong: one fp32 evaluation rounded once (the intermediate bf16 roundings left out)."""
    i0, i1, i2, cols, mask, x, scale, shift = _wrong_modulate_parts(
        X, SCALE, SHIFT, size1, size2, size3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, BLOCK)
    out = x * (scale + 1.0) + shift
    tl.store(j._at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), j._narrow(out, OUT.dtype.element_ty), mask=mask)


@triton.jit
def _modulate_contracted(OUT, X, SCALE, SHIFT, size1, size2, size3,
                         o0, o1, o2, o3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, BLOCK: tl.constexpr):
    """Wrong: x * one + shift as one FMA, what Triton's default FP fusion would make of it."""
    i0, i1, i2, cols, mask, x, scale, shift = _wrong_modulate_parts(
        X, SCALE, SHIFT, size1, size2, size3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, BLOCK)
    out = tl.fma(x, j._round(scale + 1.0, OUT.dtype.element_ty), shift)
    tl.store(j._at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), j._narrow(out, OUT.dtype.element_ty), mask=mask)


@pytest.mark.parametrize("wrong,dtype", [(_modulate_rounded_once, torch.bfloat16),
                                         (_modulate_contracted, torch.float32)])
def test_a_wrong_kernel_is_caught(monkeypatch, wrong, dtype):
    if wrong is _modulate_contracted and not fma_is_fused():
        pytest.skip(FMA_REASON)
    x, rows = edge((2, 17, 32), dtype, 19), edge((2, 1, 2, 32), dtype, 20)
    args = (x, rows[:, :, 0], rows[:, :, 1])
    assert_same_outputs(tk.modulate(*args), reference.modulate(*args))
    monkeypatch.setattr(j, "_modulate_kernel", wrong)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_same_outputs(tk.modulate(*args), reference.modulate(*args))


def test_relu_table_is_eagers_own():
    """The bf16 ReLU gather keeps eager's -0.0 (kept as -0.0 by CPU's bf16 ReLU) and NaN, which a max() kernel
    might not."""
    q = torch.tensor([-0.0, float("nan"), -3.0, 2.0] * 4, dtype=torch.bfloat16).view(1, 1, 2, 8)
    cos, sin = _rope_tables(1, 8, torch.float32)
    got, want = tk.relu_rope_pair(q, q, cos, sin), reference.relu_rope_pair(q, q, cos, sin)
    assert_same_outputs(got, want)
    assert torch.signbit(got[0].flatten()[0]) == torch.signbit(F.relu(q).flatten()[0])


@triton.jit
def _rotate_contracted(x1, x2, c, s, MODE: tl.constexpr):
    """Wrong: x1*c - x2*s as one FMA (bf16 tables: evaluated in fp32 and rounded once)."""
    if MODE == 0:
        o1 = x1 * c - x2 * s
        o2 = x1 * s + x2 * c
    else:
        o1 = tl.fma(x1.to(c.dtype), c, -(x2.to(c.dtype) * s))
        o2 = tl.fma(x1.to(c.dtype), s, x2.to(c.dtype) * c)
    return o1, o2


@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_a_wrong_rope_is_caught(monkeypatch, dtype, table_dtype):
    """A contracted RoPE (or bf16 tables rounded once) must be caught by the RoPE test inputs. (A contraction under
    bf16 outputs flips ~2e-5 of them, and an fp64 one rounded to fp32 fewer: too few for interpreter-sized inputs;
    there the AOT test's FMA count is the guard.)"""
    q, k = edge((2, 17, 2, 16), dtype, 21), edge((2, 17, 2, 16), dtype, 22)
    args = (q, k, *_rope_tables(17, 16, table_dtype))
    monkeypatch.setattr(j, "_rotate", _rotate_contracted)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_same_outputs(tk.relu_rope_pair(*args), reference.relu_rope_pair(*args))


def test_fp64_tables_round_to_bf16_through_fp32():
    """1 + 2^-8 + 2^-40 is 1.0078125 rounded straight to bf16 but 1.0 through fp32 (a tie, to even), as eager."""
    q = torch.ones(1, 1, 1, 2, dtype=torch.bfloat16)
    cos = torch.tensor([1 + 2 ** -8 + 2 ** -40, 0.0], dtype=torch.float64).view(1, 1, 1, 2)
    sin = torch.zeros(1, 1, 1, 2, dtype=torch.float64)
    got = tk.relu_rope_pair(q, q, cos, sin)
    assert_same_outputs(got, reference.relu_rope_pair(q, q, cos, sin))
    assert got[2].flatten()[0].item() == 1.0


# ---------------------------------------------------------------------------------------- rotate-half RoPE (H3)

def _half_tables(tokens, rotary, dtype):
    """[N, R] cos/sin of the rotate-half convention (the two halves repeat), with a NaN, a subnormal and a value that
    rounds differently to bf16 straight from fp64 than through fp32."""
    theta = torch.arange(tokens, dtype=torch.float64)[:, None] * (1e4 ** (-torch.arange(0, rotary, 2) / rotary))
    theta = torch.cat((theta, theta), -1)
    cos, sin = theta.cos(), theta.sin()
    cos[0, 0] = float("nan")
    sin[-1, -1] = 1e-40
    cos[-1, 1] = 1 + 2 ** -8 + 2 ** -40
    return cos.to(dtype), sin.to(dtype)


def _packed_qk(batch, tokens, heads, d, dtype, seed, magnitude=1.0):
    """query and key as the models make them: chunks of one fused projection, unflattened to heads (strided)."""
    packed = edge((batch, tokens, 3 * heads * d), dtype, seed, magnitude)
    q, k, _ = packed.chunk(3, dim=-1)
    return q.unflatten(-1, (heads, d)), k.unflatten(-1, (heads, d))


@pytest.mark.parametrize("dtype,table_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64),
                                               (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                               (torch.float32, torch.float64), (torch.float16, torch.float32)])
def test_rotate_half_pair_partial_rotary_dims(dtype, table_dtype):
    """The leading R of D channels rotated (R = 12 of 16, as 96 of 128 at release; R = D), tables rounded to the
    activations' dtype first, each product and the sum rounded, the rest passed through bit for bit."""
    for tokens, magnitude, rotary in ((1, 200.0, 16), (17, 1.0, 12), (17, 0.005, 12)):
        q, k = _packed_qk(1, tokens, 2, 16, dtype, 30, magnitude)
        check("rotate_half_pair", q, k, *_half_tables(tokens, rotary, table_dtype))


def test_rotate_half_pair_layouts_and_broadcast_tables():
    q = edge((2, 3, 17, 8), torch.bfloat16, 31).transpose(1, 2)  # heads outermost
    k = edge((2, 17, 3, 8), torch.bfloat16, 32)
    cos, sin = _half_tables(17, 4, torch.float32)
    check("rotate_half_pair", q, k, cos, sin)
    wide_cos, wide_sin = _half_tables(17, 8, torch.float32)
    check("rotate_half_pair", q, k, wide_cos[:1, :2].expand(1, 2), wide_sin[:1, :2])  # [1, R] tables, R = 2
    check("rotate_half_pair", q, k, wide_cos.t().contiguous().t()[:, :6], wide_sin[:, :6])  # strided tables


@triton.jit
def _rotate_half_rounded_once(IN, OUT, base_in, base_out, s_in, s_out, d, partner, first, rot, mask, c, s,
                              SPLIT: tl.constexpr, FMA: tl.constexpr):
    """Wrong: the two products and their sum in fp32, rounded once."""
    DT: tl.constexpr = OUT.dtype.element_ty
    raw = tl.load(IN + base_in + d * s_in, mask=mask)
    y = j._widen(tl.load(IN + base_in + partner * s_in, mask=mask & rot))
    out = j._widen(raw) * c + tl.where(first, -y, y) * s
    tl.store(OUT + base_out + d * s_out, tl.where(rot, j._narrow(out, DT), raw), mask=mask)


def test_a_wrong_rotate_half_is_caught(monkeypatch):
    q, k = _packed_qk(1, 17, 2, 16, torch.bfloat16, 33)
    args = (q, k, *_half_tables(17, 12, torch.float32))
    assert_same_outputs(tk.rotate_half_pair(*args), reference.rotate_half_pair(*args))
    monkeypatch.setattr(j, "_rotate_half_one", _rotate_half_rounded_once)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_same_outputs(tk.rotate_half_pair(*args), reference.rotate_half_pair(*args))


# ---------------------------------------------------------------------------------------- complex128 RoPE (2.0)

def _freqs(tokens, pairs):
    """complex128 [N, D/2] table (unit phasors), with a NaN, an infinity, signed zeros and a subnormal."""
    angle = torch.arange(tokens, dtype=torch.float64)[:, None] * (1e4 ** (-torch.arange(pairs) / pairs))
    freqs = torch.polar(torch.ones_like(angle), angle)
    special = torch.tensor([complex(float("nan"), 0.0), complex(0.0, -0.0), complex(-0.0, float("inf")),
                            complex(1e-310, 1.0)], dtype=torch.complex128)
    freqs.view(-1)[-special.numel():] = special[-freqs.numel():]
    return freqs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.float16])
def test_rotary_complex_pair_chunked_projection(dtype):
    """q, k as strided chunks of a fused qkv projection, widened to fp64, times complex128, rounded fp64 -> fp32 ->
    dtype (double rounding for bf16/fp16) into eager's layout. 8 pairs per head: CPU eager's vectorised loop."""
    for tokens, magnitude in ((1, 200.0), (17, 1.0), (17, 0.005)):
        q, k = _packed_qk(2, tokens, 2, 16, dtype, 34, magnitude)
        check("rotary_complex_pair", q, k, _freqs(tokens, 8))


def test_rotary_complex_pair_layouts_and_refusals():
    q = edge((1, 2, 17, 16), torch.bfloat16, 35).transpose(1, 2)  # heads outermost: eager keeps that order
    k = edge((1, 17, 2, 16), torch.bfloat16, 36)
    check("rotary_complex_pair", q, k, _freqs(17, 8))
    check("rotary_complex_pair", k, k, _freqs(17, 8)[:1])  # one row for every token
    q64 = edge((1, 17, 2, 32), torch.float64, 37)[..., ::2]  # fp64 channels view_as_complex cannot pair
    assert "refuses" in tk.unsupported("rotary_complex_pair", q64, q64, _freqs(17, 8))
    assert "complex128" in tk.unsupported("rotary_complex_pair", k, k, _freqs(17, 8).to(torch.complex64))
    assert "[N, D/2]" in tk.unsupported("rotary_complex_pair", k, k, _freqs(17, 4))
    assert "one shape" in tk.unsupported("rotary_complex_pair", k, k[:, :, :1], _freqs(17, 8))
    assert "rotary dim" in tk.unsupported("rotate_half_pair", k, k, *_half_tables(17, 18, torch.float32))
    assert "[N, R]" in tk.unsupported("rotate_half_pair", k, k, *(t[None] for t in _half_tables(17, 8, torch.float32)))


def test_complex_multiply_forms_are_eagers_and_a_wrong_one_is_caught(monkeypatch):
    """Measured here: CPU eager's complex128 multiply rounds every product in its vectorised loop and contracts
    a*c - b*d, a*d + b*c into fmas in its scalar loop (3 pairs of a strided fp64 row take it). The kernel in the
    form probed for that loop matches it; every other form is caught on the same inputs."""
    from accelpatch.lossless.kernels import complex_mul  # noqa: PLC0415

    if not fma_is_fused():  # the forms differ only in where an fma rounds once
        pytest.skip(FMA_REASON)
    scalar = complex_mul.loop_modes(torch.device("cpu"))["scalar"]
    assert None not in scalar, scalar
    q = edge((2, 17, 2, 12), torch.float64, 38)[..., :6]  # 3 pairs, strided rows: the scalar loop
    k = edge((2, 17, 2, 12), torch.float64, 39)[..., 6:]
    g = torch.Generator().manual_seed(40)
    freqs = torch.polar(torch.ones(17, 3, dtype=torch.float64), torch.rand(17, 3, generator=g, dtype=torch.float64))
    args = (q, k, freqs)
    monkeypatch.setattr(complex_op, "complex_mul_modes", lambda device: (scalar, None))
    assert_same_outputs(tk.rotary_complex_pair(*args), reference.rotary_complex_pair(*args))
    for wrong in {(0, 0), (1, 1), (2, 2), (1, 0)} - {scalar}:
        monkeypatch.setattr(complex_op, "complex_mul_modes", lambda device, wrong=wrong: (wrong, None))
        with pytest.raises(AssertionError, match="elements differ"):
            assert_same_outputs(tk.rotary_complex_pair(*args), reference.rotary_complex_pair(*args))


def test_complex_multiply_probe_declines_a_device_whose_loops_disagree(monkeypatch):
    from accelpatch.lossless.kernels import complex_mul  # noqa: PLC0415

    cuda = torch.device("cuda")  # nothing runs on it: the loops' answers are stood in
    for loops, expected in (({"vectorised": (1, 1), "scalar": (1, 1)}, ((1, 1), None)),
                            ({"vectorised": (0, 0), "scalar": (1, 1)}, (None, "vectorised and scalar loops")),
                            ({"vectorised": (0, None), "scalar": (0, None)}, (None, "none of the forms"))):
        monkeypatch.setattr(complex_mul, "_MODES", {})
        monkeypatch.setattr(complex_mul, "loop_modes", lambda device, loops=loops: loops)
        modes, reason = complex_mul.complex_mul_modes(cuda)
        assert modes == expected[0]
        assert (reason is None) if expected[1] is None else (expected[1] in reason), reason
