"""The memory planner (issue #44): a transformer step planned on fake tensors holds the bytes its real run holds
(every family, tiny and medium, unpatched and patched), a full-size plan of Wan 2.1 1.3B has the weights and the
activations its shapes imply, budgets parse or say why not, and ``python -m accelpatch memory`` prints the table."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from accelpatch.lossless.kernels.cpu import unavailable as cpu_kernels_unavailable
from accelpatch.memory.plan import TransformerCase, family_of, memory_plan, release_config, trace_step
from accelpatch.memory.sizes import parse_size
from accelpatch.recipes import available_recipes, load_recipe
from accelpatch.testing import hunyuan_video15, ltx2, minimax_h3, sana_video, sana_video2, wan

GIB = 2 ** 30

#: (case, the tiny recipe whose setting patches it) per family and size: medium has 2-4x the tokens, the text or the
#: width of tiny (the medium configs where accelpatch.testing has one), kept to seconds of real CPU forwards
CASES = {
    ("wan", "tiny"): (TransformerCase("wan", wan.WAN_SOL_CONFIG, 4, 32, 32, 8, dtype="float32"), "tiny-wan-sol-attn"),
    ("wan", "medium"): (TransformerCase("wan", wan.WAN_SOL_CONFIG, 4, 64, 64, 32, dtype="float32"),
                        "tiny-wan-sol-attn"),
    ("sana_video", "tiny"): (TransformerCase("sana_video", sana_video.SANA_VIDEO_RELEASE_LIKE_CONFIG, 3, 16, 16, 6,
                                             batch=2, dtype="float32"), "tiny-sana-video"),
    ("sana_video", "medium"): (TransformerCase("sana_video", sana_video.SANA_VIDEO_MEDIUM_CONFIG, 3, 16, 16, 16,
                                               batch=2, dtype="float32"), "tiny-sana-video"),
    ("sana_video2", "tiny"): (TransformerCase("sana_video2", sana_video2.SANA_VIDEO2_TINY_CONFIG, 3, 8, 8, 8, batch=2,
                                              dtype="float32"), "tiny-sana-video2"),
    ("sana_video2", "medium"): (TransformerCase("sana_video2", sana_video2.SANA_VIDEO2_MEDIUM_CONFIG, 2, 8, 16, 16,
                                                batch=2, dtype="float32"), "tiny-sana-video2"),
    ("minimax_h3", "tiny"): (TransformerCase("minimax_h3", minimax_h3.MINIMAX_H3_SOL_CONFIG, 3, 16, 16, 6, audio=8,
                                             dtype="float32"), "tiny-minimax-h3-sol-attn"),
    ("minimax_h3", "medium"): (TransformerCase("minimax_h3", minimax_h3.MINIMAX_H3_MEDIUM_CONFIG, 2, 32, 64, 32,
                                               audio=64, dtype="float32"), "tiny-minimax-h3-sol-attn"),
    ("hunyuan_video15", "tiny"): (TransformerCase("hunyuan_video15", hunyuan_video15.HUNYUAN_VIDEO15_SOL_CONFIG, 4,
                                                  16, 16, 8, glyph_tokens=4, image_tokens=4, dtype="float32"),
                                  "tiny-hunyuan-video15-sol-attn"),
    ("hunyuan_video15", "medium"): (TransformerCase("hunyuan_video15", hunyuan_video15.HUNYUAN_VIDEO15_SOL_CONFIG, 4,
                                                    16, 32, 32, glyph_tokens=16, image_tokens=16, dtype="float32"),
                                    "tiny-hunyuan-video15-sol-attn"),
    ("ltx2", "tiny"): (TransformerCase("ltx2", ltx2.LTX2_TINY_CONFIG, 4, 16, 16, 8, audio=32, dtype="float32"),
                       "tiny-ltx2-sol-attn"),
    ("ltx2", "medium"): (TransformerCase("ltx2", ltx2.LTX2_TINY_CONFIG, 4, 16, 32, 32, audio=128, dtype="float32"),
                         "tiny-ltx2-sol-attn"),
}


def _within(planned: int, measured: int, share: float = 0.10) -> bool:
    return abs(planned - measured) <= share * measured


@pytest.mark.parametrize("family,size", sorted(CASES))
def test_a_planned_step_holds_what_its_real_run_holds_unpatched(family, size):
    """The plan's transformer step (fake tensors) against LiveBytes on a real CPU forward of the same model and
    inputs: within 10 % (issue #44; in practice equal to the byte)."""
    torch.set_num_threads(1)
    case, _ = CASES[family, size]
    planned, measured = trace_step(case), trace_step(case, fake=False)
    assert measured.activations > 200_000, measured  # the forward's activations, not nothing
    assert planned.weights == measured.weights
    assert _within(planned.activations, measured.activations), (planned, measured)


@pytest.mark.parametrize("family,size", sorted(CASES))
def test_a_planned_patched_step_holds_what_its_real_run_holds(family, size):
    """Patched with the family's tiny recipe setting (Sol-Attn on every layer and step where it has one): on fake
    tensors each lossless fused op the CPU kernels would run allocates its outputs only, as its kernel does, so the
    plan is within 10 % of the real run with the kernels on (in practice equal to the byte), both a process's first
    call (each fused op checked against its chain, holding both results) and the steady calls after it; with the
    kernels off, of the real run of the eager chains."""
    torch.set_num_threads(1)
    case, recipe = CASES[family, size]
    arguments = dict(load_recipe(recipe).apply_arguments())
    run = dict(apply_arguments=arguments, steps=(0,), total_steps=2)
    _forget_verdicts()
    planned = trace_step(case, **run)
    fused = trace_step(case, fake=False, warmup=True, **run)
    off = {**run, "apply_arguments": {**arguments, "cpu_kernels": False}}
    planned_off, eager = trace_step(case, **off), trace_step(case, fake=False, warmup=True, **off)
    assert _within(planned.activations, fused.activations), (planned, fused)
    assert _within(planned.first_activations, fused.first_activations), (planned, fused)
    assert _within(planned_off.activations, eager.activations), (planned_off, eager)


def _forget_verdicts():
    """A fresh process's first sights: the real run's first call checks every fused op again."""
    from accelpatch.lossless.verify import composed_ops, ops
    from accelpatch.low_memory.chunked import CHUNKED

    assert CHUNKED in composed_ops().values()
    for op in (*ops().values(), *composed_ops().values()):
        op.forget()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("family,size", sorted(CASES))
def test_the_default_tier_holds_no_more_than_diffusers(family, size, dtype):
    """Issue #44 part 2: apply()'s default tier (lossless: bit-exact fused ops, restated forwards that drop their
    intermediates when dead) holds no more live bytes than the unpatched model in the steady calls of a real CPU
    run, and the plan on fake tensors says the same; so does a process's first call: each fused op's first sight
    hashes the reference's results and frees them before its kernel runs (SANA-Video's held both and went over), a
    pair op's one at a time (Wan's and MiniMax-H3's float32 RoPE held the query's while rotating the key), and the
    bf16 tables the kernels keep are built at apply() (MiniMax-H3's and SANA-Video 2.0's first calls built them)."""
    torch.set_num_threads(1)
    case = dataclasses.replace(CASES[family, size][0], dtype=dtype)
    run = dict(apply_arguments={}, steps=(0,), total_steps=2)
    unpatched = trace_step(case, fake=False)
    _forget_verdicts()
    patched = trace_step(case, fake=False, warmup=True, **run)
    planned = trace_step(case, **run)
    plain = trace_step(case).activations
    assert patched.report and "lossless" in patched.report
    assert patched.activations <= unpatched.activations, (patched, unpatched)
    assert planned.activations <= plain, (planned, plain)
    assert patched.first_activations <= unpatched.activations, (patched, unpatched)
    assert planned.first_activations <= plain, (planned, plain)


@pytest.mark.skipif(cpu_kernels_unavailable() is not None, reason=f"CPU kernels: {cpu_kernels_unavailable()}")
def test_apply_builds_the_tables_the_kernels_keep_so_a_first_call_does_not(monkeypatch):
    """MiniMax-H3 at medium size in bf16, in a process that has no bf16 lookup table yet: apply() builds the SiLU
    table its glu_gate kernel keeps (and its int32 widening), so the first call allocates none and holds no more
    than diffusers' (it held 384 KiB more); with ``cpu_kernels=False``, or for a float32 model, nothing is built."""
    from accelpatch.lossless.kernels import cpu, tables

    def fresh_process():
        for module, name in ((tables, "_TABLES"), (cpu, "_WIDE"), (cpu, "_PREPARED")):
            monkeypatch.setattr(module, name, {})
        _forget_verdicts()

    torch.set_num_threads(1)
    case = dataclasses.replace(CASES["minimax_h3", "medium"][0], dtype="bfloat16")
    unpatched = trace_step(case, fake=False)
    run = dict(steps=(0,), total_steps=2)
    fresh_process()
    trace_step(case, fake=False, apply_arguments={"cpu_kernels": False}, **run)
    trace_step(dataclasses.replace(case, dtype="float32"), fake=False, apply_arguments={}, **run)
    assert not tables._TABLES and not cpu._WIDE
    fresh_process()
    patched = trace_step(case, fake=False, warmup=True, apply_arguments={}, **run)
    assert "silu" in cpu._WIDE and [key for key in tables._TABLES if key[0] == "silu"]
    assert patched.first_activations <= unpatched.activations, (patched, unpatched)


#: the families whose site tables chunk under memory="low", and those among them where it must save (the others'
#: medium step peaks where no chunk reaches: HunyuanVideo 1.5's L x L mask)
LOW_MEMORY = ("hunyuan_video15", "ltx2", "minimax_h3", "sana_video", "wan")
LOW_MEMORY_SAVES = ("ltx2", "minimax_h3", "sana_video", "wan")


@pytest.mark.parametrize("family", LOW_MEMORY)
def test_memory_low_is_planned_as_it_runs_and_holds_less_than_the_default_tier(family):
    """Issue #44 part 3: ``apply(..., memory="low")`` at medium size in bf16 (chunks of 256 tokens): the plan on
    fake tensors holds what the real CPU run holds (within 10 %; in practice to the byte), the first call (each
    chunked computation checked against the whole one, a chunk at a time) and the steady calls; the steady calls
    hold less than the default tier's, the first call no more than the default tier's first call."""
    torch.set_num_threads(1)
    case = dataclasses.replace(CASES[family, "medium"][0], dtype="bfloat16")
    low = dict(apply_arguments={"memory": "low", "memory_chunk_tokens": 256}, steps=(0,), total_steps=2)
    default = dict(apply_arguments={}, steps=(0,), total_steps=2)
    from accelpatch.low_memory.chunked import CHUNKED

    _forget_verdicts()
    real_default = trace_step(case, fake=False, warmup=True, **default)  # first: it builds the SiLU tables
    _forget_verdicts()
    real = trace_step(case, fake=False, warmup=True, **low)
    planned = trace_step(case, **low)  # after the real run: shapes it declined (another CPU's kernels) plan whole
    verdicts = CHUNKED.verdicts()
    assert "chunked_tokens" in real.report
    assert _within(planned.activations, real.activations), (planned, real)
    assert _within(planned.first_activations, real.first_activations), (planned, real)
    assert real.first_activations <= real_default.first_activations, (real, real_default)
    assert real.activations <= real_default.activations, (real, real_default)
    declined = [v.described for v in verdicts if not v.verified]
    if family in LOW_MEMORY_SAVES and not declined:  # where this CPU's kernels chunk bit-exactly
        assert real.activations < 0.97 * real_default.activations, (real, real_default)


@pytest.fixture(scope="module")
def wan_1_3b_plan():
    return memory_plan("wan2.1-t2v-1.3b-sol-attn", budget="24GiB")


def test_a_full_size_wan_plan_has_the_weights_and_activations_its_shapes_imply(wan_1_3b_plan):
    """Wan 2.1 T2V 1.3B at 480 x 832 x 81 (21 x 30 x 52 = 32,760 tokens), bf16: 2 bytes per parameter (the few
    modules diffusers keeps in float32 add well under 1 %), and a peak of at least the feed-forward's hidden state
    before and after GELU (tokens x 8,960 each); CFG runs as two forwards, so the batch is 1."""
    from accelpatch.testing.wan import WAN_1_3B_CONFIG, wan_transformer_on_meta

    plan = wan_1_3b_plan
    parameters = sum(p.numel() for p in wan_transformer_on_meta(WAN_1_3B_CONFIG).parameters())
    text, unpatched, vae = plan.stages
    assert abs(unpatched.weights - 2 * parameters) <= 0.01 * 2 * parameters, (unpatched.weights, parameters)
    tokens = 21 * 30 * 52
    assert 2 * tokens * 8960 * 2 <= unpatched.activations < 2 * GIB, unpatched.activations / GIB
    assert plan.patched.weights == unpatched.weights and plan.patched.activations >= 2 * tokens * 8960 * 2
    assert plan.details["latents"] == (21, 60, 104) and plan.details["transformer_batch"] == 1
    assert text.planned and "UMT5-XXL encoder" in text.note
    assert vae.planned and vae.activations > 2 * 81 * 480 * 832 * 3  # at least the decoded video in bf16
    value, complete = plan.peak(offload=False)
    assert complete and value == text.weights + unpatched.weights + vae.weights + max(
        text.activations, plan.patched.activations, vae.activations)
    # every stage planned, so the verdicts are yes or no: UMT5-XXL's 10.6 GiB beside the rest fit 24 GiB, not 16,
    # where model offload (the largest stage alone) fits
    assert plan.fits() is True and plan.fits("16GiB") is False and plan.fits("16GiB", offload=True) is True
    assert plan.fits("3GiB") is False and plan.fits("3GiB", offload=True) is False
    assert plan.fits("8GiB", text_on_cpu=True) is True  # without the text encoder on the device


def test_a_model_without_a_known_release_configuration_is_named_not_zero():
    """Wan 2.1 FLF2V 14B (two images' CLIP tokens with positions for them): no configuration here."""
    recipe = dict(name="wan21-flf2v", description="Wan 2.1 FLF2V 14B", model="Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers",
                  pipeline="diffusion", dtype="bf16", call=dict(prompt="a cat", height=96, width=160, num_frames=5))
    plan = memory_plan(recipe, patched=False)
    transformer = next(stage for stage in plan.stages if stage.name.startswith("transformer"))
    assert not transformer.planned and "Wan2.1-FLF2V-14B" in transformer.note
    assert transformer.total is None and plan.peak()[1] is False and plan.fits("1TiB") is None
    assert "not planned yet" in plan.table()


def test_a_batch_of_videos_plans_vae_slicing_as_a_way_down():
    """Two videos per prompt: where the call misses its budget the plan traces the decode one video at a time
    (``vae.enable_slicing()``), about one video's decode plus the decoded ones, offers it as a move, and swaps it
    in on request; one video per prompt has nothing to slice; slicing and tiles are planned one at a time."""
    size = dict(height=272, width=480, frames=9, patched=False, budget="1GiB")
    two = memory_plan("wan2.1-t2v-1.3b-sol-attn", batch=2, **size)
    one = memory_plan("wan2.1-t2v-1.3b-sol-attn", batch=1, **size)
    decode, sliced = two.stages[-1], two.details["vae_sliced"]
    assert "vae_sliced" not in one.details and "one video at a time" in sliced.note
    video = 3 * 9 * 272 * 480 * 2
    assert sliced.weights == decode.weights
    assert one.stages[-1].activations < sliced.activations <= one.stages[-1].activations + 2 * video, sliced
    assert sliced.activations < decode.activations
    assert [s.name for s in two.stage_list(patched=False, vae_sliced=True)] == [s.name for s in two.stages]
    assert two.stage_list(patched=False, vae_sliced=True)[-1] == sliced
    assert "vae.enable_slicing()" in [move.short for move in two.moves()]
    with pytest.raises(ValueError, match="one at a time"):
        two.stage_list(patched=False, vae_sliced=True, vae_tiled=True)
    with pytest.raises(ValueError, match="no sliced VAE decode"):
        one.stage_list(vae_sliced=True)


def _wan22(kind, **size):
    recipe = dict(name=f"wan22-{kind}", description=f"Wan 2.2 {kind.upper()} A14B", pipeline="diffusion",
                  model=f"Wan-AI/Wan2.2-{kind.upper()}-A14B-Diffusers", dtype="bf16",
                  call=dict(prompt="a cat", guidance_scale=3.5, num_inference_steps=40, **size))
    return memory_plan(recipe, patched=False, budget="1GiB")


def test_wan22_i2v_a14b_plans_its_36_channel_experts_and_the_vae_encode_of_its_conditioning_video():
    """WanImageToVideoPipeline VAE-encodes a video of every frame (the image, then zeros) before denoising, and
    its experts read 36 latent channels: the plan has a VAE encode stage (the VAE's weights counted once with every
    component on the device, with it alone under offload; tiled where the budget plans tiles) and a step over the
    wider latents; text-to-video has no encode stage."""
    size = dict(height=272, width=480, num_frames=9)
    i2v, t2v = _wan22("i2v", **size), _wan22("t2v", **size)
    names = [stage.name for stage in i2v.stages]
    assert names[:3] == ["text encoder", "VAE encode", "transformer step, unpatched"], names
    assert "VAE encode" not in [stage.name for stage in t2v.stages]
    encode, step, decode = (next(s for s in i2v.stages if s.name == name)
                            for name in ("VAE encode", "transformer step, unpatched", "VAE decode"))
    t2v_step = next(s for s in t2v.stages if s.name.startswith("transformer step"))
    assert "36 latent channels" in i2v.details["config"] and step.weights > t2v_step.weights
    assert step.activations > t2v_step.activations  # the 36-channel latents
    assert encode.shares == "VAE decode" and encode.weights == decode.weights
    assert encode.activations > 3 * 9 * 272 * 480 * 2  # at least the conditioning video in bf16
    known = i2v.stage_list(patched=False)
    assert i2v.peak(patched=False) == (sum(s.weights for s in known) - encode.weights
                                       + max(s.activations for s in known), True)
    assert i2v.peak(patched=False, offload=True)[0] >= encode.total
    tiled = {s.name: s for s in i2v.stage_list(patched=False, vae_tiled=True)}
    assert tiled["VAE encode"] == i2v.details["vae_encode_tiled"] and tiled["VAE encode"].shares == "VAE decode"
    assert tiled["VAE encode"].activations < encode.activations, (tiled["VAE encode"], encode)
    assert "the conditioning video" in i2v.table()


#: a tiny Wan 2.1 I2V transformer: an image embedder of 16-wide tokens, the image's keys and values in attn2
WAN_I2V_TINY = {**wan.WAN_SOL_CONFIG, "in_channels": 36, "image_dim": 16, "added_kv_proj_dim": 256}


@pytest.mark.parametrize("patched", [False, True])
def test_a_planned_wan21_i2v_step_holds_what_its_real_run_holds(patched):
    """Wan 2.1 I2V's transformer also reads the CLIP image tokens (257 of them, as the plan passes them): planned on
    fake tensors against the real CPU forward, unpatched and at the default tier (within 10 %), and the image
    tokens are what it was given."""
    torch.set_num_threads(1)
    case = TransformerCase("wan", WAN_I2V_TINY, 2, 16, 16, 8, batch=1, dtype="float32")
    inputs = case.inputs(case.build())
    assert tuple(inputs["encoder_hidden_states_image"].shape) == (1, 257, 16)
    run = dict(apply_arguments={}, steps=(0,), total_steps=2) if patched else {}
    _forget_verdicts()
    measured = trace_step(case, fake=False, warmup=patched, **run)
    planned = trace_step(case, **run)
    plain = trace_step(dataclasses.replace(case, config={**WAN_I2V_TINY, "image_dim": None,
                                                         "added_kv_proj_dim": None}))
    assert planned.weights == measured.weights > plain.weights  # the image embedder and the added k/v
    assert _within(planned.activations, measured.activations), (planned, measured)
    assert measured.activations > 257 * 16 * 4


def test_wan21_i2v_14b_plans_its_clip_image_encoder_its_image_tokens_and_the_vae_encode():
    """Wan 2.1 I2V 14B (480p): the transformer is Wan 2.1 14B's shape reading 36 channels plus the image embedder
    and each block's added keys and values (16.4B parameters, from the shapes), the text stage adds CLIP ViT-H/14
    on one image, and the conditioning video is VAE-encoded; FLF2V stays unknown (its own test)."""
    from accelpatch.testing.wan import wan_transformer_on_meta

    recipe = dict(name="wan21-i2v", description="Wan 2.1 I2V 14B", model="Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                  pipeline="diffusion", dtype="bf16", call=dict(prompt="a cat", height=96, width=160, num_frames=5))
    plan = memory_plan(recipe, patched=False)
    t2v = memory_plan("wan2.1-t2v-sol-attn", patched=False, height=96, width=160, frames=5)
    stages = {stage.name: stage for stage in plan.stages}
    assert list(stages)[:3] == ["text encoder", "VAE encode", "transformer step, unpatched"], list(stages)
    dim, blocks = 5120, 40
    t2v_parameters = sum(p.numel() for p in wan_transformer_on_meta({}).parameters())
    added = (blocks * (2 * (dim * dim + dim) + dim)  # each block's add_k_proj, add_v_proj and its k norm
             + 2 * 1280 + 1280 * dim + dim + dim * dim + dim + 2 * dim  # the image embedder: norms and MLP
             + (36 - 16) * 2 * 2 * dim)  # the patch embedding's extra input channels
    parameters = stages["transformer step, unpatched"].weights // 2
    assert abs(parameters - (t2v_parameters + added)) <= 0.001 * parameters, (parameters, t2v_parameters + added)
    assert abs(parameters - 16.4e9) <= 0.01 * 16.4e9
    text = stages["text encoder"]
    assert "CLIP ViT-H/14 (image) 0.63B, 257 tokens" in text.note, text.note
    assert text.weights > t2v.stages[0].weights + 2 * 0.6e9
    assert stages["transformer step, unpatched"].activations > t2v.stages[1].activations  # 36 channels, 257 tokens
    assert "257 CLIP image tokens" in plan.details["config"]


def test_wan22_a14b_plans_its_two_experts_both_resident_and_one_at_a_time_under_offload():
    """Wan 2.2 T2V A14B loads two experts of Wan 2.1 14B's shape (``transformer`` and ``transformer_2``), one
    running a step: with every component on the device both are resident (the other expert a row of its own, in
    whatever form the step's weights are planned: fp8 storage too), under model offload one at a time."""
    plan = memory_plan("wan2.2-t2v-a14b-lightning-4step", patched=False, height=96, width=160, frames=5,
                       budget="1GiB")
    fourteen = memory_plan("wan2.1-t2v-sol-attn", patched=False, height=96, width=160, frames=5)
    step = plan.stages[1]
    assert step.planned and step.weights == fourteen.stages[1].weights > 26 * 2 ** 30
    assert step.activations == fourteen.stages[1].activations and plan.details["experts"] == 2
    (other,) = plan.stage_list(patched=False)[len(plan.stages):]
    assert other.name == "the other expert" and other.weights == step.weights and other.activations == 0
    resident = sum(s.weights for s in plan.stages) + step.weights + max(s.activations for s in plan.stages)
    assert plan.peak(patched=False) == (resident, True) == (fourteen.peak(patched=False)[0] + step.weights, True)
    assert plan.peak(patched=False, offload=True) == fourteen.peak(patched=False, offload=True)
    fp8 = plan.details["fp8_weights"]
    assert plan.peak(patched=False, fp8=True)[0] == resident - 2 * (step.weights - fp8)
    assert "the other expert" in plan.table() and "2 experts" in plan.table()
    moves = {move.short: move.text for move in plan.moves()}  # a transformer's move is to be made on both
    assert moves["fp8 weight storage"].endswith("on every expert: transformer and transformer_2"), moves
    assert "transformer_2" not in moves["enable_model_cpu_offload()"]


def test_every_shipped_full_size_recipe_maps_to_a_family_and_a_configuration_or_a_reason():
    for name in available_recipes():
        recipe = load_recipe(name)
        if recipe.is_tiny:
            continue
        family = family_of(recipe.model)
        assert family is not None, recipe.model
        known = release_config(family, recipe.model)
        assert isinstance(known, tuple) or recipe.model in known, (name, known)


def test_each_family_registers_its_own_memory_settings_and_the_planner_names_none():
    """Model-specific code in one place per model: a family's memory settings are registered by its package and its
    functions live in ``accelpatch.models.<key>.memory``; the planner reads the registry and no string of it is a
    family's key (no per-family table or branch)."""
    import ast
    from pathlib import Path

    from accelpatch.memory import plan
    from accelpatch.models.families import families, resolve

    planned = {f.key: f.memory for f in families() if f.memory is not None}
    assert set(planned) == {"wan", "sana_video", "sana_video2", "minimax_h3", "hunyuan_video15", "ltx2"}
    for key, memory in planned.items():
        hooks = [memory.release_config, memory.transformer_inputs, memory.frames, memory.latent_frames,
                 memory.audio, memory.canvas, memory.guidance_rule, memory.text_encoders, memory.text_stage,
                 memory.vae_for, memory.experts]
        for hook in filter(None, hooks):
            assert hook.startswith(f"accelpatch.models.{key}.memory:") and callable(resolve(hook)), hook
    source = Path(plan.__file__).read_text()
    strings = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)}
    assert not strings & ({f.key for f in families()} | {f.cli for f in families()})


def test_model_names_are_tried_in_the_families_name_order():
    """"sana-video2" holds "sana-video": SANA-Video 2.0's names are tried first; Wan Animate, which the planner does
    not plan yet, is Wan by its name, and a family without memory settings is named as such."""
    from accelpatch.models.families import families

    order = {f.key: f.memory.name_order for f in families() if f.memory is not None}
    assert order["sana_video2"] < order["sana_video"]
    assert family_of("Efficient-Large-Model/SANA-Video2-5B") == family_of("sana_video_2.0-14b") == "sana_video2"
    assert family_of("Efficient-Large-Model/SANA-Video_2B_480p_diffusers") == "sana_video"
    assert family_of("Wan-AI/Wan2.2-Animate-14B-Diffusers") == "wan" and family_of("a-model") is None
    with pytest.raises(ValueError, match="no memory settings for family 'wan_animate'"):
        TransformerCase("wan_animate", {}, 1, 2, 2, 1).build()


def test_sizes_the_pipeline_cannot_know_are_asked_for():
    with pytest.raises(ValueError, match="height= and width="):
        memory_plan("hunyuan-video15-step-distilled")
    with pytest.raises(ValueError, match="multiples of 16"):
        memory_plan("wan2.1-t2v-1.3b-sol-attn", height=481, width=832)
    with pytest.raises(ValueError, match="tiny test model"):
        memory_plan("tiny-wan-sol-attn")


@pytest.mark.parametrize("text,expected", [("24GiB", 24 * GIB), ("24GB", 24 * 10 ** 9), ("80G", 80 * GIB),
                                           ("1.5TiB", 3 * 2 ** 39), ("512 MiB", 2 ** 29), ("4096", 4096)])
def test_budgets_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["24XB", "", "GiB", "-1G", "0GiB", "24 GiB of it", "1e3G"])
def test_a_bad_budget_names_the_value_and_the_valid_forms(text):
    with pytest.raises(ValueError) as error:
        parse_size(text)
    assert repr(text) in str(error.value) and "24GiB" in str(error.value) and "GB = 10**9" in str(error.value)


def test_the_command_prints_the_table_and_the_verdict(capsys, wan_1_3b_plan, monkeypatch):
    """``python -m accelpatch memory``: progress on stderr, the table on stdout (the plan itself is the fixture's,
    so the trace runs once per module)."""
    from accelpatch.__main__ import main
    from accelpatch.memory import plan as plan_module

    seen = {}

    def planned(recipe, **kwargs):
        seen.update(kwargs, recipe=recipe.name)
        kwargs["progress"]("tracing (the fixture's plan) ...")
        return wan_1_3b_plan

    monkeypatch.setattr(plan_module, "memory_plan", planned)
    assert main(["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", "--budget", "24GiB", "--frames", "81"]) == 0
    out, err = capsys.readouterr()
    assert seen["recipe"] == "wan2.1-t2v-1.3b-sol-attn" and seen["budget"] == 24 * GIB and seen["frames"] == 81
    assert seen["tier"] is None and seen["vae_tiling"] is False
    assert "tracing" in err
    assert "transformer step, unpatched" in out and "transformer step, patched" in out and "GiB" in out
    assert "fits" in out and "fits so far" not in out and "UMT5-XXL encoder 5.68B" in out and "flash-style" in out


def test_the_command_runs_a_plan_end_to_end(capsys):
    from accelpatch.__main__ import main

    assert main(["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", "--unpatched-only", "--frames", "5",
                 "--height", "96", "--width", "160", "--budget", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "96x160, 5 frames -> latents 2x12x20" in out and "transformer step, unpatched" in out
    assert "transformer step, patched" not in out and "does NOT fit" in out  # 2.65 GiB of weights


def test_a_plan_at_the_default_tier_names_it_and_says_where_each_peak_is():
    """``tier="lossless"`` plans the patched step at apply()'s default tier (the recipe's Sol-Attn does not run
    there), each row saying where its peak came; a tier that is not one is refused by name."""
    plan = memory_plan("wan2.1-t2v-1.3b-sol-attn", frames=5, height=96, width=160, tier="lossless")
    assert "tier=lossless" in plan.patch and "backend=sol_attn" in plan.patch
    unpatched = plan.stages[1]
    assert unpatched.note.startswith("peak at blocks.") and "peak at blocks." in plan.patched.note
    assert "a process's first call" in plan.patched.note
    assert plan.patched.activations <= unpatched.activations
    with pytest.raises(ValueError, match=r"tier must be one of exact, lossless, high, got 'fast'"):
        memory_plan("wan2.1-t2v-1.3b-sol-attn", frames=5, height=96, width=160, tier="fast")


@pytest.mark.parametrize("argv,message", [
    (["--budget", "24XB"], "budget '24XB' is not a size"),
    (["--height", "0"], "argument --height: expected an integer >= 1"),
    (["--tier", "fast"], "argument --tier: invalid choice: 'fast'"),
])
def test_command_usage_errors_are_one_line(capsys, argv, message):
    from accelpatch.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["memory", "--recipe", "wan2.1-t2v-1.3b-sol-attn", *argv])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("accelpatch memory: error:") and message in errors[0]


def test_a_recipe_the_planner_cannot_plan_ends_in_one_error_line(capsys):
    from accelpatch.__main__ import main

    assert main(["memory", "--recipe", "tiny-wan-sol-attn"]) == 2
    assert capsys.readouterr().err.strip().startswith("accelpatch memory: error: tiny:wan is a tiny test model")


def test_value_shadows_give_a_fake_trace_the_values_it_branches_on():
    """HunyuanVideo 1.5 branches on ``torch.all(image_embeds == 0)`` and selects tokens with boolean masks: with
    the inputs' values known the trace runs and gets the shapes real tensors give; without them it cannot."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from accelpatch.memory.shadows import ValueShadows

    def forward(x, mask, embeds):
        keep = x[mask] if not torch.all(embeds == 0) else x
        return torch.cat([keep, x[~mask]]), x[mask.nonzero().flatten()]

    real = (torch.randn(6, 4), torch.tensor([True, False, True, True, False, False]), torch.ones(3))
    expected = [t.shape for t in forward(*real)]
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in real]
    with mode, ValueShadows(mode) as shadows:
        for f, r in zip(fake, real):
            shadows.know(f, r)
        assert [t.shape for t in forward(*fake)] == expected
    with mode, pytest.raises(DataDependentOutputException):
        forward(*fake)


def test_fp8_weight_storage_is_weighed_by_diffusers_own_layerwise_casting():
    """layerwise_fp8_weights builds the transformer on the meta device and lets diffusers'
    enable_layerwise_casting choose what it stores in fp8: the bytes a real model holds after the same call."""
    from accelpatch.memory.live_bytes import module_bytes
    from accelpatch.memory.plan import layerwise_fp8_weights

    case = TransformerCase("wan", wan.WAN_SOL_CONFIG, 4, 32, 32, 8)
    real = case.build()
    before = module_bytes(real)
    real.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    planned = layerwise_fp8_weights(case)
    assert planned == module_bytes(real) and before / 2 < planned < before, (planned, before)


@pytest.fixture(scope="module")
def small_wan_plan():
    """Wan 2.1 1.3B, 5 frames of 96 x 160, unpatched, planned with a budget nothing fits (every option weighed)."""
    return memory_plan("wan2.1-t2v-1.3b-sol-attn", frames=5, height=96, width=160, budget="0.5GiB", patched=False)


@pytest.mark.parametrize("budget,expected", [
    ("11GiB", "to fit 11.00 GiB: enable_model_cpu_offload()"),
    ("8GiB", "to fit 8.00 GiB: the prompt encoded on the CPU (load the pipeline with text_encoder=None"),
    ("2.8GiB", "to fit 2.80 GiB: enable_model_cpu_offload() and the prompt encoded on the CPU: 2.67 GiB"),
    ("2GiB", "to fit 2.00 GiB: the prompt encoded on the CPU and group offloading of the transformer: 0.60 GiB"),
    ("0.5GiB", "to fit 0.50 GiB: none of enable_model_cpu_offload(), the prompt encoded on the CPU, group offloading "
               "of the transformer, vae.enable_tiling(), the text encoder in int8, fp8 weight storage, torchao int8 "
               "weight-only, torchao fp8 weight-only, GGUF Q8_0 weights, GGUF Q4_K weights is enough, nor any "
               "combination"),
])
def test_a_call_that_does_not_fit_names_the_option_that_would(small_wan_plan, budget, expected):
    """Wan 2.1 1.3B at a small size (UMT5-XXL's 10.6 GiB, the transformer's 2.65 GiB, the VAE's 0.24 GiB and little
    activation): the first option planned that makes the call fit the budget, model offload before the prompt encoded
    on the CPU (once per prompt) before group offloading (every block at every step) before lossy fp8 storage, a
    cheaper costliest move first and fewer moves first, or none (VAE tiling is weighed too: at 96 x 160 nothing is
    tiled). One plan judged against each budget (the next test: a plan made with the budget says the same)."""
    plan = dataclasses.replace(small_wan_plan, budget=parse_size(budget))
    assert plan.fits() is False
    lines = [line for line in plan.table().splitlines() if line.startswith("to fit")]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert plan.details["fp8_weights"] < plan.stages[1].weights


def test_a_plan_made_with_a_budget_is_the_shared_plan_judged_against_it(small_wan_plan):
    """What lets the test above judge one plan against several budgets: every budget it asks is missed, so each plan
    weighs every option, and a plan made with one of them is the shared plan's table line for line (its planning
    time aside)."""
    fresh = memory_plan("wan2.1-t2v-1.3b-sol-attn", frames=5, height=96, width=160, budget="2.8GiB", patched=False)
    judged = dataclasses.replace(small_wan_plan, budget=parse_size("2.8GiB"), seconds=fresh.seconds)
    assert fresh.table() == judged.table()


def test_every_planned_release_configuration_is_weighed_with_fp8_storage():
    """The fp8 option of a budgeted plan for every family's release configuration of the shipped recipes: diffusers'
    layerwise casting on the meta model stores most weights in one byte (between half and all of the bf16 bytes)."""
    from accelpatch.memory.live_bytes import module_bytes
    from accelpatch.memory.plan import layerwise_fp8_weights

    seen = set()
    for name in available_recipes():
        recipe = load_recipe(name)
        family = None if recipe.is_tiny else family_of(recipe.model)
        known = release_config(family, recipe.model) if family else None
        if not isinstance(known, tuple) or (family, recipe.model) in seen:
            continue
        seen.add((family, recipe.model))
        case = TransformerCase(family, known[0], 1, 8, 8, 8)
        with torch.device("meta"):
            bf16 = module_bytes(case.build())
        fp8 = layerwise_fp8_weights(case)
        assert bf16 / 2 <= fp8 < 0.75 * bf16, (name, fp8, bf16)
    assert {family for family, _ in seen} == {"wan", "sana_video", "sana_video2", "minimax_h3", "hunyuan_video15",
                                              "ltx2"}, seen


def test_a_budget_the_patched_call_misses_plans_memory_low_and_names_it_when_it_fits():
    """With a budget the patched call misses, the plan traces the step with memory='low' too: its steady steps and
    its checked first call. A budget between model offload alone and memory='low' at tier high with offload (whose
    first step holds no more than the later ones) names that option; the checked mode, whose first call checks the
    chunks beside the whole computation, does not fit it."""
    # Wan 2.1 14B (26.7 GiB of weights): the transformer, not the VAE decode, decides the offloaded peak; 1,950
    # tokens in chunks of 512 (4 chunks; the traces cost more with more chunks: this test took 61 s at 256, 41 s at 512)
    size = dict(frames=17, height=240, width=416, chunk_tokens=512)
    first = memory_plan("wan2.1-t2v-sol-attn", budget="1GiB", tier="lossless", **size)
    low = first.details["low_memory"]
    assert low["unchecked"].activations < first.patched.activations
    assert low["checked"].activations == first.patched.activations  # the first call's check: the default tier's
    offload_low, _ = first.peak(offload=True, low="unchecked")
    offload, _ = first.peak(offload=True)
    assert offload_low < offload
    budget = (offload_low + offload) // 2
    plan = dataclasses.replace(first, budget=budget)  # the same traces, judged against another budget
    lines = [line for line in plan.table().splitlines() if line.startswith("to fit")]
    assert len(lines) == 1 and "memory='low' at tier high (unchecked chunks) and enable_model_cpu_offload()" in \
        lines[0], lines
