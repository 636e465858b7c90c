"""The CPU kernel of rope_pair_per_channel (HunyuanVideo 1.5's / LTX-2's interleaved RoPE: every channel its own
cos and sin entry, the chain in float32) against its eager reference (reference.rope_pair_per_channel), bit for
bit, with the helpers of test_fused_cpu.

Inputs: ties, specials (NaN, +-inf, +-0.0, subnormals), every bf16 value (the unit-stride and the strided loop),
bf16/float32/float64 tables whose pair entries differ, [1, N, 1, D] and per-batch tables, transposed, strided and
broadcast views. Also: Wan's rope_pair kernel (cos read at even channels only) and a contracted chain are caught,
and the reference is diffusers' HunyuanVideo ``apply_rotary_emb`` and LTX-2's ``apply_interleaved_rotary_emb``.
"""
from __future__ import annotations

import pytest
import torch

from accelpatch.lossless.kernels import cpu
from _by_name import CPU, REFERENCE as ref

from .test_fused_cpu import BF16, F32, F64, assert_all_same, assert_same, check, mixed, needs_kernels, tie_heavy
from .test_fused_cpu import ROPE_DTYPES, _tables  # the relu_rope tests' operands

OP = "rope_pair_per_channel"
def _tables(b, n, d, dtype, seed, ties=False):
    """Independent random cos and sin: the two entries of a pair differ (unlike Wan's repeat_interleave'd ones)."""
    make = tie_heavy if ties else mixed
    return make((b, n, 1, d), dtype, seed), make((b, n, 1, d), dtype, seed + 1)


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_rope_pair_per_channel(qdtype, tdtype, tokens):
    q, k = mixed((1, tokens, 2, 16), qdtype, 1), mixed((1, tokens, 2, 16), qdtype, 2)
    check(OP, q, k, *_tables(1, tokens, 16, tdtype, 3))
    check(OP, *(tie_heavy((2, tokens, 3, 8), qdtype, s) for s in (4, 5)), *_tables(2, tokens, 8, tdtype, 6, ties=True))


@needs_kernels
@pytest.mark.parametrize("qdtype,tdtype", ROPE_DTYPES)
def test_rope_pair_per_channel_layouts(qdtype, tdtype):
    """Query/key as views of a packed projection and of a [B, H, N, D] tensor (transposed), a strided head dim,
    tables broadcast from [N, 1, D], [1, N, 1, D], per batch (LTX-2's [B, S, C] as [B, S, 1, C]) and strided along
    D (the odd entries of a wider table, so an even/odd mix-up reads other values)."""
    qkv = mixed((2, 17, 3, 2, 24), qdtype, 10)
    cos, sin = _tables(1, 17, 24, tdtype, 11)
    check(OP, qkv[:, :, 0], qkv[:, :, 1], cos, sin)
    heads_first = mixed((2, 2, 17, 24), qdtype, 12).transpose(1, 2)
    check(OP, heads_first, qkv[:, :, 2], cos, sin)
    check(OP, heads_first, heads_first.contiguous(), cos[0], sin[0])
    wide = mixed((2, 17, 2, 48), qdtype, 13)[..., ::2]
    check(OP, wide, qkv[:, :, 0], *_tables(2, 17, 24, tdtype, 14))
    cos_wide = mixed((1, 17, 1, 48), tdtype, 15)[..., 1::2]
    check(OP, qkv[:, :, 0], qkv[:, :, 1], cos_wide, sin)
    check(OP, qkv[:, :, 0], qkv[:, :, 1], cos.expand(2, 17, 2, 24), sin.expand(2, 17, 2, 24).contiguous())


@needs_kernels
@pytest.mark.parametrize("tdtype", [BF16, F32, F64])
def test_rope_pair_per_channel_every_bf16_value(tdtype):
    """Every bf16 bit pattern as query (and reversed as key), in the unit-stride loop and in the strided one."""
    from accelpatch.lossless.kernels.tables import all_bf16_values

    q = all_bf16_values(torch.device("cpu")).view(1, 512, 4, 32)
    check(OP, q, q.flip(1), *_tables(1, 512, 32, tdtype, 30, ties=True))
    strided = all_bf16_values(torch.device("cpu")).view(1, 256, 4, 64)[..., ::2]
    check(OP, strided, strided.flip(1), *_tables(1, 256, 32, tdtype, 31))


@needs_kernels
def test_bf16_tables_run_a_float32_chain():
    """bf16 query with bf16 tables: ``x.float()`` makes the chain float32, where rope_pair's bf16 chain rounds
    every product to bf16 first: a0 * c0 - a1 * s0 = (1 + 2^-7)^2 - (1 + 2^-7) is 2^-7 + 2^-14 in float32 (and in
    bf16), 2^-7 when (1 + 2^-7)^2 is first rounded to bf16."""
    a = torch.tensor([1 + 2.0 ** -7, 1 + 2.0 ** -7], dtype=BF16).view(1, 1, 1, 2)
    c = torch.tensor([1 + 2.0 ** -7, 1.0], dtype=BF16).view(1, 1, 1, 2)
    s = torch.tensor([1.0, 0.0], dtype=BF16).view(1, 1, 1, 2)
    out = CPU.rope_pair_per_channel(a, a, c, s)[0]
    assert out[0, 0, 0, 0].item() == 2.0 ** -7 + 2.0 ** -14
    assert ref.rope_pair(a, a, c, s.roll(1, -1))[0][0, 0, 0, 0].item() == 2.0 ** -7
    check(OP, a, a, c, s)


@needs_kernels
def test_wans_kernel_and_a_contracted_chain_are_caught():
    """Deliberately wrong kernels on per-channel tables: Wan's rope_pair (cos read at even, sin at odd channels
    for both outputs) and the chain rounded once per output (an FMA's result) differ from the reference, and the
    same comparison catches them; the kernel under test does not."""
    q = mixed((1, 257, 2, 16), F32, 7)
    cos, sin = _tables(1, 257, 16, F32, 8)
    expected = ref.rope_pair_per_channel(q, q, cos, sin)
    with pytest.raises(AssertionError, match="differ|NaN"):
        assert_all_same(CPU.rope_pair(q, q, cos, sin), expected, "rope_pair as rope_pair_per_channel")
    x = q.double()
    once = torch.empty_like(expected[0])
    once[..., 0::2] = (x[..., 0::2] * cos[..., 0::2].double() - x[..., 1::2] * sin[..., 0::2].double()).float()
    once[..., 1::2] = (x[..., 1::2] * cos[..., 1::2].double() + x[..., 0::2] * sin[..., 1::2].double()).float()
    with pytest.raises(AssertionError, match="differ|NaN"):
        assert_same(once, expected[0])
    finite = torch.isfinite(expected[0]) & torch.isfinite(once)
    assert not torch.equal(once[finite], expected[0][finite])
    assert_all_same(CPU.rope_pair_per_channel(q, q, cos, sin), expected, OP)


@needs_kernels
def test_the_self_check_runs_the_per_channel_kernels(monkeypatch):
    """The library's known-answer self-check includes the per-channel kernel: a library whose rope op reads the
    tables paired where asked per channel (and the reverse) is refused."""
    from accelpatch.lossless.kernels import cpu_build

    library, _ = cpu_build.load()

    class Wrong:
        def __getattr__(self, name):
            return getattr(library, name)

        @staticmethod
        def rope(*args):
            *rest, per_channel = args
            return library.rope(*rest, not per_channel)

    monkeypatch.setattr(cpu, "_SELF_CHECK", [])
    monkeypatch.setattr(cpu_build, "_RESULT", (Wrong(), None))
    reason = CPU.unsupported("modulate", *(torch.zeros(4),) * 3)
    assert reason is not None and "known-answer" in reason


_EDGE = [0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3.0e38, -3.0e38, 1.5,
         -2.75, 1e-3, 65504.0, 7e-39]


def _hv_operands(dtype, seed=0):
    """x [1, 32, 2, 16] holding every (even, odd) pair of edge values twice; [32, 16] tables of edge values drawn
    per channel (a pair's two entries differ)."""
    import itertools

    pairs = torch.tensor(list(itertools.product(_EDGE, repeat=2)))  # 256 (a, b)
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([pairs[torch.randperm(len(pairs), generator=g)], pairs]).reshape(1, 32, 2, 16).to(dtype)
    edge = torch.tensor(_EDGE)
    cos, sin = (edge[torch.randint(0, len(_EDGE), (32, 16), generator=g)] for _ in range(2))
    return x, cos, sin


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_the_reference_is_hunyuan_videos_and_ltx2s_rope(dtype):
    """reference.rope_pair_per_channel is diffusers' ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1,
    sequence_dim=1)`` (HunyuanVideo15AttnProcessor2_0's) bit for bit, and LTX-2's ``apply_interleaved_rotary_emb``
    on [B, S, C] with [B, S, C] tables (ours on the [B, S, 1, C] view) too; float32 and bf16 tables."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb

    for tdtype in (F32, BF16):
        x, cos, sin = _hv_operands(dtype)
        cos, sin = cos.to(tdtype), sin.to(tdtype)
        ours = ref.rope_pair_per_channel(x, x.flip(1), cos[None, :, None], sin[None, :, None])
        assert ours[0].isnan().any() and ((ours[0] == 0) & ours[0].signbit()).any()
        assert_same(ours[0], apply_rotary_emb(x, (cos, sin), sequence_dim=1))
        assert_same(ours[1], apply_rotary_emb(x.flip(1), (cos, sin), sequence_dim=1))
        tokens = mixed((2, 32, 24), dtype, 5)
        lcos, lsin = mixed((2, 32, 24), tdtype, 6), mixed((2, 32, 24), tdtype, 7)
        theirs = apply_interleaved_rotary_emb(tokens, (lcos, lsin))
        assert_same(ref.rope_pair_per_channel(tokens, tokens, lcos, lsin)[0], theirs)
        mine = ref.rope_pair_per_channel(tokens[:, :, None], tokens[:, :, None], lcos[:, :, None], lsin[:, :, None])
        assert_same(mine[0][:, :, 0], theirs)
    # and Wan's reference is not HunyuanVideo's on such tables (the reason this op exists)
    x, cos, sin = _hv_operands(F32)
    with pytest.raises(AssertionError):
        assert_same(ref.rope_pair(x, x, cos[None, :, None], sin[None, :, None])[0],
                    apply_rotary_emb(x, (cos, sin), sequence_dim=1))
