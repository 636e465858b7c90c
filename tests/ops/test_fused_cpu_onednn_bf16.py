"""The CPU kernel of pointwise_conv and linear (bf16 1x1 convolutions and linear layers summed in oneDNN's
emulated-bf16 order) against eager's ``F.conv2d`` and ``F.linear``, bit for bit and in layout, and the order probe
that decides whether it may run.

On every CPU the kernel is checked against the order it is told to replay, written out in float32 ops
(:func:`_emulated`). Where eager's bf16 kernels are oneDNN's emulated ones (AVX-512 without bf16 instructions, read
by tests/_cpu_kind.py) the probe must choose the order each case states and the op must equal eager; on any other
CPU the probe refuses every candidate order for the cases checked, and the two statements about eager's order
itself are skipped, naming the CPU features they need.

Inputs: GLUMB's shapes (448 -> 2240 with bias, 1120 -> 448 without), reductions over one and several 512-channel
blocks, odd channel counts, output channels and pixel counts that fill no tile, channels-last, NCHW and strided
inputs, ties, NaN, +-inf, +-0.0 and subnormals; linear layers of 200 to 2240 features (one, two and three
blocks), with and without bias, on token-major and transposed (feature-minor) inputs. The probe is checked to tell apart the orders it must: other
blocks, unswapped pairs, the bias first — each changes a large share of its outputs.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _by_name import CPU
from accelpatch.lossless.kernels import onednn_bf16 as ob

from _cpu_kind import KIND, NEEDS_EMULATED_BF16, ONEDNN_EMULATED_BF16

from .test_fused_cpu import BF16, assert_same, needs_kernels, tie_heavy

pytestmark = needs_kernels
OP = "pointwise_conv"


def _operands(n, k, o, h, w, bias=True, layout="nchw", seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:
        x, weight = tie_heavy((n, k, h, w), BF16, seed), tie_heavy((o, k, 1, 1), BF16, seed + 1)
    else:
        x = torch.randn(n, k, h, w, generator=g).to(BF16)
        weight = (torch.randn(o, k, 1, 1, generator=g) / k ** 0.5).to(BF16)
    b = torch.randn(o, generator=g).to(BF16) if bias else None
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":  # every other row of a taller input: no dense layout at all
        tall = torch.zeros(n, k, 2 * h, w, dtype=BF16)
        tall[:, :, ::2] = x
        x = tall[:, :, ::2]
    return x, weight, b


def _conv_order(x):
    """The order measured for eager's bf16 1x1 convolution on AVX-512 without bf16 instructions: the whole reduction
    for channels-last input, blocks of 512 channels otherwise; the bias last."""
    return (0 if x.stride(1) == 1 else 512, ob.BIAS_LAST)


def _check(x, weight, bias, op=OP, order=None):
    """The kernel in ``order`` (the measured one by default) equals that order written out in float32 ops; on the
    CPU kind it replays, the probe finds that order and the op equals eager, bit for bit and in layout."""
    order = order or _conv_order(x)
    with torch.no_grad():
        kernel = _run(op, x, weight, bias, order)
        assert_same(kernel.contiguous(), _emulated_op(op, x, weight, bias, order), f"{op} {tuple(x.shape)} {order}",
                    size1_strides=False)
        found, reason = ob.probe_order(op, x, weight, bias)
        if ONEDNN_EMULATED_BF16:
            assert reason is None and found == _effective(op, x, bias, order), (reason, found, order)
            assert CPU.unsupported(op, x, weight, bias) is None
            eager = (F.conv2d if op == OP else F.linear)(x, weight, bias)
            assert_same(getattr(CPU, op)(x, weight, bias), eager, f"{op} {tuple(x.shape)}", size1_strides=False)
            assert_same(kernel, eager, f"{op} kernel {tuple(x.shape)}", size1_strides=False)
        elif reason is None:  # too few channels to tell orders apart: the order found must give eager's bits
            eager = (F.conv2d if op == OP else F.linear)(x, weight, bias)
            assert_same(_run(op, x, weight, bias, found), eager, f"{op} {tuple(x.shape)} {KIND}", size1_strides=False)
        else:  # eager sums otherwise here: no candidate order reproduces it, and the op says so
            assert "does not replay" in reason and "does not replay" in CPU.unsupported(op, x, weight, bias), KIND


def _effective(op, x, bias, order):
    """``order`` as the probe names it: a block covering the whole reduction is 0, and without a bias its
    position is BIAS_LAST."""
    k = x.shape[1] if op == OP else x.shape[-1]
    block, mode = order
    return (0 if block >= k + (k & 1) else block, mode if bias is not None else ob.BIAS_LAST)


def _run(op, x, weight, bias, order):
    from accelpatch.lossless.kernels import cpu_build

    library, reason = cpu_build.load()
    assert library is not None, reason
    return ob._run(library, op, x, weight, bias, order)


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("k,o,bias", [(448, 2240, True), (1120, 448, False), (2240, 70, True), (33, 50, True),
                                      (1, 3, False), (2, 1, True)])
def test_equals_eager_bit_for_bit(layout, k, o, bias):
    """One and several reduction blocks (1120 and 2240 channels), odd and tiny channel counts, 70 and 50 output
    channels (no whole tile of 64), 5 x 7 x 3 pixels (no whole tile of 6)."""
    _check(*_operands(5, k, o, 7, 3, bias, layout, seed=k + o))


def test_glumb_shapes_with_ties_and_a_strided_input():
    """GLUMB's two convolutions (5 frames of 8 x 8 tokens) on tie-heavy values, whose sums land half-way between
    bf16 values often; and an input with no dense layout."""
    for k, o, bias in ((448, 2240, True), (1120, 448, False)):
        for layout in ("channels_last", "nchw"):
            _check(*_operands(5, k, o, 8, 8, bias, layout, seed=3, ties=True))
    _check(*_operands(2, 96, 40, 4, 5, True, "strided", seed=4))


def test_edge_values():
    """NaN, +-inf (and inf - inf), +-0.0 sums (all-zero rows times negative weights), subnormal operands and
    products that underflow, overflow to inf: each where eager puts it."""
    x, weight, bias = _operands(2, 64, 24, 4, 4, True, "channels_last", seed=5)
    x, weight, bias = x.clone(memory_format=torch.channels_last), weight.clone(), bias.clone()
    x[0, 3, 0, 0] = float("nan")
    x[0, 5, 1, 1] = float("inf")
    x[1, 5, 1, 1], x[1, 6, 1, 1] = float("inf"), -float("inf")
    x[1, :, 2, 2] = 0.0  # a pixel of zeros: +0 sums, then the bias
    x[0, :, 3, 3] = -0.0
    weight[7] = -weight[7].abs()
    x[1, :, 3, 0] = 1e-39  # subnormal inputs
    weight[9, :8] = 3e-39  # subnormal weights: their products underflow to 0 in float
    weight[10, :4] = 3.0e38  # products that overflow
    bias[11] = -0.0
    _check(x, weight, bias)
    _check(x, weight, None)
    zero = torch.zeros(1, 8, 2, 2, dtype=BF16)
    _check(zero, -torch.ones(3, 8, 1, 1, dtype=BF16), -torch.zeros(3, dtype=BF16))


def _emulated(x, weight, bias, order, block=0, bias_first=False, bias_rounded=False):
    """A float32 sum in a stated order, the slow way: ``order`` lists the input channels as summed, ``block`` > 0
    sums every ``block`` channels from +0 and adds the block sums in order; the bias is added after the blocks,
    before the first (``bias_first``), or in bf16 to the rounded sum (``bias_rounded``), as the kernel's three
    positions do. Each product is added as one fused multiply-add (oneDNN's and the kernel's instruction): the
    product exact in float64, the sum rounded once to float32 (a float32 multiply would overflow to inf where the
    exact product only exceeds the float range, e.g. 3e38 x 2 - 3e38 x 2)."""
    rows = x.permute(0, 2, 3, 1).reshape(-1, x.shape[1]).float()
    w = weight.reshape(weight.shape[0], -1).float()
    total = bias.float().expand(rows.shape[0], -1) if bias is not None and bias_first else None
    partial = torch.zeros(rows.shape[0], w.shape[0])
    for i, c in enumerate(order):
        if block and i and i % block == 0:
            total = partial if total is None else total + partial
            partial = torch.zeros_like(partial)
        if c < rows.shape[1]:
            partial = (partial.double() + rows[:, c:c + 1].double() * w[:, c].double()).float()
        else:  # the pad channel of an odd reduction: +0 x +0
            partial = partial + 0.0
    total = partial if total is None else total + partial
    if bias is not None and not bias_first and not bias_rounded:
        total = total + bias.float()
    out = total.to(BF16)
    if bias is not None and bias_rounded:
        out = (out.float() + bias.float()).to(BF16)
    n, _, h, w_ = x.shape
    return out.reshape(n, h, w_, -1).permute(0, 3, 1, 2)


def _emulated_op(op, x, weight, bias, order):
    """The kernel's ``order`` = (block, bias position) for ``op``'s operands: pairs odd channel first, an odd
    reduction padded with +0; contiguous, in the op's output shape."""
    if op == "linear":  # [B, S, K] tokens as B images of K channels x S x 1 pixels
        lead = x.shape[:-1]
        image = x.reshape(-1, x.shape[-1]).t()[None, :, :, None] if x.dim() == 2 else x.transpose(1, 2)[..., None]
        out = _emulated_op(OP, image, weight[..., None, None], bias, order)
        return (out[0, :, :, 0].t() if x.dim() == 2 else out[..., 0].transpose(1, 2)).reshape(*lead, -1).contiguous()
    k = x.shape[1]
    padded = k + (k & 1)
    block, mode = order
    return _emulated(x, weight, bias, [c ^ 1 for c in range(padded)], block=block if block < padded else 0,
                     bias_first=mode == ob.BIAS_FIRST, bias_rounded=mode == ob.BIAS_ROUNDED).contiguous()


@pytest.mark.skipif(not ONEDNN_EMULATED_BF16, reason=NEEDS_EMULATED_BF16)
def test_the_emulation_of_the_replayed_order_is_eager():
    """The order the kernel replays, written out in float32 ops (pairs swapped, blocks of 512 for NCHW, the bias
    last), is eager's on the probe's inputs: the statement the kernel rests on, checked without the kernel."""
    x, weight, bias = _operands(1, 600, 16, 2, 3, True, "nchw", seed=6)
    px, pw, pb = ob._probe_inputs(x, weight, bias)
    swapped = [c ^ 1 for c in range(600)]
    assert torch.equal(_emulated(px, pw, pb, swapped, block=512), F.conv2d(px, pw, pb))


@pytest.mark.parametrize("variant", ["whole reduction", "blocks of 256", "unswapped pairs", "bias first"])
@pytest.mark.skipif(not ONEDNN_EMULATED_BF16, reason=NEEDS_EMULATED_BF16)
def test_the_probe_tells_other_orders_apart(variant):
    """Each plausible other order of summation changes at least a third of the probe's outputs (a wrong block or
    pairing cannot pass the probe by chance). Eager is the baseline, so this needs the CPU kind whose order the
    kernel replays; test_the_probe_inputs_tell_the_kernels_orders_apart is its form for every CPU."""
    x, weight, bias = _operands(1, 600, 16, 2, 3, True, "nchw", seed=7)
    px, pw, pb = ob._probe_inputs(x, weight, bias)
    swapped, plain = [c ^ 1 for c in range(600)], list(range(600))
    order, block, first = {"whole reduction": (swapped, 0, False), "blocks of 256": (swapped, 256, False),
                           "unswapped pairs": (plain, 512, False), "bias first": (swapped, 512, True)}[variant]
    expected = F.conv2d(px, pw, pb)
    differ = int((_emulated(px, pw, pb, order, block, first) != expected).sum())
    assert differ >= expected.numel() // 3, (variant, differ, expected.numel())


@pytest.mark.parametrize("variant", ["whole reduction", "blocks of 256", "unswapped pairs", "bias first"])
def test_the_probe_inputs_tell_the_kernels_orders_apart(variant):
    """On every CPU: on the probe's inputs, the kernel in the order measured for NCHW input (pairs odd channel
    first, blocks of 512, the bias last) and each plausible other order differ in at least a third of the outputs,
    so at most one of them can pass the probe (the form of the test above that needs no particular eager)."""
    x, weight, bias = _operands(1, 600, 16, 2, 3, True, "nchw", seed=7)
    px, pw, pb = ob._probe_inputs(x, weight, bias)
    measured = _run(OP, px, pw, pb, (512, ob.BIAS_LAST)).contiguous()
    other = {"whole reduction": lambda: _run(OP, px, pw, pb, (0, ob.BIAS_LAST)),
             "blocks of 256": lambda: _run(OP, px, pw, pb, (256, ob.BIAS_LAST)),
             "unswapped pairs": lambda: _emulated(px, pw, pb, list(range(600)), block=512),
             "bias first": lambda: _run(OP, px, pw, pb, (512, ob.BIAS_FIRST))}[variant]().contiguous()
    differ = int((other != measured).sum())
    assert differ >= measured.numel() // 3, (variant, differ, measured.numel())


@pytest.mark.parametrize("features,expected", [
    ({"avx2", "fma"}, "an AVX2 CPU without AVX-512"),
    ({"avx2", "avx512f"}, "without avx512bw/avx512dq/avx512vl"),
    ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, None),
    ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}, "it has avx512_bf16"),
    ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_bf16", "avx512_bf16"}, "amx_bf16 and avx512_bf16"),
    (set(), "cannot be read"),
])
def test_the_ops_apply_only_to_cpus_whose_bf16_kernels_are_emulated(features, expected):
    """Which CPUs the ops replay eager on, by their feature flags (oneDNN's avx512_core without bf16 instructions);
    any other CPU is "not this CPU", with the reason naming what it has or lacks."""
    reason = ob.why_not_this_cpu(frozenset(features))
    assert (reason is None) if expected is None else (expected in reason), reason


def test_this_cpu_is_classified_as_the_suite_reads_it():
    assert (ob.why_not_this_cpu() is None) == ONEDNN_EMULATED_BF16, (KIND, ob.why_not_this_cpu())


def test_the_probe_finds_the_block_and_refuses_when_none_matches(monkeypatch):
    """The probe picks an order the kernel then matches eager with; offered only wrong ones it refuses with the
    reason, and so does the op."""
    x, weight, bias = _operands(2, 1100, 32, 3, 3, False, "nchw", seed=8)
    order, reason = ob.probe_order(OP, x, weight, bias)
    if ONEDNN_EMULATED_BF16:
        assert reason is None and order == (512, ob.BIAS_LAST)
    else:  # eager's order on this CPU is none of the candidates
        assert order is None and "does not replay" in reason, KIND
    monkeypatch.setattr(ob, "candidate_orders", lambda op, x: ((256, ob.BIAS_LAST), (1024, ob.BIAS_LAST)))
    monkeypatch.setattr(ob, "_ORDERS", {})
    order, reason = ob.probe_order(OP, x, weight, bias)
    assert order is None and "sums in an order pointwise_conv's kernel does not replay" in reason
    assert "does not replay" in CPU.unsupported(OP, x, weight, bias)
    with pytest.raises(ValueError, match="does not replay"):
        CPU.pointwise_conv(x, weight, bias)


def _linear_order(x, bias):
    """The order measured for eager's bf16 linear layer on AVX-512 without bf16 instructions: one block up to
    ~300 features, two halves for 448..1120, blocks of 768 at 2240; the bias last, or added in bf16 after the
    rounding where aten's addmm takes a feature-minor input."""
    k = x.shape[-1] + (x.shape[-1] & 1)
    block = 0 if k <= 300 else 768 if k >= 2240 else (k // 2 + 1) // 2 * 2
    rounded = bias is not None and x.dim() == 3 and x.stride(-1) != 1
    return (block, ob.BIAS_ROUNDED if rounded else ob.BIAS_LAST)


def _linear_operands(batch, tokens, k, o, bias, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, k, generator=g).to(BF16)
    if transposed:  # feature-minor, as SANA-Video's attention output reaches to_out
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    weight = (torch.randn(o, k, generator=g) / k ** 0.5).to(BF16)
    return x, weight, torch.randn(o, generator=g).to(BF16) if bias else None


@pytest.mark.parametrize("transposed", [False, True], ids=["token-major", "feature-minor"])
@pytest.mark.parametrize("k,o,bias", [(448, 448, False), (448, 448, True), (1120, 448, True), (2240, 100, False),
                                      (200, 70, True), (33, 5, False)])
def test_linear_equals_eager_bit_for_bit(transposed, k, o, bias):
    """One block (200, 33 features), two halves (448, 1120), three blocks (2240); the bias after the blocks,
    and added in bf16 after the rounding where aten's addmm does so (a feature-minor input)."""
    x, weight, b = _linear_operands(1, 37, k, o, bias, transposed, seed=k + o)
    _check(x, weight, b, "linear", _linear_order(x, b))


def test_linear_batches_two_dimensional_inputs_and_ties():
    for x, weight, b in (_linear_operands(2, 11, 448, 64, True, False, 1), _linear_operands(1, 6, 448, 448, True,
                                                                                          False, 2)):
        _check(x, weight, b, "linear", _linear_order(x, b))
        _check(x[0], weight, b, "linear", _linear_order(x[0], b))
    x, weight = tie_heavy((1, 40, 448), BF16, 3), tie_heavy((448, 448), BF16, 4)
    _check(x, weight, None, "linear", _linear_order(x, None))


def test_the_probe_tells_the_bias_positions_of_a_gemm_apart():
    """The three bias positions give different results on the probe's inputs, so the probe's choice is the one."""
    x, weight, bias = _linear_operands(1, 20, 448, 64, True, True, seed=9)
    from accelpatch.lossless.kernels import cpu_build

    library, _ = cpu_build.load()
    px, pw, pb = ob._probe_inputs(x, weight, bias)
    outs = [ob._run(library, "linear", px, pw, pb, (224, mode))
            for mode in (ob.BIAS_LAST, ob.BIAS_FIRST, ob.BIAS_ROUNDED)]
    for i in range(3):
        for j in range(i + 1, 3):
            assert int((outs[i] != outs[j]).sum()) >= outs[i].numel() // 10, (i, j)


@pytest.mark.parametrize("case,expected", [
    ("float32", "takes bfloat16"),
    ("3x3", "1x1 convolution"),
    ("bias shape", "contiguous [4] bias"),
    ("weight layout", "contiguous weight"),
    ("empty", "empty product"),
])
def test_unsupported_inputs_say_why(case, expected):
    x, weight, bias = _operands(1, 6, 4, 2, 2, True, "nchw", seed=9)
    if case == "float32":
        x, weight, bias = x.float(), weight.float(), bias.float()
    elif case == "3x3":
        weight = torch.zeros(4, 6, 3, 3, dtype=BF16)
    elif case == "bias shape":
        bias = torch.zeros(5, dtype=BF16)
    elif case == "weight layout":
        weight = torch.zeros(6, 4, 1, 1, dtype=BF16).transpose(0, 1)
    elif case == "empty":
        x = x[:0]
    with torch.no_grad():
        assert expected in CPU.unsupported(OP, x, weight, bias)


def test_the_portable_build_sums_in_the_same_order(tmp_path, monkeypatch):
    """Built without -march=native (no AVX-512 intrinsics: the scalar tile), the kernel gives the same bits (-O1
    keeps the build short; the numerics flags stay). A second namespace lets both libraries live in one process."""
    from accelpatch.lossless.kernels import cpu_build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    flags = tuple("-O1" if f == "-O3" else f for f in cpu_build.FLAGS if f != "-march=native")
    portable, reason = cpu_build.build(namespace="accelpatch_cpu_portable", flags=flags, announce=False)
    assert portable is not None, reason
    native, _ = cpu_build.load()
    x, weight, bias = _operands(2, 600, 70, 3, 5, True, "nchw", seed=10)
    order = (512, ob.BIAS_LAST)
    got = ob._run(portable, OP, x, weight, bias, order)
    assert_same(got, ob._run(native, OP, x, weight, bias, order), "portable build")
    assert_same(got.contiguous(), _emulated_op(OP, x, weight, bias, order), "portable build against its order",
                size1_strides=False)
    if ONEDNN_EMULATED_BF16:
        assert_same(got, F.conv2d(x, weight, bias), "portable build against eager")
