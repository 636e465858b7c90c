"""LTX-2's lossless fusions (accelpatch/models/ltx2/lossless.py: the block's AdaLN chains and gated residual adds, the
video self-attention's q/k RoPE as rope_pair_per_channel (interleaved) or rope_split_pair (split)): the default tier
is bit-identical to unpatched diffusers on both outputs (video and audio) in fp32 and bf16, batch 1 and 2, with the
text and self-attention masks, per-token timestep rows and LTX-2.3's layout (cross-attention AdaLN, gates, the STG
processor, its split RoPE; and the same layout with interleaved RoPE), with the real fused kernels running and
nothing declined; every call the fused attention leaves to diffusers is counted with its reason; a deliberately
wrong kernel is declined on first sight and never run again; ``remove()`` restores; with
``sol_attn`` the fusions sit below the attention sites and ``high`` runs them; the first-block step cache reuses
both streams over fused blocks; fullgraph compile equals the unpatched compiled model."""
import inspect
import types
import warnings

import pytest
import torch
from diffusers import FirstBlockCacheConfig

import _fused_doubles as doubles
from _model_fusion_checks import (bits_equal, fresh_verdicts, fusion_of,
                                  lossless_warnings, stand_in_kernels)  # noqa: F401 - fixtures
import accelpatch
import accelpatch.lossless.ops  # noqa: F401 - registers the ops verify.ops() lists
from accelpatch.lossless import verify
from accelpatch.models.ltx2 import lossless as ltx2_fused
from accelpatch.sol_attn.config import NOTHING_SKIPPED
from accelpatch.core.sites import NO_FUSED_OP, NO_FUSED_OP_COMPILED, SITE_ATTR
from accelpatch.testing import LTX2_3_TINY_CONFIG, ltx2_transformer_inputs, tiny_ltx2_transformer

from _step_cache_streams import COMPUTED, STEPS, all_bits_equal, apply_cache, reused_reference, run_steps

ROPE = "rope_pair_per_channel"
SPLIT = "rope_split_pair"
RoPES = (ROPE, SPLIT)
OPS = ("modulate", "gated_residual", ROPE, SPLIT)
#: the tiny models: LTX-2 (interleaved RoPE), LTX-2.3 as its tiny config has it (gates, prompt modulation, the STG
#: processor, split RoPE) and the same LTX-2.3 layout with interleaved RoPE, so that its gates and processor fuse
CONFIGS = {"ltx2": None, "ltx2.3": LTX2_3_TINY_CONFIG,
           "ltx2.3-interleaved": {**LTX2_3_TINY_CONFIG, "rope_type": "interleaved"}}
#: fused chains per block call, counted in diffusers' LTX2VideoTransformerBlock.forward: modulations (self-attention
#: x2 streams, a2v and v2a q/k x4, feed-forward x2; LTX-2.3 adds the text queries x2 and the prompt k/v x2), gated
#: residual adds (self-attention x2, a2v/v2a x2, feed-forward x2; LTX-2.3 adds the text cross-attention gates x2) and
#: the RoPE of the video self-attention's q and k (one call of the layout's RoPE op: interleaved or split)
PER_BLOCK = {"ltx2": {"modulate": 8, "gated_residual": 6, ROPE: 1, SPLIT: 0},
             "ltx2.3": {"modulate": 12, "gated_residual": 8, ROPE: 0, SPLIT: 1},
             "ltx2.3-interleaved": {"modulate": 12, "gated_residual": 8, ROPE: 1, SPLIT: 0}}
VIDEO_TOKENS = 2 * 8 * 8


def _inputs(model, batch=1, masks=False, self_mask=None, per_token=False):
    inputs = ltx2_transformer_inputs(model, batch_size=batch, num_frames=2, height=8, width=8)
    if masks:  # the last text tokens of the last sample masked out
        text = torch.ones(batch, inputs["encoder_hidden_states"].shape[1])
        text[-1, -3:] = 0
        inputs["encoder_attention_mask"], inputs["audio_encoder_attention_mask"] = text, text.clone()
    if masks if self_mask is None else self_mask:  # a video self-attention mask with a hole
        video = torch.ones(batch, VIDEO_TOKENS, VIDEO_TOKENS)
        video[-1, :, -5:] = 0
        inputs["video_self_attention_mask"] = video
    if per_token:  # one timestep per video token (image conditioning): temb [B, N, k*C], rows [B, N, C]
        inputs["audio_timestep"] = inputs["timestep"]
        inputs["timestep"] = torch.linspace(100.0, 900.0, VIDEO_TOKENS).repeat(batch, 1)
    return inputs


def _build(layout="ltx2", dtype=torch.bfloat16, **input_options):
    model = tiny_ltx2_transformer(CONFIGS[layout], dtype=dtype)
    inputs = _inputs(model, **input_options)
    return model, inputs, _forward(model, inputs)


def _attention_reason(layout, options):
    """Why the case's video self-attention runs diffusers' processor (None: it fuses)."""
    if options.get("masks") if options.get("self_mask") is None else options["self_mask"]:
        return ltx2_fused.MASKED
    return None


def _forward(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return out.sample, out.audio_sample


def _outputs(out):
    return out.sample, out.audio_sample


def _both_equal(outs, reference):
    return all(bits_equal(o, r) for o, r in zip(outs, reference, strict=True))


CASES = {"b1": ("ltx2", dict()), "b2-text-masks": ("ltx2", dict(batch=2, masks=True, self_mask=False)),
         "b2-masks": ("ltx2", dict(batch=2, masks=True)),
         "b2-per-token-rows": ("ltx2", dict(batch=2, per_token=True)),
         "ltx2.3-b1": ("ltx2.3", dict()), "ltx2.3-b2-masks": ("ltx2.3", dict(batch=2, masks=True)),
         "ltx2.3-interleaved-b1": ("ltx2.3-interleaved", dict()),
         "ltx2.3-interleaved-b2-text-masks": ("ltx2.3-interleaved", dict(batch=2, masks=True, self_mask=False))}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_tier_is_bit_identical_on_both_streams_with_the_real_kernels_fused(dtype, case):
    layout, options = CASES[case]
    model, inputs, reference = _build(layout, dtype, **options)
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")  # a declined signature would warn
        for _ in range(2):  # first sight, then the verified kernels
            assert _both_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    reason = _attention_reason(layout, options)
    assert [(s.kind, s.fast_calls) for s in report.sites] == [("ltx2_fused_block", 2),
                                                              ("ltx2_fused_attention", 0 if reason else 2),
                                                              ("fused_gelu", 2), ("fused_gelu", 2)] * 2
    attention = [s.reference_calls for s in report.sites if s.kind == "ltx2_fused_attention"]
    assert attention == [{reason: 2} if reason else {}] * 2, attention  # the declined calls, with their reason
    assert report.fallback_calls == {}
    name = str(dtype).removeprefix("torch.")
    batch = options.get("batch", 1)
    for op in ("modulate", "gated_residual"):
        fusion = fusion_of(report, op)
        # 2 forwards x 2 blocks, every chain fused, first sight included
        assert fusion.sites == 2 and fusion.fused_calls == 4 * PER_BLOCK[layout][op], fusion
        assert not fusion.declined and fusion.verified, fusion
        assert all(sig.split()[1].startswith(name) for sig, _ in fusion.verified)
        rows = {sig.split()[2].split("/")[0] for sig, _ in fusion.verified}  # the scale/gate rows' shapes
        video_rows = f"{name}[{batch},{VIDEO_TOKENS if options.get('per_token') else 1},256]"
        assert rows == {video_rows, f"{name}[{batch},1,64]"}, rows  # the audio timestep is one per sample
    # 2 forwards x 2 blocks of the layout's RoPE op: interleaved, q and k as [B, S, 1, C] views with float32
    # [B, S, 1, C] tables; split, q and k [B, S, C] with float32 [B, H, S, D/2] tables (2 heads of 128)
    used = SPLIT if PER_BLOCK[layout][SPLIT] else ROPE
    for op in RoPES:
        rope = fusion_of(report, op)
        assert rope.sites == 2 and not rope.declined, rope
        if reason or op != used:
            assert rope.fused_calls == 0 and not rope.verified and not rope.reference_calls, rope
            continue
        assert rope.fused_calls == 4 and len(rope.verified) == 1, rope
        fields = rope.verified[0][0].split()
        x, table = ((f"[{batch},{VIDEO_TOKENS},256]", f"[{batch},2,{VIDEO_TOKENS},64]") if op == SPLIT
                    else (f"[{batch},{VIDEO_TOKENS},1,256]", f"[{batch},{VIDEO_TOKENS},1,256]"))
        assert fields[1].startswith(f"{name}{x}/"), fields  # to_q's output (a view of it)
        assert fields[3].startswith(f"float32{table}/"), fields
    accelpatch.remove(model)
    assert not any(SITE_ATTR in m.__dict__ for m in model.modules())
    assert type(model.transformer_blocks[0]).__name__ == "LTX2VideoTransformerBlock"
    assert _both_equal(_forward(model, inputs), reference)


@pytest.mark.parametrize("op,layout", [(op, "ltx2") for op in OPS[:3]] + [(SPLIT, "ltx2.3")])
def test_a_wrong_kernel_is_declined_on_first_sight_for_good(stand_in_kernels, op, layout):
    doubles.WRONG.add(op)
    model, inputs, reference = _build(layout)
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _forward(model, inputs)
        calls_after_first = doubles.CALLS[op]
        second = _forward(model, inputs)
    assert _both_equal(first, reference) and _both_equal(second, reference)
    assert doubles.CALLS[op] == calls_after_first  # the declined signatures never run the kernel again
    report = accelpatch.report(model)
    fusion = fusion_of(report, op)
    assert fusion.fused_calls == 0 and fusion.declined and not fusion.verified
    assert all("differs from the reference in 1 of" in reason for _, reason, _ in fusion.declined)
    messages = lossless_warnings(record)  # once per reason (they name the element count: one per shape)
    # the block's chains: a video and an audio shape at least; the RoPE: the video self-attention's one signature
    assert len(messages) == len({reason for _, reason, _ in fusion.declined}), messages
    assert len(messages) == 1 if op in RoPES else len(messages) > 1, messages
    assert all(op in m and "largest difference " in m for m in messages), "\n".join(messages)
    assert sum(n for r, n in fusion.reference_calls.items() if r.startswith("declined: ")) == 4 * PER_BLOCK[layout][op]
    for other in set(OPS) - {op}:  # the right ops still run fused
        assert fusion_of(report, other).fused_calls == 4 * PER_BLOCK[layout][other]
        assert not fusion_of(report, other).declined
    attention = [(s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_fused_attention"]
    # the restated attention ran; its only fused op is the RoPE: when that declined, the call did nothing fast
    assert attention == ([(0, {NO_FUSED_OP: 2})] if op in RoPES else [(2, {})]) * 2
    accelpatch.remove(model)


def _dense_sol_kernel(q, k, v, **kwargs):
    """A stand-in for the Sol-Attn op: dense SDPA as diffusers' native dispatch runs it, so a high run that takes
    the sparse path at every video self-attention must still give the unpatched bits."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out, types.SimpleNamespace(exact_pairs=torch.ones(1), total_pairs=1)


@pytest.mark.parametrize("layout", list(CONFIGS))
def test_with_sol_attn_the_fusions_sit_below_and_high_runs_them(layout, monkeypatch):
    import accelpatch.sol_attn.op as ops

    model = tiny_ltx2_transformer(CONFIGS[layout])
    inputs = ltx2_transformer_inputs(model)  # 1,024 video tokens: 16 blocks, so that some are skipped
    reference = _forward(model, inputs)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
    kinds = [s.kind for s in accelpatch.report(model).sites]
    assert kinds.count("ltx2_fused_block") == 2 and kinds.count("ltx2_sol_attn") == 2
    assert kinds.count("ltx2_fused_attention") == 2  # below the Sol-Attn sites on the same modules
    assert kinds.count("ltx2_dense_attention") == 10
    with accelpatch.quality("lossless"):
        assert _both_equal(_forward(model, inputs), reference)
    for op in OPS:
        assert fusion_of(accelpatch.report(model), op).fused_calls == 2 * PER_BLOCK[layout][op]
    fused = 1  # every layout's RoPE fuses (interleaved or split)
    attention = [(s.fast_calls, s.reference_calls) for s in accelpatch.report(model).sites
                 if s.kind == "ltx2_fused_attention"]
    assert attention == [(fused, {})] * 2, attention
    sparse = _forward(model, inputs)  # the default tier is high with a backend
    assert not torch.equal(sparse[0], reference[0]) and not torch.equal(sparse[1], reference[1])
    with monkeypatch.context() as patched:
        patched.setattr(ops, "sol_attn", _dense_sol_kernel)
        assert _both_equal(_forward(model, inputs), reference)  # sparse path inside the fused block: exact bits
    report = accelpatch.report(model)
    # the real op skipped blocks once; the dense stand-in says it skipped nothing, which is not a fast call
    assert [(s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_sol_attn"] == \
        [(1, {"tier lossless does not admit high": 1, NOTHING_SKIPPED: 1})] * 2
    assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_block"] == [3, 3]
    # under high the sparse path took every attn1 call (its own q/k/v): the RoPE fusion ran only under lossless
    assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_attention"] == [fused, fused]
    for op in OPS:
        runs = 2 if op in RoPES else 6
        assert fusion_of(report, op).fused_calls == runs * PER_BLOCK[layout][op] and not fusion_of(report, op).declined
    assert report.fallback_calls == {}
    accelpatch.remove(model)
    assert _both_equal(_forward(model, inputs), reference)


def test_the_first_block_step_cache_reuses_both_streams_over_fused_blocks():
    model, inputs, _ = _build(dtype=torch.float32)
    plain = run_steps(model, inputs, _outputs)
    expected = reused_reference(model, inputs, _outputs, "audio_hidden_states")  # unpatched, independent of the cache
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            cached = run_steps(model, inputs, _outputs)
        report = accelpatch.report(model)
        assert (report.models[0].cache["computed"], report.models[0].cache["reused"]) == (2, 3)
        # every step runs the head block, the computed ones the tail block too
        block_calls = STEPS + len(COMPUTED)
        assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_block"] == [STEPS, len(COMPUTED)]
        for op in OPS:
            assert fusion_of(report, op).fused_calls == block_calls * PER_BLOCK["ltx2"][op]
    finally:
        accelpatch.remove(model)
    assert all_bits_equal(cached, expected)
    assert not all_bits_equal(cached, plain)  # the reused steps did reuse
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=0)
    try:  # the default tier (lossless): nothing reused, the fused blocks give the unpatched bits
        assert all_bits_equal(run_steps(model, inputs, _outputs), plain)
        assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 2 * STEPS * PER_BLOCK["ltx2"]["modulate"]
    finally:
        accelpatch.remove(model)


@pytest.mark.parametrize("self_mask", [False, True], ids=["text-masks", "all-masks"])
def test_fullgraph_compile_of_the_patched_model_equals_the_unpatched_compiled_one(self_mask):
    """With text masks only the video self-attention fuses inside the graph; with its mask too it runs the
    processor, counted with its reason inside the graph as well."""
    model = tiny_ltx2_transformer(dtype=torch.bfloat16, num_layers=1)  # one block: half the tracing
    inputs = _inputs(model, batch=2, masks=True, self_mask=self_mask)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled_reference = _outputs(torch.compile(model, backend="eager", fullgraph=True)(**inputs))
        torch._dynamo.reset()
        accelpatch.apply(model)
        with torch.no_grad():
            compiled = _outputs(torch.compile(model, backend="eager", fullgraph=True)(**inputs))
    finally:
        torch._dynamo.reset()
    assert _both_equal(compiled, compiled_reference)
    report = accelpatch.report(model)
    # the restated paths ran in the graph, their fused ops standing aside: counted so, not as fast calls
    block = [(s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_fused_block"]
    assert block == [(0, {NO_FUSED_OP_COMPILED: 1})], block
    attention = [(s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_fused_attention"]
    assert attention == [(0, {ltx2_fused.MASKED: 1} if self_mask else {NO_FUSED_OP_COMPILED: 1})], attention
    for op in OPS:  # inside the compiled graph the reference chains run (the compiler fuses them itself)
        fusion = fusion_of(report, op)
        calls = 0 if op == ROPE and self_mask else PER_BLOCK["ltx2"][op]
        assert fusion.fused_calls == 0 and fusion.reference_calls == ({verify.IN_COMPILE: calls} if calls else {})
    accelpatch.remove(model)


def test_a_block_class_that_is_not_diffusers_leaves_the_fusion_unmounted_with_its_reason():
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    class CustomBlock(LTX2VideoTransformerBlock):  # a forward of its own: the restatement would not be its chain
        pass

    model, inputs, reference = _build()
    model.transformer_blocks[1].__class__ = CustomBlock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply() says which site did not mount
        accelpatch.apply(model)
    assert _both_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)  # one rejected block keeps the fusion off the whole model
    sites = [s for s in report.sites if s.kind == "ltx2_fused_block"]
    assert [(s.mounted, s.fast_calls) for s in sites] == [(False, 0), (False, 0)]
    assert all("CustomBlock is not diffusers' LTX2VideoTransformerBlock" in s.reason for s in sites), sites
    attention = [(s.mounted, s.fast_calls) for s in report.sites if s.kind == "ltx2_fused_attention"]
    assert attention == [(True, 1), (True, 1)]  # the attentions are diffusers': their RoPE still fuses
    assert fusion_of(report, ROPE).fused_calls == 2
    accelpatch.remove(model)
    assert type(model.transformer_blocks[1]) is CustomBlock


def test_a_changed_block_signature_is_refused_with_what_differed():
    from accelpatch.models.ltx2 import lossless as fused
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    assert fused.signature_mismatch(LTX2VideoTransformerBlock) is None

    class Renamed:
        def forward(self, hidden_states, audio_hidden_states, new_argument=None):
            pass

    reason = fused.signature_mismatch(Renamed)
    assert reason.startswith("its forward takes (hidden_states, audio_hidden_states, new_argument)"), reason

    class OtherDefault:
        pass

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False if n.startswith("use_") else None)
        for n in fused.CALL_NAMES]
    OtherDefault.forward = lambda self, *args: None
    OtherDefault.forward.__signature__ = inspect.Signature(params)
    reason = fused.signature_mismatch(OtherDefault)
    assert reason.startswith("its forward's defaults are {'use_a2v_cross_attention': False"), reason


# ---- the fused video self-attention on its own ------------------------------------------------------------------

def _attention_calls(attn, dtype, table_dtype):
    """Calls of one ``attn1`` (batch 2, 16 tokens): the self-attention the blocks make, on random [B, S, C] tables
    whose channel pairs differ (the model's repeat each angle), and the calls the fused attention leaves to
    diffusers, each with its reason."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 16, attn.query_dim, generator=g).to(dtype)
    tables = tuple(torch.randn(2, 16, attn.inner_dim, generator=g).to(table_dtype) for _ in range(2))
    others = tuple(torch.randn(2, 16, attn.inner_dim, generator=g).to(table_dtype) for _ in range(2))
    mask = torch.zeros(2, 16, 16, dtype=dtype)
    mask[-1, :, -3:] = -10000.0
    plain = dict(hidden_states=hidden, query_rotary_emb=tables)
    text = torch.randn(2, 16, attn.query_dim, generator=g).to(dtype)
    return {
        None: plain,
        "positional": None,  # the plain call, its arguments positional (_call)
        ltx2_fused.NOT_SELF: dict(plain, encoder_hidden_states=text),
        ltx2_fused.MASKED: dict(plain, attention_mask=mask),
        ltx2_fused.NO_ROPE: dict(hidden_states=hidden),
        ltx2_fused.NOT_TABLES: dict(plain, key_rotary_emb=others),
        ltx2_fused.UNUSUAL: dict(plain, perturbation_mask=None),  # LTX2AudioVideoAttnProcessor takes none
    }


def _call(attn, call, positional_of):
    with torch.no_grad():
        if call is None:
            return attn(positional_of["hidden_states"], None, None, positional_of["query_rotary_emb"])
        return attn(**call)


@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16)], ids=["fp32", "bf16", "bf16-tables"])
def test_the_fused_attention_is_the_processor_and_counts_every_call_it_leaves(dtype, table_dtype):
    model = tiny_ltx2_transformer(dtype=dtype)
    attn = model.transformer_blocks[0].attn1
    calls = _attention_calls(attn, dtype, table_dtype)
    expected = {reason: _call(attn, call, calls[None]) for reason, call in calls.items()}
    accelpatch.apply(model)
    got = {reason: _call(attn, call, calls[None]) for reason, call in calls.items()}
    differ = [r for r in calls if not bits_equal(got[r], expected[r])]
    assert not differ, differ
    site = next(s for s in accelpatch.report(model).sites if s.path == "transformer_blocks.0.attn1")
    left = {r: 1 for r in calls if r not in (None, "positional")}
    assert (site.fast_calls, site.reference_calls) == (2, left), site
    rope = fusion_of(accelpatch.report(model), ROPE)
    assert rope.fused_calls == 2 and not rope.declined, rope  # the plain call's first sight, then verified

    class OtherProcessor(type(attn.processor)):  # set after apply: never bypassed
        pass

    attn.set_processor(OtherProcessor())
    assert bits_equal(_call(attn, calls[None], calls[None]), expected[None])
    site = next(s for s in accelpatch.report(model).sites if s.path == "transformer_blocks.0.attn1")
    assert site.reference_calls[ltx2_fused.SWAPPED] == 1 and site.fast_calls == 2
    accelpatch.remove(model)


@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16)], ids=["fp32", "bf16", "bf16-tables"])
def test_the_fused_split_attention_is_the_processor_and_counts_every_call_it_leaves(dtype, table_dtype):
    """LTX-2.3's attn1 (split RoPE, per-head gates, the STG processor) on batch 2 x 16 tokens: [B, H, T, D/2] tables
    (swapaxes views, as LTX-2.3's rotary embedding builds them; keyword and positional calls) and [B, T, C/2] ones
    fuse, bit for bit; the calls it leaves are diffusers', each counted with its reason. By hand: 3 fused calls of
    rope_split_pair, 2 signatures (the 4-D and the 3-D tables), 5 calls left."""
    model = tiny_ltx2_transformer(LTX2_3_TINY_CONFIG, dtype=dtype)
    attn = model.transformer_blocks[0].attn1
    assert attn.rope_type == "split" and attn.to_gate_logits is not None
    calls = _attention_calls(attn, dtype, table_dtype)
    g = torch.Generator().manual_seed(4)
    split = tuple(torch.randn(2, 16, attn.heads, 64, generator=g).to(table_dtype).transpose(1, 2) for _ in range(2))
    whole = tuple(torch.randn(2, 16, attn.inner_dim // 2, generator=g).to(table_dtype) for _ in range(2))
    plain = dict(calls[None], query_rotary_emb=split)
    calls = {None: plain, "positional": None, "whole-C tables": dict(plain, query_rotary_emb=whole),
             ltx2_fused.NOT_SELF: dict(calls[ltx2_fused.NOT_SELF], query_rotary_emb=split),
             ltx2_fused.MASKED: dict(calls[ltx2_fused.MASKED], query_rotary_emb=split),
             ltx2_fused.NO_ROPE: calls[ltx2_fused.NO_ROPE],
             ltx2_fused.SPLIT_TABLES: dict(plain, key_rotary_emb=tuple(t.flip(2) for t in split)),
             ltx2_fused.PERTURBED: dict(plain, perturbation_mask=torch.tensor([1.0, 0.0]).to(dtype)[:, None, None])}
    expected = {reason: _call(attn, call, calls[None]) for reason, call in calls.items()}
    accelpatch.apply(model)
    got = {reason: _call(attn, call, calls[None]) for reason, call in calls.items()}
    differ = [r for r in calls if not torch.equal(got[r], expected[r])]
    assert not differ, differ
    site = next(s for s in accelpatch.report(model).sites if s.path == "transformer_blocks.0.attn1")
    left = {r: 1 for r in calls if r not in (None, "positional", "whole-C tables")}
    assert (site.fast_calls, site.reference_calls) == (3, left), site
    rope = fusion_of(accelpatch.report(model), SPLIT)
    assert rope.fused_calls == 3 and len(rope.verified) == 2 and not rope.declined, rope
    assert fusion_of(accelpatch.report(model), ROPE).fused_calls == 0
    accelpatch.remove(model)


def test_ltx2_3s_gates_and_stg_processor_fuse_outside_the_guided_blocks():
    """LTX-2.3's layout with interleaved RoPE under STG guidance on block 0 (batch 2, the first sample perturbed):
    block 0's video self-attention gets the perturbation mask and runs the processor, counted; block 1's fuses,
    through LTX2PerturbedAttnProcessor's gated path; both outputs keep diffusers' bits."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2PerturbedAttnProcessor

    model, inputs, _ = _build("ltx2.3-interleaved", torch.float32, batch=2)
    assert type(model.transformer_blocks[1].attn1.processor) is LTX2PerturbedAttnProcessor
    assert model.transformer_blocks[1].attn1.to_gate_logits is not None
    inputs.update(spatio_temporal_guidance_blocks=[0], perturbation_mask=torch.tensor([0.0, 1.0]))
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    assert _both_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    attention = [(s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_fused_attention"]
    assert attention == [(0, {ltx2_fused.PERTURBED: 1}), (1, {})], attention
    assert fusion_of(report, ROPE).fused_calls == 1 and report.fallback_calls == {}
    accelpatch.remove(model)
    assert _both_equal(_forward(model, inputs), reference)


def test_another_processor_or_attention_class_leaves_the_fused_attention_unmounted():
    from diffusers.models.transformers.transformer_ltx2 import LTX2Attention, LTX2AudioVideoAttnProcessor

    class OtherProcessor(LTX2AudioVideoAttnProcessor):
        pass

    class CustomAttention(LTX2Attention):
        pass

    for name, change in (("OtherProcessor", lambda a: a.set_processor(OtherProcessor())),
                         ("CustomAttention is not diffusers' LTX2Attention",
                          lambda a: setattr(a, "__class__", CustomAttention))):
        model, inputs, reference = _build()
        change(model.transformer_blocks[1].attn1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # apply() says which site did not mount
            accelpatch.apply(model)
        assert _both_equal(_forward(model, inputs), reference)
        report = accelpatch.report(model)
        attention = [s for s in report.sites if s.kind == "ltx2_fused_attention"]
        assert [(s.mounted, s.fast_calls) for s in attention] == [(False, 0), (False, 0)]
        assert all(name in s.reason for s in attention), [s.reason for s in attention]
        assert [(s.mounted, s.fast_calls) for s in report.sites if s.kind == "ltx2_fused_block"] == [(True, 1)] * 2
        accelpatch.remove(model)
