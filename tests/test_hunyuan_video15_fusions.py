"""HunyuanVideo 1.5's lossless fusions (accelpatch/models/hunyuan_video15/lossless.py: the block's AdaLN chains, and
the joint attention's video q/k RoPE as rope_pair_per_channel): the default tier is bit-identical to unpatched
diffusers in fp32 and bf16, batch 1 and 2, text-to-video and image-to-video, with the text padding mask, and the
real fused kernels running; a deliberately wrong kernel is declined on first sight, ``remove()`` restores,
``sol_attn`` runs sparse above the fusions, a compiled patched block equals the compiled unpatched one; the fused
attention is the processor on tables whose channel pairs differ, where Wan's interleaved RoPE reference is not
HunyuanVideo's RoPE."""
import itertools
import warnings

import pytest
import torch

import _fused_doubles as doubles
from _model_fusion_checks import (BITS, bits_equal, fresh_verdicts, fusion_of,
                                  lossless_warnings, stand_in_kernels)  # noqa: F401 - fixtures
import accelpatch
from accelpatch.core.sites import NO_FUSED_OP_COMPILED
import accelpatch.lossless.ops  # noqa: F401 - registers the ops verify.ops() lists
from accelpatch.lossless import verify
from _by_name import REFERENCE as ref
from test_memory_plan import _within  # the planner-vs-real tolerance the memory tests share
from accelpatch.core.sites import SITE_ATTR
from accelpatch.testing import hunyuan_video15_transformer_inputs, tiny_hunyuan_video15_transformer

#: fused calls per forward: 2 blocks x 2 streams x 2 chains (the AdaLN-Zero and feed-forward modulations; the
#: attention and feed-forward gated residual adds); the RoPE of q and k once per block (the video stream)
PER_FORWARD = {"modulate": 8, "gated_residual": 8, "rope_pair_per_channel": 2}
OPS = tuple(PER_FORWARD)
#: signatures per op: the video and the text stream for the block's chains, the video stream for the RoPE
SIGNATURES = {"modulate": 2, "gated_residual": 2, "rope_pair_per_channel": 1}
KINDS = ["hunyuan_video15_fused_block", "hunyuan_video15_fused_attention", "fused_gelu", "fused_gelu"] * 2
CASES = {"t2v-b1": dict(batch_size=1), "i2v-b2": dict(batch_size=2, image=True)}


def _model_and_inputs(dtype=torch.bfloat16, case="t2v-b1"):
    model = tiny_hunyuan_video15_transformer(dtype=dtype)
    # 2 x 8 x 8 video tokens; Qwen text 6 of 8 valid, ByT5 3 of 4: the padding mask is not all ones
    inputs = hunyuan_video15_transformer_inputs(model, num_frames=2, height=8, width=8, **CASES[case])
    assert not inputs["encoder_attention_mask"].all()
    return model, inputs, _forward(model, inputs)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_tier_is_bit_identical_with_the_real_kernels_fused(dtype, case):
    model, inputs, reference = _model_and_inputs(dtype, case)
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")  # a declined signature would warn
        for _ in range(2):  # first sight, then the verified kernels
            assert bits_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    assert [s.kind for s in report.sites] == KINDS
    assert all(s.mounted and s.fast_calls == 2 for s in report.sites)
    gelu = fusion_of(report, "gelu_inplace")  # both streams' feed-forwards, 2 blocks, 2 forwards
    assert gelu.sites == 4 and gelu.fused_calls == 8 and not gelu.declined, gelu
    name = str(dtype).removeprefix("torch.")
    for op in OPS:
        fusion = fusion_of(report, op)
        assert fusion.sites == 2 and fusion.fused_calls == 2 * PER_FORWARD[op] and not fusion.declined, fusion
        # each stream is a signature of each op, all verified, in the model's dtype
        assert len(fusion.verified) == SIGNATURES[op], fusion
        assert all(sig.split()[1].startswith(name) for sig, _ in fusion.verified)
    accelpatch.remove(model)
    assert not any(SITE_ATTR in m.__dict__ for m in model.modules())
    assert type(model.transformer_blocks[0]).__name__ == "HunyuanVideo15TransformerBlock"
    assert bits_equal(_forward(model, inputs), reference)


@pytest.mark.parametrize("op", OPS)
def test_a_wrong_kernel_is_declined_on_first_sight_for_good(stand_in_kernels, op):
    doubles.WRONG.add(op)
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _forward(model, inputs)
        calls_after_first = doubles.CALLS[op]
        second = _forward(model, inputs)
    assert bits_equal(first, reference) and bits_equal(second, reference)
    signatures = SIGNATURES[op]
    assert calls_after_first == signatures and doubles.CALLS[op] == signatures  # one first sight each, never again
    messages = lossless_warnings(record)
    # one warning per declined signature: the video stream (128 tokens x 256: the block's chains, or the rotated
    # key) and the text stream (16 x 256)
    expected = ["32768", "4096"][:signatures]
    assert sorted(m.split("differs from the reference in 1 of ")[1].split(" ")[0] for m in messages) == expected, \
        messages
    assert all(f"lossless {op} fast path" in m and "largest difference" in m for m in messages), messages
    fusion = fusion_of(accelpatch.report(model), op)
    assert fusion.fused_calls == 0 and len(fusion.declined) == signatures and not fusion.verified
    assert all("differs from the reference in 1 of" in reason for _, reason, _ in fusion.declined)
    assert sum(n for r, n in fusion.reference_calls.items() if r.startswith("declined: ")) == 2 * PER_FORWARD[op]
    for other in set(OPS) - {op}:  # the right ops still run fused
        other_fusion = fusion_of(accelpatch.report(model), other)
        assert other_fusion.fused_calls == 2 * PER_FORWARD[other] and not other_fusion.declined
    accelpatch.remove(model)


def test_with_sol_attn_lossless_is_bit_identical_and_high_runs_both():
    model, inputs, reference = _model_and_inputs(torch.float32)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
    kinds = [s.kind for s in accelpatch.report(model).sites]
    assert kinds.count("hunyuan_video15_fused_block") == 2 and kinds.count("hunyuan_video15_sol_attn") == 2
    assert kinds.count("hunyuan_video15_refiner_attention") == 1
    assert kinds.count("hunyuan_video15_fused_attention") == 2  # below the Sol-Attn sites on the same modules
    with accelpatch.quality("lossless"):
        assert bits_equal(_forward(model, inputs), reference)
    for op in OPS:
        assert fusion_of(accelpatch.report(model), op).fused_calls == PER_FORWARD[op]
    sparse = _forward(model, inputs)  # the default tier is high with a backend
    report = accelpatch.report(model)
    assert not torch.equal(sparse, reference)
    assert all(s.fast_calls == 1 for s in report.sites if s.kind == "hunyuan_video15_sol_attn")
    assert all(s.fast_calls == 2 for s in report.sites if s.kind == "hunyuan_video15_fused_block")
    # under high the sparse path took every attention call (its own q/k/v): the RoPE fusion ran only under lossless
    assert all(s.fast_calls == 1 for s in report.sites if s.kind == "hunyuan_video15_fused_attention")
    for op in OPS:
        fusion = fusion_of(report, op)
        assert fusion.fused_calls == (1 if op == "rope_pair_per_channel" else 2) * PER_FORWARD[op], fusion
        assert not fusion.declined
    accelpatch.remove(model)
    assert bits_equal(_forward(model, inputs), reference)


def test_compiled_patched_blocks_equal_the_compiled_unpatched_ones():
    """Every block compiled with fullgraph=True (the whole model does not compile fullgraph unpatched: its forward
    branches on the image embeddings' values): inside the graph the fused ops run their reference chains."""
    model, inputs, _ = _model_and_inputs(torch.float32)
    torch._dynamo.reset()
    try:
        for block in model.transformer_blocks:
            block.compile(backend="eager", fullgraph=True)
        compiled_reference = _forward(model, inputs)
        for block in model.transformer_blocks:
            block._compiled_call_impl = None
        accelpatch.apply(model)
        torch._dynamo.reset()
        for block in model.transformer_blocks:
            block.compile(backend="eager", fullgraph=True)
        assert bits_equal(_forward(model, inputs), compiled_reference)
        report = accelpatch.report(model)
        # each site ran once, its fused ops standing aside in the graph: counted so, not as fast calls
        assert [s.kind for s in report.sites] == KINDS
        assert all((s.fast_calls, s.reference_calls) == (0, {NO_FUSED_OP_COMPILED: 1}) for s in report.sites)
        for op in OPS:
            fusion = fusion_of(report, op)
            assert fusion.reference_calls == {verify.IN_COMPILE: PER_FORWARD[op]} and fusion.fused_calls == 0, fusion
    finally:
        for block in model.transformer_blocks:
            block._compiled_call_impl = None
        torch._dynamo.reset()
    accelpatch.remove(model)


def test_a_hooked_norm_is_called_as_a_module_and_a_foreign_block_class_stays_unmounted():
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15TransformerBlock

    model, inputs, reference = _model_and_inputs()
    seen = []
    handle = model.transformer_blocks[0].norm1.register_forward_hook(lambda *_: seen.append(1))
    accelpatch.apply(model)
    assert bits_equal(_forward(model, inputs), reference) and seen == [1]  # the hook still runs
    assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 4 - 1 + 4  # one modulation inside norm1
    accelpatch.remove(model)
    handle.remove()

    class CustomBlock(HunyuanVideo15TransformerBlock):  # a forward of its own: the restatement would not be its chain
        pass

    model.transformer_blocks[1].__class__ = CustomBlock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply() says which site did not mount
        accelpatch.apply(model)
    assert bits_equal(_forward(model, inputs), reference)
    sites = [s for s in accelpatch.report(model).sites if s.kind == "hunyuan_video15_fused_block"]
    assert [(s.mounted, s.fast_calls) for s in sites] == [(False, 0), (False, 0)]
    attention = [s for s in accelpatch.report(model).sites if s.kind == "hunyuan_video15_fused_attention"]
    assert [(s.mounted, s.fast_calls) for s in attention] == [(True, 1), (True, 1)]  # the attention is diffusers'
    assert fusion_of(accelpatch.report(model), "rope_pair_per_channel").fused_calls == 2
    assert all("CustomBlock is not diffusers' HunyuanVideo15TransformerBlock" in s.reason for s in sites), sites
    accelpatch.remove(model)
    assert type(model.transformer_blocks[1]) is CustomBlock


# ---- the RoPE: rope_pair_per_channel is HunyuanVideo's; Wan's interleaved reference only on paired tables ------

_EDGE = [0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3.0e38, -3.0e38, 1.5,
         -2.75, 1e-3, 65504.0, 7e-39]


def _rope_operands(dtype, paired=True):
    """x [1, 32, 2, 16] holding every (even, odd) pair of edge values; per-token tables with edge values, each angle
    twice (``repeat_interleave``, as HunyuanVideo15RotaryPosEmbed's get_1d_rotary_pos_embed builds them) unless
    ``paired`` is False."""
    pairs = torch.tensor(list(itertools.product(_EDGE, repeat=2)))  # 256 (a, b)
    g = torch.Generator().manual_seed(0)
    x = pairs[torch.randperm(len(pairs), generator=g)].reshape(16, 2, 16)  # 16 tokens x 2 heads x 8 pairs
    x = torch.cat([x, pairs.reshape(16, 2, 16)]).to(dtype)[None]  # 32 tokens
    edge = torch.tensor(_EDGE)
    cos = edge[torch.randint(0, len(_EDGE), (32, 8), generator=g)]
    sin = edge[torch.randint(0, len(_EDGE), (32, 8), generator=g)]
    cos, sin = cos.repeat_interleave(2, dim=1), sin.repeat_interleave(2, dim=1)
    if not paired:
        sin = sin.clone()
        sin[:, 0::2] = torch.randn(32, 8, generator=g)
    return x, cos, sin


def _same_bits_nan_positions(a, b):
    width = BITS[a.dtype]
    both_nan = a.isnan() & b.isnan()
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and bool(((a.view(width) == b.view(width)) | both_nan).all()) and torch.equal(a.isnan(), b.isnan()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_interleaved_rope_reference_is_hunyuan_videos_rope_on_paired_tables_only(dtype):
    """``x.float() * cos + x_rot.float() * sin`` with ``x_rot = [-x2, x1]`` (diffusers' ``apply_rotary_emb``) is
    ``x1 * cos - x2 * sin, x1 * sin + x2 * cos`` bit for bit (signed zeros included; NaN at the same places) when
    every table holds each angle twice: IEEE ``p + (-q)`` is ``p - q`` and sums and products commute. The reference
    reads ``cos`` at even and ``sin`` at odd channels, so on tables whose pairs differ the two disagree, which the
    same comparison sees. A fused RoPE of HunyuanVideo through Wan's kernels would therefore need a proof that the
    tables are paired (HunyuanVideo15RotaryPosEmbed's are; tables passed to a block are not checked), which is why
    the fused attention takes rope_pair_per_channel (each channel its own entry), equal on both kinds of table."""
    from diffusers.models.embeddings import apply_rotary_emb

    x, cos, sin = _rope_operands(dtype)
    diffusers_rope = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    assert diffusers_rope.isnan().any()
    signed_zero = (diffusers_rope == 0) & torch.signbit(diffusers_rope)
    assert signed_zero.any()  # edge values reach -0.0 outputs, compared bit for bit
    assert _same_bits_nan_positions(diffusers_rope, ref.rotary_interleaved(x, cos[None, :, None], sin[None, :, None]))

    per_channel = ref.rope_pair_per_channel(x, x, cos[None, :, None], sin[None, :, None])[0]
    assert _same_bits_nan_positions(diffusers_rope, per_channel)

    x, cos, sin = _rope_operands(dtype, paired=False)
    diffusers_rope = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    assert not _same_bits_nan_positions(diffusers_rope,
                                        ref.rotary_interleaved(x, cos[None, :, None], sin[None, :, None]))
    assert _same_bits_nan_positions(
        diffusers_rope, ref.rope_pair_per_channel(x, x, cos[None, :, None], sin[None, :, None])[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_fused_attention_is_the_processor_on_unpaired_tables(dtype):
    """One joint attention called with random [S, D] tables whose channel pairs differ (and bf16 tables with bf16
    activations): the patched module with the real kernels gives the processor's bits, the RoPE fused."""
    model = tiny_hunyuan_video15_transformer(dtype=dtype)
    attn = model.transformer_blocks[0].attn
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 128, attn.inner_dim, generator=g).to(dtype)
    encoder = torch.randn(1, 8, attn.inner_dim, generator=g).to(dtype)
    mask = torch.tensor([[1] * 6 + [0] * 2])
    d = attn.inner_dim // attn.heads
    for table_dtype in (torch.float32, dtype):
        tables = tuple(torch.randn(128, d, generator=g).to(table_dtype) for _ in range(2))
        call = dict(hidden_states=hidden, encoder_hidden_states=encoder, attention_mask=mask,
                    image_rotary_emb=tables)
        with torch.no_grad():
            expected = attn(**call)
            accelpatch.apply(model)
            got = attn(**call)
            fusion = fusion_of(accelpatch.report(model), "rope_pair_per_channel")
            accelpatch.remove(model)
        assert all(bits_equal(a, b) for a, b in zip(got, expected))
        assert fusion.fused_calls == 1 and not fusion.declined, fusion


def test_the_model_rope_tables_are_paired():
    """HunyuanVideo15RotaryPosEmbed's tables hold each angle twice (the condition above), on the tiny model."""
    model = tiny_hunyuan_video15_transformer()
    cos, sin = model.rope(torch.zeros(1, 4, 2, 8, 8))
    assert cos.shape == (128, 128) and cos.dtype == torch.float32
    for table in (cos, sin):
        assert torch.equal(table[:, 0::2].view(torch.int32), table[:, 1::2].view(torch.int32))


@pytest.mark.parametrize("batch,text,valid,seq_len", [(1, 8, [6], 40), (2, 12, [3, 12], 30), (1, 5, [0], 5)])
def test_the_one_tensor_mask_is_the_processors_mask(batch, text, valid, seq_len):
    """pair_mask builds the joint attention's [B, 1, L, L] mask as one tensor; the processor's construction (its
    lines, run here) holds two: the same values, dtype, shape and strides, so the dispatcher sees the same mask."""
    from accelpatch.models.hunyuan_video15.lossless import pair_mask

    mask = torch.zeros(batch, text, dtype=torch.int64)
    for row, count in enumerate(valid):
        mask[row, :count] = 1
    padded = torch.nn.functional.pad(mask, (seq_len - text, 0), value=True).bool()
    first = padded.view(batch, 1, 1, seq_len).repeat(1, 1, seq_len, 1)
    expected = (first & first.transpose(2, 3)).bool()
    got = pair_mask(mask, seq_len)
    assert got.dtype == expected.dtype == torch.bool and got.shape == expected.shape
    assert got.stride() == expected.stride() and torch.equal(got, expected)


def _qkv_and_valid(dtype, seq_len, valid_rows):
    """[B, L, 2, 32] query, key and value and the [B, L] mask whose row ``b`` is valid where ``valid_rows[b]``
    says (a prefix length, or a list of positions)."""
    generator = torch.Generator().manual_seed(3)
    batch = len(valid_rows)
    qkv = [torch.randn(batch, seq_len, 2, 32, generator=generator).to(dtype) for _ in range(3)]
    valid = torch.zeros(batch, seq_len, dtype=torch.bool)
    for b, rows in enumerate(valid_rows):
        if isinstance(rows, int):
            valid[b, :rows] = True
        else:
            valid[b, rows] = True
    return qkv, valid


@pytest.mark.parametrize("valid_rows", [[40], [57, 44], [64, 64], [list(range(0, 64, 3)) + [63]]],
                         ids=["padded", "two-prompts", "all-valid", "scattered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_key_mask_attention_gives_the_pair_masks_bits_without_it(dtype, valid_rows):
    """The joint attention on the keys' mask broadcast over the queries, the wholly masked rows (padded text)
    attended apart on an all-False mask: the processor's attention on its L x L pair mask, bit for bit, whatever
    the valid tokens (a prefix per prompt, all, or scattered), with diffusers' own dispatcher."""
    from accelpatch.models.hunyuan_video15.lossless import KEY_MASK_ATTENTION, Attend, pair_masked_attention

    (query, key, value), valid = _qkv_and_valid(dtype, 64, valid_rows)
    attend = Attend(None)
    expected = pair_masked_attention(query, key, value, valid, attend)
    got = KEY_MASK_ATTENTION.alternative.run(query, key, value, valid, attend)
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride()
    assert torch.equal(got.view(BITS[dtype]), expected.view(BITS[dtype]))
    if not valid.all():  # the padded rows are there, as the backend gives a fully masked row
        assert torch.equal(got[~valid], expected[~valid])


def test_which_rows_are_padded_is_read_once_per_forward_not_once_per_block(monkeypatch):
    """Reading which joint-sequence rows are padded (``any`` and ``nonzero``: each a host sync on a GPU) happens once
    per forward, shared by the 2 blocks through the forward's captured masks, and the output stays diffusers' bit for
    bit; the op called on its own (no forward hook) still reads them itself. Counted on the real ``aten.nonzero``
    calls of a steady forward, two prompts of different padding in one batch: one per batch row."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from accelpatch.models.hunyuan_video15 import lossless

    class Nonzeros(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.nonzero.default:
                Nonzeros.calls += 1
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(1)
    model, inputs, _ = _model_and_inputs(torch.float32, "i2v-b2")
    inputs["encoder_attention_mask"] = inputs["encoder_attention_mask"].clone()
    inputs["encoder_attention_mask"][1, 3:] = 0
    reference = _forward(model, inputs)
    with Nonzeros():
        _forward(model, inputs)
    unpatched = Nonzeros.calls  # diffusers' own forward, whatever it reads
    reads = []
    original = lossless.padded_rows
    monkeypatch.setattr(lossless, "padded_rows", lambda valid: reads.append(valid) or original(valid))
    accelpatch.apply(model)
    assert bits_equal(_forward(model, inputs), reference)  # first sight: checked against the pair mask
    reads.clear()
    Nonzeros.calls = 0
    with Nonzeros():
        assert bits_equal(_forward(model, inputs), reference)
    assert len(reads) == 1, reads  # 2 blocks, one read
    assert Nonzeros.calls - unpatched == 2, (Nonzeros.calls, unpatched)  # a nonzero per batch row
    assert fusion_of(accelpatch.report(model), "key_mask_attention").fused_calls == 4
    accelpatch.remove(model)
    reads.clear()
    (query, key, value), valid = _qkv_and_valid(torch.float32, 64, [57, 44])
    lossless._KeyMaskRows().run(query, key, value, valid, lossless.Attend(None))
    assert len(reads) == 1  # no forward: read by the op itself


def test_the_patched_attention_holds_no_pair_mask_and_a_wrong_one_is_declined(monkeypatch):
    """At the default tier the joint attention's first sight checks the key-mask attention against the pair-masked
    one and then runs it, two prompts of different padding in one batch: the output is diffusers' bit for bit, and a
    steady call holds well under half of what the unpatched step holds (its L x L masks gone: 0.44x measured at this
    size). An alternative that is wrong by one element is declined on first sight, the output still diffusers'. At a
    tier that admits high it runs from the first call unchecked (counted)."""
    import dataclasses

    from accelpatch.memory.plan import TransformerCase, trace_step
    from accelpatch.models.hunyuan_video15 import lossless
    from accelpatch.testing.hunyuan_video15 import HUNYUAN_VIDEO15_SOL_CONFIG

    torch.set_num_threads(1)
    model, inputs, _ = _model_and_inputs(torch.float32, "i2v-b2")
    inputs["encoder_attention_mask"] = inputs["encoder_attention_mask"].clone()
    inputs["encoder_attention_mask"][1, 3:] = 0  # the second prompt shorter
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    for _ in range(2):
        assert bits_equal(_forward(model, inputs), reference)
    fusion = fusion_of(accelpatch.report(model), "key_mask_attention")
    assert fusion.fused_calls == 4 and len(fusion.verified) == 1 and not fusion.declined, fusion
    accelpatch.remove(model)

    class Wrong:
        def unsupported(self, *args):
            return None

        def run(self, *args):
            out = lossless._KeyMaskRows().run(*args)
            out[(0,) * out.dim()] += 1.0
            return out

    monkeypatch.setattr(lossless.KEY_MASK_ATTENTION, "alternative", Wrong())
    lossless.KEY_MASK_ATTENTION.forget()
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert bits_equal(_forward(model, inputs), reference)
    fusion = fusion_of(accelpatch.report(model), "key_mask_attention")
    assert fusion.fused_calls == 0 and len(fusion.declined) == 1, fusion
    assert any("key_mask_attention" in m for m in lossless_warnings(record))
    accelpatch.remove(model)
    monkeypatch.undo()
    lossless.KEY_MASK_ATTENTION.forget()
    accelpatch.apply(model)
    with accelpatch.quality("high"):  # no first-sight check at a tier that admits high: no pair mask at all
        assert bits_equal(_forward(model, inputs), reference)  # (this CPU's kernels give the same bits)
    fusion = fusion_of(accelpatch.report(model), "key_mask_attention")
    assert fusion.reference_calls.get(verify.UNVERIFIED) == 2 and not fusion.verified, fusion
    accelpatch.remove(model)

    case = TransformerCase("hunyuan_video15", HUNYUAN_VIDEO15_SOL_CONFIG, 4, 16, 32, 32, glyph_tokens=16,
                           image_tokens=16, dtype="bfloat16")
    unpatched = trace_step(case, fake=False)
    patched = trace_step(case, fake=False, warmup=True, apply_arguments={}, steps=(0,), total_steps=2)
    assert patched.activations < 0.5 * unpatched.activations, (patched, unpatched)
    assert _within(trace_step(case, apply_arguments={}, steps=(0,), total_steps=2).activations,
                   patched.activations)


