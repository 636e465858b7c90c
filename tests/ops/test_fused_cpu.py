"""The fused ops' CPU kernels (accelpatch.lossless.ops, on accelpatch.lossless.kernels.cpu) against their eager
reference chains, bit for bit.

Expected values always come from the ops' reference chains run eagerly. Inputs are built to hit the edges:
bf16 rounding ties (small-integer operands, whose products and sums land exactly half-way), NaN, +-inf, +-0.0,
bf16 and fp32 subnormals, magnitudes 0.005 / 1 / 200, token counts 1 / 17 / 257, transposed, strided and
broadcast views, every supported dtype and table dtype. Also: the comparison catches deliberately wrong kernels,
unsupported inputs get a reason, and the builder reports a missing or failing compiler instead of raising.
"""
from __future__ import annotations

import importlib.resources
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelpatch.lossless.kernels import cpu, cpu_build
from _by_name import CPU, REFERENCE as ref
from accelpatch.lossless.kernels.layout import eager_layouts
from accelpatch.lossless.verify import FusedOp, ops

_, BUILD_REASON = cpu_build.load()
needs_kernels = pytest.mark.skipif(BUILD_REASON is not None, reason=f"CPU kernels unavailable: {BUILD_REASON}")

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- the comparison --------------------------------------------------------------------------------------------

def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str = "", size1_strides: bool = True) -> None:
    """Equal dtype, shape and strides; NaN at the same positions (payloads may differ, as in eager); every other
    element equal bit for bit (so -0.0 != +0.0). ``size1_strides=False`` leaves out the strides of size-1 dims
    (they address no memory), where eager's meta kernels are known to differ from its CPU kernels."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    strides_a, strides_e = actual.stride(), expected.stride()
    if not size1_strides:
        strides_a, strides_e = _memory_strides(actual), _memory_strides(expected)
    assert strides_a == strides_e, f"{what}: strides {actual.stride()} != {expected.stride()}"
    nan_a, nan_e = actual.isnan(), expected.isnan()
    assert torch.equal(nan_a, nan_e), f"{what}: NaN at {int((nan_a != nan_e).sum())} other positions"
    view = _INT_VIEW[actual.element_size()]
    bits_a, bits_e = actual.view(view), expected.view(view)
    differ = (bits_a != bits_e) & ~nan_a
    count = int(differ.sum())
    if count:
        where = differ.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ, first at {where}: "
                             f"{actual[tuple(where)].item()!r} != {expected[tuple(where)].item()!r}")


def assert_all_same(actual, expected, what: str = "", size1_strides: bool = True) -> None:
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"{what} output {i}", size1_strides)


def check(op: str, *args, size1_strides: bool = True) -> None:
    """Run the fused op and its reference on the same inputs and compare every output; where the op makes its
    reference's outputs one at a time for a first sight's hash (``FusedOp.parts``), those too."""
    assert CPU.unsupported(op, *args) is None, CPU.unsupported(op, *args)
    with torch.no_grad():
        expected = getattr(ref, op)(*args)
        assert_all_same(getattr(CPU, op)(*args), expected, op, size1_strides)
        parts = ops()[op].parts
        if parts is not None:
            assert_all_same(tuple(parts(*args)), expected, f"{op}'s parts", size1_strides)


# ---- inputs ----------------------------------------------------------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def specials(dtype: torch.dtype) -> torch.Tensor:
    """NaN, +-inf, +-0.0, subnormals of fp32 and bf16, the extremes of the dtype, and 0.005 / 1 / 200."""
    info = torch.finfo(dtype)
    values = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 0.005, -0.005,
              200.0, -200.0, info.max, -info.max, info.tiny, -info.tiny, info.smallest_normal / 4,
              -info.smallest_normal / 8, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -133, -(2.0 ** -133), 2.0 ** -130,
              0.5, 1.5, 3.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 255.0, 65504.0, 1e-6, -7e-3]
    return torch.tensor(values, dtype=F64).to(dtype)


def tie_heavy(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers times powers of two: their products and sums need up to ~16 significant bits, so rounding
    them to bf16/fp16 lands exactly half-way often (the cases where a wrong rounding point shows)."""
    g = _gen(seed)
    ints = torch.randint(-255, 256, shape, generator=g).to(F64)
    scale = torch.pow(2.0, torch.randint(-9, 2, shape, generator=g).to(F64))
    return (ints * scale).to(dtype)


def mixed(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values at magnitudes 0.005, 1 and 200, ties, and the specials sprinkled in."""
    g = _gen(seed)
    base = torch.randn(shape, generator=g, dtype=F64)
    mags = torch.tensor([0.005, 1.0, 200.0], dtype=F64)[torch.randint(0, 3, shape, generator=g)]
    out = (base * mags).to(dtype)
    ties = tie_heavy(shape, dtype, seed + 1)
    pick = torch.rand(shape, generator=g) < 0.3
    out = torch.where(pick, ties, out)
    sp = specials(dtype)
    flat = out.reshape(-1)
    n = flat.numel()
    where = torch.randperm(n, generator=g)[: max(1, n // 10)]
    flat[where] = sp[torch.randint(0, sp.numel(), (where.numel(),), generator=g)]
    return flat.reshape(shape)


def test_tie_inputs_hit_ties():
    """The tie generator does what it claims: many bf16 products of its values are exactly half-way."""
    a, b = tie_heavy((4096,), BF16, 0).float(), tie_heavy((4096,), BF16, 1).float()
    bits = (a * b).view(torch.int32)
    assert int(((bits & 0xFFFF) == 0x8000).sum()) > 100


# ---- the comparison catches wrong kernels ----------------------------------------------------------------------

@needs_kernels
def test_comparison_catches_a_wrong_kernel():
    """A modulate rounded once at the end (a plausible wrong fusion) differs on tie-heavy inputs and is caught; so
    are one flipped bit, a sign flip of a zero, a NaN moved, and the right values in the wrong strides."""
    x, scale, shift = (tie_heavy((2, 17, 40), BF16, s) for s in (1, 2, 3))
    expected = ref.modulate(x, scale, shift)
    once = (x.float() * (1 + scale.float()) + shift.float()).to(BF16)
    with pytest.raises(AssertionError, match="differ"):
        assert_same(once, expected)
    good = CPU.modulate(x, scale, shift)
    assert_same(good, expected)
    flipped = good.clone()
    flipped.view(torch.int16).view(-1)[5] ^= 1
    with pytest.raises(AssertionError, match="differ"):
        assert_same(flipped, expected)
    zeros = torch.zeros(8, dtype=BF16)
    with pytest.raises(AssertionError, match="differ"):
        assert_same(-zeros, zeros)
    nan = torch.tensor([float("nan"), 1.0])
    with pytest.raises(AssertionError, match="NaN"):
        assert_same(nan.flip(0), nan)
    wrong_layout = expected.transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(AssertionError, match="strides"):
        assert_same(wrong_layout, expected)


@needs_kernels
def test_comparison_catches_a_contracted_rope():
    """The fp32-table RoPE computed with one rounding per output (what an FMA would do) is caught."""
    q = mixed((1, 257, 2, 16), F32, 7)
    cos, sin = mixed((1, 257, 1, 16), F32, 8), mixed((1, 257, 1, 16), F32, 9)
    expected = ref.relu_rope_pair(q, q, cos, sin)[2]
    r = F.relu(q).double()
    fused = torch.empty_like(expected)
    fused[..., 0::2] = (r[..., 0::2] * cos[..., 0::2].double() - r[..., 1::2] * sin[..., 1::2].double()).float()
    fused[..., 1::2] = (r[..., 0::2] * sin[..., 1::2].double() + r[..., 1::2] * cos[..., 0::2].double()).float()
    with pytest.raises(AssertionError, match="differ"):
        assert_same(fused, expected)
    assert_same(CPU.relu_rope_pair(q, q, cos, sin)[2], expected)


# ---- rounding --------------------------------------------------------------------------------------------------

@needs_kernels
def test_bf16_rounding_equals_c10_on_all_floats():
    """The kernels' vectorisable float->bf16 rounding gives c10's bits for all 2^32 float bit patterns
    (ties, NaN, inf, subnormals included)."""
    library, _ = cpu_build.load()
    assert library.check_bf16_rounding(0, 2 ** 32) == 0


def test_fp32_relu_keeps_negative_zero_and_nan():
    """What the fp32 kernel's ReLU reproduces: F.relu keeps -0.0 and NaN (its clamp_min), in both eager loops."""
    x = torch.tensor([-0.0, 0.0, float("nan"), -1.0, -(2.0 ** -149)] * 20)
    for view in (x, torch.stack([x, x], 1)[:, 0]):
        out = F.relu(view)
        assert out[0].view(torch.int32) == torch.tensor(-0.0).view(torch.int32)
        assert out[2].isnan() and out[3] == 0 and out[4].view(torch.int32) == 0


# ---- relu_rope_pair --------------------------------------------------------------------------------------------

ROPE_DTYPES = [(q, t) for q in (BF16, F32) for t in (BF16, F32, F64)]


def _tables(b, n, d, dtype, seed, ties=False):
    make = tie_heavy if ties else mixed
    return make((b, n, 1, d), dtype, seed), make((b, n, 1, d), dtype, seed + 1)


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_relu_rope_pair(qdtype, tdtype, tokens):
    q, k = mixed((1, tokens, 2, 16), qdtype, 1), mixed((1, tokens, 2, 16), qdtype, 2)
    check("relu_rope_pair", q, k, *_tables(1, tokens, 16, tdtype, 3))
    check("relu_rope_pair", *(tie_heavy((2, tokens, 3, 8), qdtype, s) for s in (4, 5)),
          *_tables(2, tokens, 8, tdtype, 6, ties=True))


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
def test_relu_rope_pair_layouts(qdtype, tdtype):
    """Query/key as views of a packed [B, N, 3, H, D] projection and of a [B, H, N, D] tensor (transposed), a
    strided head dim, and tables broadcast from [N, 1, D] and [1, N, 1, D] or per batch."""
    qkv = mixed((2, 17, 3, 2, 24), qdtype, 10)
    cos, sin = _tables(1, 17, 24, tdtype, 11)
    check("relu_rope_pair", qkv[:, :, 0], qkv[:, :, 1], cos, sin)
    heads_first = mixed((2, 2, 17, 24), qdtype, 12).transpose(1, 2)
    check("relu_rope_pair", heads_first, qkv[:, :, 2], cos, sin)
    check("relu_rope_pair", heads_first, heads_first.contiguous(), cos[0], sin[0])
    wide = mixed((2, 17, 2, 48), qdtype, 13)[..., ::2]
    check("relu_rope_pair", wide, qkv[:, :, 0], *_tables(2, 17, 24, tdtype, 14))
    cos_wide = mixed((1, 17, 1, 48), tdtype, 15)[..., 1::2]
    check("relu_rope_pair", qkv[:, :, 0], qkv[:, :, 1], cos_wide, sin)


@needs_kernels
def test_relu_rope_pair_medium_shape():
    """SANA-Video medium: [1, 320, 4, 112] with [1, 320, 1, 112] float32 tables."""
    q, k = mixed((1, 320, 4, 112), BF16, 20), mixed((1, 320, 4, 112), BF16, 21)
    check("relu_rope_pair", q, k, *_tables(1, 320, 112, F32, 22))


@needs_kernels
def test_relu_rope_pair_double_rounding_through_float():
    """fp64 tables: eager rounds double -> float -> bf16. 1 * (1 + 2^-8 + 2^-40) becomes 1 + 2^-8 in float, a tie
    that goes to 1.0 in bf16 (a direct double -> bf16 rounding would give 1.0078125)."""
    q = torch.ones(1, 1, 1, 2, dtype=BF16)
    cos = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -40, 0.0], dtype=F64).view(1, 1, 1, 2)
    sin = torch.zeros(1, 1, 1, 2, dtype=F64)
    rotated = CPU.relu_rope_pair(q, q, cos, sin)[2]
    assert rotated[0, 0, 0, 0].item() == 1.0
    check("relu_rope_pair", q, q, cos, sin)


@needs_kernels
@pytest.mark.parametrize("relu_by", ["formula", "table"])
def test_relu_rope_pair_every_bf16_value(relu_by, monkeypatch):
    """Every bf16 bit pattern as query, against bf16 and fp32 tables, with the ReLU by the checked formula (what
    runs here) and by eager's table (what runs where the formula does not match)."""
    from accelpatch.lossless.kernels.tables import all_bf16_values
    assert cpu.relu_formula_matches()
    monkeypatch.setattr(cpu, "_RELU_FORMULA", [relu_by == "formula"])
    q = all_bf16_values(torch.device("cpu")).view(1, 512, 4, 32)
    k = q.flip(1)
    for tdtype in (BF16, F32):
        check("relu_rope_pair", q, k, *_tables(1, 512, 32, tdtype, 30, ties=True))
    strided = all_bf16_values(torch.device("cpu")).view(1, 256, 4, 64)[..., ::2]  # the strided loop
    check("relu_rope_pair", strided, strided, *_tables(1, 256, 32, F32, 31))


@needs_kernels
def test_a_wrong_relu_formula_is_not_used(monkeypatch):
    """The formula check can fail: a ReLU formula that maps -0.0 to +0.0 is refused."""
    library, _ = cpu_build.load()

    class Wrong:
        def __getattr__(self, name):
            return getattr(library, name)

        @staticmethod
        def relu_bf16_formula(out):
            library.relu_bf16_formula(out)
            out[0x8000] = 0

    monkeypatch.setattr(cpu, "_RELU_FORMULA", [])
    monkeypatch.setattr(cpu_build, "_RESULT", (Wrong(), None))
    assert not cpu.relu_formula_matches()


# ---- modulate, gated_residual ----------------------------------------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_modulate(dtype, tokens):
    x = mixed((2, tokens, 40), dtype, 1)
    per_batch = mixed((2, 1, 6 * 40), dtype, 2)  # AdaLN rows: [B, 1, 6C] chunks
    check("modulate", x, per_batch[..., :40], per_batch[..., 40:80])
    per_token = mixed((2, tokens, 6 * 40), dtype, 3)  # [B, N, 6C] chunks: token stride 6C
    check("modulate", x, per_token[..., 80:120], per_token[..., 120:160])
    check("modulate", *(tie_heavy((2, tokens, 40), dtype, s) for s in (4, 5, 6)))
    transposed = mixed((tokens, 2, 40), dtype, 7).transpose(0, 1)
    check("modulate", transposed, per_batch[..., :40], per_token[..., :40])
    check("modulate", x, mixed((), dtype, 8), mixed((40,), dtype, 9))


@needs_kernels
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_gated_residual(dtype, tokens):
    residual = mixed((2, tokens, 40), dtype, 1)
    gates = mixed((2, 1, 6 * 40), dtype, 2)
    x = mixed((2, tokens, 40), dtype, 3)
    check("gated_residual", residual, gates[..., 200:240], x)
    check("gated_residual", *(tie_heavy((2, tokens, 40), dtype, s) for s in (4, 5, 6)))
    transposed = mixed((2, 40, tokens), dtype, 7).transpose(1, 2)  # the residual as an N-minor view
    check("gated_residual", transposed, gates[..., :40], x)
    check("gated_residual", residual, gates[..., :40], transposed)
    images = mixed((2, 40, 3, 5), dtype, 8).contiguous(memory_format=torch.channels_last)
    check("gated_residual", images, mixed((2, 40, 1, 1), dtype, 9), mixed((2, 40, 3, 5), dtype, 10))


@needs_kernels
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_elementwise_random_broadcasts_and_strides(data):
    """Random shapes (up to 5 dims), broadcast masks, permutations and slices for modulate and gated_residual."""
    op = data.draw(st.sampled_from(["modulate", "gated_residual"]))
    dtype = data.draw(st.sampled_from([BF16, F16, F32]))
    ndim = data.draw(st.integers(1, 5))
    shape = data.draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim))
    seed = data.draw(st.integers(0, 1000))
    args = []
    for i in range(3):
        mask = data.draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
        own = [s if keep else 1 for s, keep in zip(shape, mask)]
        step = data.draw(st.integers(1, 2))
        t = mixed([s * step for s in own], dtype, seed + i)
        t = t[(slice(None),) * (ndim - 1) + (slice(None, None, step),)] if step > 1 else t
        t = t[tuple(slice(0, s) for s in own)]
        perm = data.draw(st.permutations(range(ndim)))
        t = t.permute(*perm).contiguous().permute(*sorted(range(ndim), key=lambda d: perm[d]))
        args.append(t)
    reason = CPU.unsupported(op, *args)
    if reason is not None:
        assert "4 strided dims" in reason
        return
    # The outputs' layouts come from a meta run (layout.eager_layouts), and for some inputs with size-1 dims the meta
    # kernels give other strides than the CPU kernels (the two tests below). That is the layout helper's matter, not
    # the kernel's: where the meta layout differs from eager's, the values are compared in eager's own layout.
    with torch.no_grad():
        fused, expected = getattr(CPU, op)(*args), getattr(ref, op)(*args)
    if _memory_strides(fused) != _memory_strides(expected):
        assert fused.stride() == eager_layouts(getattr(ref, op), tuple(args))[0][1]
        fused = torch.empty_strided(expected.shape, expected.stride(), dtype=expected.dtype).copy_(fused)
    assert_same(fused, expected, op, size1_strides=False)


def _memory_strides(t):
    return [s for s, n in zip(t.stride(), t.shape) if n != 1]


def test_meta_layout_of_size1_dims():
    """Records a known difference: eager CPU and the meta run disagree on a size-1 dim's stride. If this starts
    failing, the meta run has become exact there and the random test can compare every stride."""
    x = torch.zeros(2, dtype=BF16).as_strided((1, 1, 2, 1), (2, 2, 1, 2))
    one, other = torch.zeros(1, 1, 1, 1, dtype=BF16), torch.zeros(1, 1, 2, 1, dtype=BF16)
    assert ref.modulate(x, one, other).stride() == (2, 2, 1, 1)
    assert eager_layouts(ref.modulate, (x, one, other))[0][1] == (2, 2, 1, 2)


def test_meta_layout_differs_through_size1_strides():
    """Records a known difference that reaches dims of size > 1: eager CPU's bf16 ``gate * x`` of two contiguous
    [1, 2, 1, 1] tensors is contiguous (2, 1, 1, 1), the meta run keeps the gate's size-1 strides (2, 1, 2, 2), and
    the following ``residual + product`` orders its [1, 2, 2, 1] output by them: (4, 2, 1, 1) eager, (4, 1, 2, 4)
    meta. So the fused ops' outputs (allocated from the meta layout) can have other strides than eager's in such
    broadcasts; the first-sight check sees it as a mismatch."""
    residual = torch.zeros(1, 1, 2, 1, dtype=BF16)
    gate = torch.zeros(4, dtype=BF16).as_strided((1, 2, 1, 1), (2, 1, 2, 2))
    x = torch.zeros(1, 2, 1, 1, dtype=BF16)
    assert ref.gated_residual(residual, gate, x).stride() == (4, 2, 1, 1)
    assert eager_layouts(ref.gated_residual, (residual, gate, x))[0][1] == (4, 1, 2, 4)


# ---- silu, glu_gate --------------------------------------------------------------------------------------------

@needs_kernels
def test_silu_every_bf16_value_and_layouts():
    from accelpatch.lossless.kernels.tables import all_bf16_values
    values = all_bf16_values(torch.device("cpu"))
    check("silu", values)
    check("silu", values[::3])
    images = values[: 5 * 64 * 8 * 8].view(5, 64, 8, 8).contiguous(memory_format=torch.channels_last)
    check("silu", images)
    check("silu", images.chunk(2, dim=1)[1])


@needs_kernels
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_glu_gate(tokens):
    """GLUMB's x * silu(gate) on the channel halves of a channels_last [B, 2C, H, W], and flat."""
    conv = mixed((1, 2 * 24, tokens, 1), BF16, 1).contiguous(memory_format=torch.channels_last)
    x, gate = conv.chunk(2, dim=1)
    check("glu_gate", x, gate)
    check("glu_gate", *(tie_heavy((tokens, 24), BF16, s) for s in (2, 3)))
    check("glu_gate", mixed((tokens, 24), BF16, 4), mixed((1, 24), BF16, 5))


@needs_kernels
def test_glu_gate_every_gate_value():
    from accelpatch.lossless.kernels.tables import all_bf16_values
    gate = all_bf16_values(torch.device("cpu"))
    check("glu_gate", mixed((65536,), BF16, 6), gate)
    check("glu_gate", tie_heavy((65536,), BF16, 7), gate.flip(0))


# ---- sigmoid_gate ----------------------------------------------------------------------------------------------

@needs_kernels
def test_sigmoid_gate_every_gate_value():
    from accelpatch.lossless.kernels.tables import all_bf16_values
    gate = all_bf16_values(torch.device("cpu"))
    check("sigmoid_gate", mixed((65536,), BF16, 6), gate)
    check("sigmoid_gate", tie_heavy((65536,), BF16, 7), gate.flip(0))
    check("sigmoid_gate", mixed((256, 512), BF16, 8)[:, ::2], gate.view(256, 256).t())  # strided x, transposed gate


@needs_kernels
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_sigmoid_gate_key_and_output_gates(tokens):
    """SANA-Video 2.0's gates: the key gate sigmoid(beta) [B, N, H, 1] broadcast over the head dim of a strided
    (qkv-chunk) key, and the output gate [B, N, C] on a contiguous and on an N-minor (transposed) attention output."""
    key = mixed((2, tokens, 3 * 4 * 16), BF16, 1).chunk(3, dim=-1)[1].unflatten(-1, (4, 16))
    check("sigmoid_gate", key, mixed((2, tokens, 4, 1), BF16, 2))
    check("sigmoid_gate", tie_heavy((2, tokens, 4, 16), BF16, 3), tie_heavy((2, tokens, 4), BF16, 4)[..., None])
    gate = mixed((2, tokens, 64), BF16, 5)
    check("sigmoid_gate", mixed((2, tokens, 64), BF16, 6), gate)
    check("sigmoid_gate", mixed((2, 64, tokens), BF16, 7).transpose(1, 2), gate)


@needs_kernels
def test_sigmoid_gate_catches_a_wrong_table_or_rounding(monkeypatch):
    """The comparison sees the op run with the SiLU table in place of the sigmoid one (glu_gate's), and a sigmoid
    left unrounded before the product (one rounding at the end)."""
    from accelpatch.lossless.kernels.tables import all_bf16_values
    gate = all_bf16_values(torch.device("cpu"))
    x = mixed((65536,), BF16, 9)
    expected = ref.sigmoid_gate(x, gate)
    with pytest.raises(AssertionError, match="differ"):
        assert_same((x.float() * torch.sigmoid(gate.float())).to(BF16), expected)
    monkeypatch.setattr(cpu, "_PREPARED", {})  # a fresh cache, dropped with the wrong table afterwards
    monkeypatch.setitem(cpu._WIDE, "sigmoid", cpu.wide_table("silu"))
    with torch.no_grad(), pytest.raises(AssertionError, match="differ|NaN"):
        assert_same(CPU.sigmoid_gate(x, gate), expected)


# ---- scale_to_tokens -------------------------------------------------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("zdtype", [BF16, F16, F32])
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_scale_to_tokens(dtype, zdtype, tokens):
    """z in float32 and, as SANA-Video computes it from bf16 q and k, in bf16 (and fp16): x * z promotes to
    float32 with z widened exactly, then one rounding to dtype."""
    x = mixed((2, 3, 8, tokens), F32, 1)
    z = mixed((2, 3, 1, tokens), zdtype, 2)
    check("scale_to_tokens", x, z, dtype)
    check("scale_to_tokens", tie_heavy((2, 3, 8, tokens), F32, 3), tie_heavy((2, 3, 1, tokens), zdtype, 4), dtype)
    tokens_minor = mixed((2, 3, tokens, 8), F32, 5).transpose(2, 3)  # a [B, H, N, D] tensor seen as [B, H, D, N]
    check("scale_to_tokens", tokens_minor, z, dtype)
    check("scale_to_tokens", x, mixed((2, 1, 1, tokens), zdtype, 6), dtype)
    check("scale_to_tokens", x, mixed((2, 3, 1, 2 * tokens), zdtype, 7)[..., ::2], dtype)  # a strided z
    out = CPU.scale_to_tokens(x, z, dtype)
    assert out.shape == (2, tokens, 24) and (tokens == 1 or out.stride()[1] == 1)  # N-minor, as eager


@needs_kernels
def test_scale_to_tokens_to_float32_is_not_fused():
    x, z = mixed((1, 2, 4, 5), F32, 1), mixed((1, 2, 1, 5), F32, 2)
    assert "nothing to fuse" in CPU.unsupported("scale_to_tokens", x, z, F32)
    assert "bf16, fp16 or float32 z" in CPU.unsupported("scale_to_tokens", x, z.double(), BF16)
    with pytest.raises(ValueError, match="nothing to fuse"):
        CPU.scale_to_tokens(x, z, F32)


# ---- flush-to-zero ----------------------------------------------------------------------------------------------

@needs_kernels
def test_flush_denormal_mode_is_followed():
    """With torch.set_flush_denormal(True) (FTZ/DAZ in the thread's MXCSR) eager flushes subnormals, and so do the
    kernels, which run on the calling thread: modulate, gated_residual and the fp32 RoPE stay bit-identical on
    subnormal-heavy inputs. (The bf16 ReLU table is another matter: eager's two loops disagree under DAZ.)"""
    if not torch.set_flush_denormal(True):
        pytest.skip("no flush-denormal mode on this CPU")
    try:
        for dtype in (BF16, F16, F32):
            tiny = 1e-38 if dtype != F16 else 1e-5
            x, shift = mixed((2, 17, 40), dtype, 1), mixed((2, 17, 40), dtype, 3)
            scale = mixed((2, 1, 40), dtype, 2) * tiny
            check("modulate", x, scale, shift)
            check("gated_residual", shift * tiny, scale, x)
        for tdtype in (BF16, F32, F64):
            q = mixed((1, 17, 2, 16), F32, 4) * 1e-37
            check("relu_rope_pair", q, q, *_tables(1, 17, 16, tdtype, 5))
    finally:
        torch.set_flush_denormal(False)


# ---- what is declined, with a reason ---------------------------------------------------------------------------

@needs_kernels
def test_unsupported_reasons():
    q = torch.zeros(1, 4, 2, 8, dtype=BF16)
    t = torch.zeros(1, 4, 1, 8)
    assert CPU.unsupported("relu_rope_pair", q, q, t, t) is None
    assert "dtype" in CPU.unsupported("relu_rope_pair", q.half(), q.half(), t, t)
    assert "one dtype" in CPU.unsupported("relu_rope_pair", q, q.float(), t, t)
    assert "even head dim" in CPU.unsupported("relu_rope_pair", q[..., :7], q[..., :7], t[..., :7], t[..., :7])
    assert "broadcast" in CPU.unsupported("relu_rope_pair", q, q, torch.zeros(1, 3, 1, 8), t)
    assert "CPU tensors" in CPU.unsupported("modulate", *(torch.zeros(4, device="meta"),) * 3)
    assert "one dtype" in CPU.unsupported("modulate", torch.zeros(4, dtype=BF16), torch.zeros(4), torch.zeros(4))
    assert "one dtype" in CPU.unsupported("silu", torch.zeros(4))
    assert "no CPU kernel" in FusedOp("layer_norm", F.layer_norm, "a norm").unsupported("cpu", q)
    flat = torch.ones(4)
    assert "negated" in CPU.unsupported("modulate", flat._neg_view(), flat, flat)
    grad = torch.zeros(4, requires_grad=True)
    assert "autograd" in CPU.unsupported("modulate", grad, grad, grad)
    with torch.no_grad():
        assert CPU.unsupported("modulate", grad, grad, grad) is None
    with pytest.raises(ValueError, match="autograd"):
        CPU.modulate(grad, grad, grad)


@needs_kernels
def test_a_library_failing_the_known_answer_check_is_refused(monkeypatch):
    """A library whose float32 modulate is wrong (here: the gated residual in its place) fails the self-check, and
    every op then answers that reason."""
    library, _ = cpu_build.load()

    class Wrong:
        def __getattr__(self, name):
            return getattr(library, name)

        modulate = library.gated_residual

    monkeypatch.setattr(cpu, "_SELF_CHECK", [])
    monkeypatch.setattr(cpu_build, "_RESULT", (Wrong(), None))
    reason = CPU.unsupported("silu", torch.zeros(4, dtype=BF16))
    assert reason is not None and "known-answer" in reason


def test_unsupported_gives_the_build_reason(monkeypatch):
    monkeypatch.setattr(cpu_build, "_RESULT", (None, "no C++ compiler found (install g++ or set CXX)"))
    x = torch.zeros(4, dtype=BF16)
    assert "no C++ compiler" in CPU.unsupported("silu", x)


@needs_kernels
def test_empty_inputs():
    x = torch.zeros(0, 8, dtype=BF16)
    check("modulate", x, x, x)
    check("silu", x)
    q = torch.zeros(1, 0, 2, 8)
    check("relu_rope_pair", q, q, torch.zeros(1, 0, 1, 8), torch.zeros(1, 0, 1, 8))


# ---- building --------------------------------------------------------------------------------------------------

def test_missing_compiler_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    library, reason = cpu_build.build(announce=False)
    assert library is None and "no C++ compiler" in reason and "no-such-c++" in reason


def _broken_compiler(tmp_path, monkeypatch, *errors: str) -> None:
    """CXX: a compiler that tells its version and fails every build, printing ``errors``; an empty cache."""
    fake = tmp_path / "broken-c++"
    fake.write_text("#!/bin/sh\ncase \"$1\" in --version|-v|-dumpversion) echo 'broken-c++ version 0'; exit 0;; esac\n"
                    + "".join(f"echo '{line}' >&2\n" for line in errors) + "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_failing_compiler_is_a_reason(tmp_path, monkeypatch):
    _broken_compiler(tmp_path, monkeypatch, "cpu_kernels.cpp:1: error: simulated failure")
    library, reason = cpu_build.build(namespace="accelpatch_cpu_broken", announce=False)
    assert library is None and "failed" in reason and "simulated failure" in reason


def test_a_failing_build_is_announced_once_and_its_reason_is_one_line(tmp_path, monkeypatch, capsys):
    """#40: with CXX=false the build was announced twice (the -march=native retry announced itself again) and the
    warning's reason held a line break and a double period."""
    _broken_compiler(tmp_path, monkeypatch, "cpu_kernels.cpp:1: error: simulated failure.", "second line.")
    library, reason = cpu_build.build(namespace="accelpatch_cpu_broken_twice", announce=True)
    err = capsys.readouterr().err
    assert library is None and err.count("building the fused CPU kernels for this CPU") == 1, err
    assert "trying once more without -march=native" in err
    assert "\n" not in reason and not reason.endswith(".") and "simulated failure" in reason, reason
    with pytest.warns(RuntimeWarning) as record:
        cpu_build._warn_unavailable(reason + "(test)")
    message = str(record[0].message)
    assert ".." not in message and "\n" not in message, message


def test_every_statement_of_the_build_time_is_the_one_constant(capsys):
    """#40: three estimates (25 s, "about a minute", 20 s) of one build (measured 20-35 s)."""
    from accelpatch.__main__ import main
    from accelpatch.tools import doctor

    about = f"about {cpu_build.TYPICAL_BUILD_S} s on 2 cores"
    with pytest.raises(SystemExit):
        main(["build-kernels", "--help"])
    assert about in " ".join(capsys.readouterr().out.split())
    source = (Path(doctor.__file__).read_text() + Path(cpu_build.__file__).read_text())
    assert "about a minute" not in source and "TYPICAL_BUILD_S} s on 2 cores" in source


def test_no_compiler_on_path_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_build.shutil, "which", lambda name: None)
    command, reason = cpu_build.find_compiler({})
    assert command is None and "install g++" in reason and "CXX" in reason


def test_a_read_only_cache_is_a_reason(tmp_path, monkeypatch):
    """A cache folder that cannot be created is named, with what to do."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    library, reason = cpu_build.build(namespace="accelpatch_cpu_readonly", announce=False)
    assert library is None and "not writable" in reason and "XDG_CACHE_HOME" in reason


def test_load_builds_once_per_process(monkeypatch):
    """Two threads asking at once: one build, one library object for both."""
    calls = []
    gate = threading.Barrier(2)
    sentinel = object()

    def slow_build():
        calls.append(1)
        return sentinel, None

    monkeypatch.setattr(cpu_build, "_RESULT", None)
    monkeypatch.setattr(cpu_build, "build", slow_build)
    monkeypatch.delenv(cpu_build.SWITCH, raising=False)
    got = []

    def worker():
        gate.wait()
        got.append(cpu_build.load()[0])

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and got == [sentinel, sentinel]


@pytest.mark.parametrize("value,off", [("0", True), ("off", True), ("False", True), ("1", False), ("", False),
                                       ("yes", False), ("maybe", True)])
def test_the_environment_switch(value, off, monkeypatch):
    """ACCELPATCH_CPU_KERNELS=0 (off/false/no) switches the kernels off before anything is built; an unknown value
    keeps them off and says which values are valid."""
    monkeypatch.setenv(cpu_build.SWITCH, value)
    reason = cpu_build.switched_off()
    assert (reason is not None) == off
    if value == "maybe":
        assert "'maybe' is none of 0/off/false/no" in reason
    if off:
        monkeypatch.setattr(cpu_build, "_RESULT", None)
        monkeypatch.setattr(cpu_build, "build", lambda: pytest.fail("built although switched off"))
        assert cpu_build.load() == (None, reason)


def test_a_failed_build_warns_once_per_process(monkeypatch):
    """Every op that cannot run for want of the library counts that reason; the user hears it once, with the cause
    and the fix, not once per op."""
    monkeypatch.setattr(cpu_build, "_RESULT", None)
    monkeypatch.setattr(cpu_build, "_WARNED", set())
    monkeypatch.delenv(cpu_build.SWITCH, raising=False)
    monkeypatch.setattr(cpu_build, "build", lambda: (None, "no C++ compiler (c++) on PATH: install g++"))
    with pytest.warns(RuntimeWarning, match="unavailable: no C.. compiler.*install g..") as record:
        assert cpu_build.load()[1].startswith("no C++ compiler")
        monkeypatch.setattr(cpu_build, "_RESULT", None)
        cpu_build.load()
    assert len([w for w in record if "CPU kernels" in str(w.message)]) == 1
    assert cpu.unavailable() == "unavailable: no C++ compiler (c++) on PATH: install g++"


_FIRST_CALL = """
import torch
import accelpatch
from accelpatch import testing as t
from accelpatch.lossless.kernels import cpu_build
cpu_build.FLAGS = ("-O0", "-ffp-contract=off")  # a quick build: the numerics flags are what matter here
torch.set_num_threads(1)
model = t.tiny_sana_video_transformer()
inputs = t.sana_video_transformer_inputs(model, batch_size=1, seed=1)
with torch.no_grad():
    expected = model(**inputs).sample
    accelpatch.apply(model)
    assert torch.equal(model(**inputs).sample, expected)
print(sum(f.fused_calls for f in accelpatch.report(model).models[0].fusions))
print(next(line.strip() for line in str(accelpatch.report(model)).splitlines() if "CPU kernels:" in line))
"""


@needs_kernels
def test_the_first_patched_call_announces_its_build_and_racing_processes_share_it(tmp_path):
    """Two processes' first patched calls on an empty kernel cache (two pytest workers, two users of one home):
    the build is announced on stderr with how to do it ahead or skip it, both end with the same library and fused
    ops that ran; a third process loads it without building or saying anything."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    env.pop(cpu_build.SWITCH, None)
    racers = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", _FIRST_CALL], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in racers]
    assert [p.returncode for p in racers] == [0, 0], outs
    assert all(int(out.split()[0]) > 0 for out, _ in outs), outs  # fused ops ran in both
    # the report tells the build (or, for the process that waited on the other's lock, the load) apart from checks
    assert any("CPU kernels: built in this process in" in out for out, _ in outs), outs
    announced = [err for _, err in outs if "accelpatch: building the fused CPU kernels" in err]
    assert announced, outs
    assert "build-kernels" in announced[0] and "ACCELPATCH_CPU_KERNELS=0" in announced[0]
    assert "accelpatch: built the fused CPU kernels in" in announced[0]
    folders = list((tmp_path / "accelpatch" / "kernels").iterdir())
    assert len(folders) == 1 and (folders[0] / f"{cpu_build.NAMESPACE}.so").is_file()
    third = subprocess.run([sys.executable, "-W", "ignore", "-c", _FIRST_CALL], env=env, capture_output=True,
                           text=True, timeout=600)
    assert third.returncode == 0 and int(third.stdout.split()[0]) > 0, third.stderr
    assert "accelpatch:" not in third.stderr, third.stderr
    assert "CPU kernels: loaded from the cache in" in third.stdout


def test_switched_off_by_the_environment_nothing_is_built(tmp_path):
    """ACCELPATCH_CPU_KERNELS=0: the first patched call builds nothing, says nothing, stays bit-identical, and the
    report counts why the fused ops ran their reference chains."""
    code = _FIRST_CALL.replace("print(sum(", "print(sorted({k for f in accelpatch.report(model).models[0].fusions "
                                            "for k in f.reference_calls}), sum(", 1)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), OMP_NUM_THREADS="1", **{cpu_build.SWITCH: "0"})
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "accelpatch:" not in done.stderr and not (tmp_path / "accelpatch").exists(), done.stderr
    assert "not applicable: CPU kernels switched off (ACCELPATCH_CPU_KERNELS=0)" in done.stdout
    first, status = done.stdout.strip().splitlines()
    assert first.endswith(" 0")  # no fused call
    assert status == "CPU kernels: switched off (ACCELPATCH_CPU_KERNELS=0)"


def test_every_reference_op_has_a_cpu_op_with_its_signature():
    import inspect
    names = sorted(ops())  # every registered op's reference chain
    assert sorted(name for name, op in ops().items() if "cpu" in op.kernels) == names
    for name in names:
        op = ops()[name]
        assert list(inspect.signature(op.kernels["cpu"].run).parameters) == list(
            inspect.signature(op.reference).parameters), name


def test_sources_ship_in_the_package():
    files = importlib.resources.files("accelpatch.lossless.kernels")
    for name in cpu_build.SOURCES + cpu_build.HEADERS:
        assert files.joinpath(name).is_file(), name
    assert "ffp-contract=off" in files.joinpath("cpu_kernels.cpp").read_text(encoding="utf-8")
    assert "TORCH_LIBRARY" in files.joinpath("cpu_ops.cpp").read_text(encoding="utf-8")


@needs_kernels
def test_prepared_signatures_keep_apart_what_the_kernels_cannot_take():
    """A call's preparation is cached by signature: a lazily negated view, a meta tensor or a grad-requiring input
    with the shape, strides and dtype of a prepared call are still declined, not run with the cached kernel."""
    flat = mixed((8, 40), BF16, 1)
    with torch.no_grad():
        check("modulate", flat, flat, flat)
        with pytest.raises(ValueError, match="negated"):
            CPU.modulate(flat._neg_view(), flat, flat)
        with pytest.raises(ValueError, match="CPU tensors"):
            CPU.modulate(flat.to("meta"), flat, flat)
    grad = flat.clone().requires_grad_()
    CPU.modulate(flat, flat, flat)
    with pytest.raises(ValueError, match="autograd"):
        CPU.modulate(grad, flat, flat)
