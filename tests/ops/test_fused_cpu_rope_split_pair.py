"""The CPU kernel of rope_split_pair (LTX-2.3's split RoPE: diffusers ``apply_split_rotary_emb`` on q and k, the
rotate-half loops with a float32 split policy) against its eager reference (reference.rope_split_pair), bit for
bit, with the helpers of test_fused_cpu; and the reference against diffusers' function.

Inputs: every pair of edge values (NaN, +-inf, +-0.0, subnormals, ties), every bf16 value (the unit-stride and the
strided loop), [B, H, T, D/2] tables (swapaxes views, as LTX-2.3 builds them) and [B, T, C/2] ones, float32 and bf16
tables, packed, strided and broadcast views. Also: this CPU's eager addcmul_ is an fma (probed), so the
mul-then-add form of the same kernel is caught, and so is a chain rounded once (fully contracted).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from accelpatch.lossless.kernels import addcmul, cpu
from _by_name import CPU, REFERENCE as ref
from accelpatch.lossless.ops import rope_split_pair as split_op

from .test_fused_cpu import BF16, F16, F32, F64, assert_all_same, assert_same, check, mixed, needs_kernels, tie_heavy

OP = "rope_split_pair"
_EDGE = [0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3.0e38, -3.0e38, 1.5,
         -2.75, 1e-3, 1 + 2.0 ** -8, 7e-39]


def _tables(b, h, t, r, dtype, seed, ties=False):
    """[B, H, T, R] cos and sin as LTX-2.3 lays them out: swapaxes(1, 2) views of [B, T, H, R] tensors."""
    make = tie_heavy if ties else mixed
    return tuple(make((b, t, h, r), dtype, seed + i).transpose(1, 2) for i in range(2))


def _edge_operands(dtype, seed=0):
    """x [1, 32, 2 * 16] (one head of 32 channels per token: halves of 16) holding every (x1, x2) pair of edge
    values twice; [1, 1, 32, 16] tables of edge values."""
    pairs = torch.tensor(list(itertools.product(_EDGE, repeat=2)))  # 256 (x1, x2)
    g = torch.Generator().manual_seed(seed)
    both = torch.cat([pairs[torch.randperm(len(pairs), generator=g)], pairs])  # 512 pairs = 32 tokens x 16
    x = both.reshape(1, 32, 16, 2).permute(0, 1, 3, 2).reshape(1, 32, 32).to(dtype)
    edge = torch.tensor(_EDGE)
    cos, sin = (edge[torch.randint(0, len(_EDGE), (1, 1, 32, 16), generator=g)] for _ in range(2))
    return x, cos, sin


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_the_reference_is_diffusers_apply_split_rotary_emb(dtype):
    """reference.rope_split_pair is diffusers' ``apply_split_rotary_emb`` on query and on key, bit for bit and in
    layout, with [B, H, T, D/2] and [B, T, C/2] tables, float32 and bf16 ones."""
    from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

    for tdtype in (F32, BF16):
        x, cos, sin = _edge_operands(dtype)
        cos, sin = cos.to(tdtype), sin.to(tdtype)
        ours = ref.rope_split_pair(x, x.flip(1), cos, sin)
        assert ours[0].isnan().any() and ((ours[0] == 0) & ours[0].signbit()).any()
        assert_same(ours[0], apply_split_rotary_emb(x, (cos, sin)))
        assert_same(ours[1], apply_split_rotary_emb(x.flip(1), (cos, sin)))
        q, k = mixed((2, 17, 48), dtype, 1), mixed((2, 17, 48), dtype, 2)
        for tables in (_tables(2, 3, 17, 8, tdtype, 3), (mixed((2, 17, 24), tdtype, 5), mixed((1, 17, 24), tdtype, 6))):
            ours = ref.rope_split_pair(q, k, *tables)
            assert_same(ours[0], apply_split_rotary_emb(q, tables))
            assert_same(ours[1], apply_split_rotary_emb(k, tables))


@needs_kernels
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_every_pair_of_edge_values(dtype):
    for tdtype in (F32, BF16) if dtype != F16 else (F32,):
        x, cos, sin = _edge_operands(dtype)
        check(OP, x, x.flip(1), cos.to(tdtype), sin.to(tdtype))
        check(OP, x, x.flip(2), cos[0].to(tdtype), sin[0].to(tdtype))  # as [1, T, C/2] tables: one head of C


@needs_kernels
@pytest.mark.parametrize("dtype,tdtype", [(F32, F32), (F32, BF16), (BF16, F32), (BF16, BF16), (F16, F32)])
@pytest.mark.parametrize("tokens", [1, 17, 257])
def test_rope_split_pair(dtype, tdtype, tokens):
    q, k = mixed((2, tokens, 3 * 16), dtype, 1), mixed((2, tokens, 3 * 16), dtype, 2)
    check(OP, q, k, *_tables(2, 3, tokens, 8, tdtype, 3))
    check(OP, *(tie_heavy((1, tokens, 2 * 8), dtype, s) for s in (4, 5)), *_tables(1, 2, tokens, 4, tdtype, 6, True))
    check(OP, q, k, mixed((2, tokens, 24), tdtype, 7), mixed((2, tokens, 24), tdtype, 8))


@needs_kernels
@pytest.mark.parametrize("dtype,tdtype", [(BF16, F32), (F32, F32), (BF16, BF16)])
def test_layouts(dtype, tdtype):
    """q and k as chunks of a packed projection, a strided channel dim; tables contiguous [B, H, T, R], broadcast
    along B (stride 0) and along H, strided along the entry; [1, T, C/2] tables broadcast over the batch."""
    qkv = mixed((2, 17, 3 * 48), dtype, 10)
    q, k, _ = qkv.chunk(3, dim=-1)
    cos, sin = _tables(2, 3, 17, 8, tdtype, 11)
    check(OP, q, k, cos, sin)
    check(OP, q, k, cos.contiguous(), sin)
    check(OP, q, k, cos[:1].expand(2, 3, 17, 8), sin[:, :1].expand(2, 3, 17, 8))
    wide_cos, wide_sin = _tables(2, 3, 17, 16, tdtype, 12)
    check(OP, q, k, wide_cos[..., 1::2], wide_sin[..., ::2])
    strided = mixed((2, 17, 96), dtype, 13)[..., ::2]
    check(OP, strided, q, cos, sin)
    check(OP, q, k, mixed((1, 17, 24), tdtype, 14), mixed((1, 1, 24), tdtype, 15))


@needs_kernels
@pytest.mark.parametrize("tdtype", [F32, BF16])
def test_every_bf16_value(tdtype):
    """Every bf16 bit pattern as query (and reversed as key): [1, 512, 128] as 2 heads of 64 with [1, 2, 512, 32]
    tables, and as one [1, 256, 256] with [1, 256, 128] tables read through a stride (the gathered path)."""
    from accelpatch.lossless.kernels.tables import all_bf16_values

    q = all_bf16_values(torch.device("cpu")).view(1, 512, 128)
    check(OP, q, q.flip(1), *_tables(1, 2, 512, 32, tdtype, 30, ties=True))
    q = all_bf16_values(torch.device("cpu")).view(1, 256, 256)
    cos, sin = (mixed((1, 256, 256), tdtype, s)[..., ::2] for s in (31, 32))
    check(OP, q, q.flip(1), cos, sin)


def test_this_cpus_eager_addcmul_is_an_fma():
    """The probe this op's kernels follow: eager float32 addcmul_ keeps the product exact here (torch 2.13,
    AVX-512), in its vectorised and scalar loops alike; the two forms differ on its inputs, so it can tell."""
    forms = addcmul.loop_forms(torch.device("cpu"))
    assert forms == {"vectorised": addcmul.FMA, "scalar": addcmul.FMA}, forms
    assert addcmul.addcmul_form(torch.device("cpu")) == (addcmul.FMA, None)
    g = torch.Generator().manual_seed(4321)
    base, t1, t2 = torch.randn(3, 1024, generator=g)
    assert not torch.equal(base + t1 * t2, (base.double() + t1.double() * t2.double()).float())


@needs_kernels
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_a_mul_add_kernel_and_a_contracted_chain_are_caught(monkeypatch, dtype):
    """Deliberately wrong kernels: the same loops with the second product rounded before the add (what CUDA's
    addcmul_ does, not this CPU's), and the whole chain rounded once per output (every product kept exact): both
    differ from the reference (the second in float32 outputs), and the same comparison catches them; the kernel
    under test does not."""
    q, k = mixed((2, 257, 48), dtype, 7), mixed((2, 257, 48), dtype, 8)
    cos, sin = _tables(2, 3, 257, 8, F32, 9)
    expected = ref.rope_split_pair(q, k, cos, sin)
    assert_all_same(CPU.rope_split_pair(q, k, cos, sin), expected, OP)
    monkeypatch.setattr(cpu, "_PREPARED", {})
    monkeypatch.setattr(split_op, "_split_policy", lambda: cpu.SPLIT_MUL_ADD)
    with pytest.raises(AssertionError, match="differ|NaN"):
        assert_all_same(CPU.rope_split_pair(q, k, cos, sin), expected, "rope_split_pair rounded then added")
    x = q.double().reshape(2, 257, 3, 2, 8)
    c, s = cos.double().transpose(1, 2)[..., None, :], sin.double().transpose(1, 2)[..., None, :]
    once = torch.cat([x[..., :1, :] * c - x[..., 1:, :] * s, x[..., 1:, :] * c + x[..., :1, :] * s], dim=-2)
    once = once.reshape(2, 257, 48).float().to(dtype)
    if dtype == F32:  # bf16 outputs hide a contraction of these few products (as in the Triton RoPE tests)
        with pytest.raises(AssertionError, match="differ|NaN"):
            assert_same(once, expected[0])


@needs_kernels
def test_the_self_check_runs_the_split_kernels(monkeypatch):
    """The library's known-answer self-check includes both split forms: a library whose rotate_half op swaps the
    mul-add and fma policies is refused."""
    from accelpatch.lossless.kernels import cpu_build

    library, _ = cpu_build.load()
    swap = {cpu.SPLIT_MUL_ADD: cpu.SPLIT_FMA, cpu.SPLIT_FMA: cpu.SPLIT_MUL_ADD}

    class Wrong:
        def __getattr__(self, name):
            return getattr(library, name)

        @staticmethod
        def rotate_half(*args):
            *rest, policy = args
            return library.rotate_half(*rest, swap.get(policy, policy))

    monkeypatch.setattr(cpu, "_SELF_CHECK", [])
    monkeypatch.setattr(cpu_build, "_RESULT", (Wrong(), None))
    reason = CPU.unsupported("modulate", *(torch.zeros(4),) * 3)
    assert reason is not None and "known-answer" in reason


@needs_kernels
def test_the_self_check_catches_a_wrong_form():
    """The self-check's stated-form references are not interchangeable: the fma kernel's outputs differ from the
    mul-add reference (so a library whose forms were swapped, or contracted, is refused)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 64, 64, generator=g)
    cos, sin = (torch.randn(1, 64, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    fma, mul_add = split_op._split_reference(True)(q, q, cos, sin), split_op._split_reference(False)(q, q, cos, sin)
    assert not torch.equal(fma[0], mul_add[0])
    assert_all_same(fma, ref.rope_split_pair(q, q, cos, sin))  # this CPU: eager is the fma form


def assert_split_refusals(unsupported) -> None:
    """Both devices' ``unsupported`` (the shared checks of accelpatch.lossless.kernels.split_rope) name each refusal."""
    q = torch.zeros(1, 4, 16)
    cos, sin = torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)
    assert "[B, T, C] query" in unsupported(OP, q.view(1, 4, 2, 8), q.view(1, 4, 2, 8), cos, sin)
    assert "float32 or bf16 tables" in unsupported(OP, q, q, cos.double(), sin.double())
    assert "do not match" in unsupported(OP, q, q, cos[:, :1], sin[:, :1])
    assert "C/2" in unsupported(OP, q, q, torch.zeros(1, 4, 4), torch.zeros(1, 4, 4))
    assert "[B, H, T, D/2] or [B, T, C/2]" in unsupported(OP, q, q, torch.zeros(4, 8), torch.zeros(4, 8))
    assert unsupported(OP, q, q, cos, sin) is None


@needs_kernels
def test_refusals_name_the_reason():
    assert_split_refusals(CPU.unsupported)
