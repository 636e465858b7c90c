"""The memory plan's text-encoder stage (issue #44): each encoder traced on fake tensors holds what its real run holds
(tiny configurations of every class the families name), the release configurations have the parameters their
published sizes and their shapes imply, what a pipeline keeps of the outputs is counted, and a family whose encoder
is not known is named with the reason, never planned as zero."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from accelpatch.memory.plan import memory_settings
from accelpatch.memory.text_encoder import (TextEncoderCase, build_text_encoder, cast_like_transformers,
                                           trace_text_encoder)
from accelpatch.models.families import resolve

GIB = 2 ** 30
#: the families whose pipelines' text encoders are planned
PLANNED = ("wan", "sana_video", "sana_video2", "hunyuan_video15", "ltx2", "minimax_h3")

#: a tiny configuration per model class the families name (the same fields shrunk)
TINY = {
    "transformers:UMT5EncoderModel": dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, vocab_size=100,
                                          feed_forward_proj="gated-gelu", is_gated_act=True),
    "transformers:T5EncoderModel": dict(d_model=24, d_ff=48, d_kv=8, num_heads=3, num_layers=2, vocab_size=64,
                                        feed_forward_proj="gated-gelu", is_gated_act=True),
    "transformers:Gemma2Model": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, vocab_size=100),
    "transformers:Qwen2_5_VLTextModel": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                             bos_token_id=1, eos_token_id=2, rope_parameters=dict(
                                                 rope_type="default", rope_theta=1e6, mrope_section=[1, 1, 2])),
    "transformers:Gemma3ForConditionalGeneration": dict(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=300, sliding_window=16),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), mm_tokens_per_image=4, image_token_index=299,
        boi_token_index=297, eoi_token_index=298),
    "transformers:Qwen3VLForConditionalGeneration": dict(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=100, rope_parameters=dict(
                             rope_type="default", rope_theta=5e6, mrope_section=[1, 1, 2], mrope_interleaved=True)),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[0]),
        tie_word_embeddings=False),
    "transformers:SiglipVisionModel": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=28, patch_size=14),
    "transformers:CLIPVisionModelWithProjection": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                       num_attention_heads=2, image_size=28, patch_size=14,
                                                       projection_dim=8),
}


def _cases():
    seen = set()
    for family in PLANNED:
        for model in ("", "hunyuanvideo-1.5-480p-i2v", "wan2.1-i2v-14b-480p"):  # image-to-video adds its image encoder
            for case in resolve(memory_settings(family).text_encoders)({}, model):
                if case.name not in seen:
                    seen.add(case.name)
                    yield family, case


@pytest.mark.parametrize("family,case", list(_cases()), ids=lambda v: v if isinstance(v, str) else v.name)
def test_a_planned_text_encoder_holds_what_its_real_run_holds(family, case):
    """The same encoder class and output handling at a tiny size and 24 tokens: the fake trace's weights and peak
    against LiveBytes on a real CPU call (within 10 %; in practice equal)."""
    torch.set_num_threads(1)
    tiny = dataclasses.replace(case, settings=TINY[case.model], tokens=24, image_size=28 if case.image_size else 0)
    planned = trace_text_encoder(tiny, "float32")
    measured = trace_text_encoder(tiny, "float32", fake=False)
    assert measured.activations > 4 * 16 * 4, measured  # at least one hidden state, not nothing
    assert planned.weights == measured.weights and planned.parameters == measured.parameters
    assert abs(planned.activations - measured.activations) <= 0.10 * measured.activations, (planned, measured)


def _decoder_parameters(vocab, width, layers, heads, kv_heads, head_dim, ffn) -> int:
    """A decoder LLM's weights from its shapes: the embedding, and per layer q/k/v/o and a gated MLP (norms and
    biases, under 0.1 %, left out)."""
    attention = width * heads * head_dim * 2 + width * kv_heads * head_dim * 2
    return vocab * width + layers * (attention + 3 * width * ffn)


def _t5_encoder_parameters(vocab, width, layers, heads, d_kv, ffn) -> int:
    return vocab * width + layers * (4 * width * heads * d_kv + 3 * width * ffn)


def test_the_release_text_encoders_have_the_parameters_their_shapes_and_published_sizes_imply():
    """Each family's encoder at full size, bf16: 2 bytes per parameter (nothing kept in float32 in bf16; a few
    rotary-frequency buffers beside them) and the
    parameter count the configuration's shapes give (within 1 %), which is the published size: UMT5-XXL's encoder
    5.7B, Gemma-2-2B 2.6B, Qwen2.5-VL-7B's language model 7.1B (of 8.3B with its vision tower and head), ByT5-small's
    encoder 0.2B (of 0.3B), Gemma 3 12B 12.2B (its 0.4B SigLIP tower included), SigLIP so400m 0.43B (HunyuanVideo
    1.5's image-to-video image encoder), Qwen3-VL-32B 33.4B (MiniMax-H3's, loaded whole), CLIP ViT-H/14's vision
    tower 0.63B (Wan 2.1 I2V's image encoder)."""
    expected = {
        "UMT5-XXL encoder": _t5_encoder_parameters(256384, 4096, 24, 64, 64, 10240),
        "Gemma-2-2B": _decoder_parameters(256000, 2304, 26, 8, 4, 256, 9216),
        "Qwen2.5-VL-7B (text)": _decoder_parameters(152064, 3584, 28, 28, 4, 128, 18944),
        "ByT5-small (glyphs)": _t5_encoder_parameters(384, 1472, 12, 6, 64, 3584),
        "Gemma-3-12B": _decoder_parameters(262208, 3840, 48, 16, 8, 256, 15360)
        + 27 * (4 * 1152 ** 2 + 2 * 1152 * 4304) + (896 // 14) ** 2 * 1152 + 1152 * 3840,
        # 27 layers and the attention-pooling head (one more attention and MLP), the 729 positions
        "SigLIP so400m (image)": 28 * (4 * 1152 ** 2 + 2 * 1152 * 4304) + 729 * 1152,
        # 32 layers, the 14 x 14 patch embedding, 257 positions and the 1,024-wide projection
        "CLIP ViT-H/14 (image)": 32 * (4 * 1280 ** 2 + 2 * 1280 * 5120) + 3 * 14 * 14 * 1280 + 257 * 1280
        + 1280 * 1024,
        # the language model, its untied head, 27 vision layers and four 2 x 2 patch mergers (one, and DeepStack's 3)
        "Qwen3-VL-32B": _decoder_parameters(151936, 5120, 64, 64, 8, 128, 25600) + 151936 * 5120
        + 27 * (4 * 1152 ** 2 + 2 * 1152 * 4304) + 4 * (4608 ** 2 + 4608 * 5120),
    }
    published = {"UMT5-XXL encoder": 5.7e9, "Gemma-2-2B": 2.6e9, "Qwen2.5-VL-7B (text)": 7.1e9,
                 "ByT5-small (glyphs)": 0.22e9, "Gemma-3-12B": 12.2e9, "SigLIP so400m (image)": 0.43e9,
                 "Qwen3-VL-32B": 33.4e9, "CLIP ViT-H/14 (image)": 0.632e9}
    seen = set()
    for _, case in _cases():
        seen.add(case.name)
        trace = trace_text_encoder(case, "bfloat16")
        assert abs(trace.parameters - expected[case.name]) <= 0.01 * expected[case.name], (case.name, trace)
        assert abs(trace.parameters - published[case.name]) <= 0.03 * published[case.name], (case.name, trace)
        assert 2 * trace.parameters <= trace.weights <= 2.001 * trace.parameters, case.name  # + rotary buffers
    assert seen == set(expected)


def test_what_a_pipeline_keeps_of_the_outputs_is_counted():
    """LTX-2 stacks all 49 hidden states of Gemma 3 while the tuple is alive (both: 2 x 49 x 1024 x 3840 bf16), and
    computes the logits over its 262,208-token vocabulary; HunyuanVideo 1.5 keeps Qwen2.5-VL's 29 hidden states of
    1,108 tokens while it picks one; Wan keeps UMT5's last one only."""
    by_name = {case.name: case for _, case in _cases()}
    gemma = trace_text_encoder(by_name["Gemma-3-12B"], "bfloat16")
    assert gemma.activations >= 2 * 49 * 1024 * 3840 * 2 + 1024 * 262208 * 2, gemma
    last = trace_text_encoder(dataclasses.replace(by_name["Gemma-3-12B"], output="last"), "bfloat16")
    assert last.activations < gemma.activations
    qwen = trace_text_encoder(by_name["Qwen2.5-VL-7B (text)"], "bfloat16")
    assert qwen.activations >= 29 * 1108 * 3584 * 2, qwen
    umt5 = trace_text_encoder(by_name["UMT5-XXL encoder"], "bfloat16")
    assert 512 * 10240 * 2 * 2 <= umt5.activations < 29 * 512 * 4096 * 2, umt5  # the gated FF pair, not all layers


def test_transformers_float32_modules_are_kept_as_from_pretrained_keeps_them():
    """T5's feed-forward output projection ('wo', _keep_in_fp32_modules) stays float32 in fp16 only; in bf16 every
    weight is bf16 (transformers applies that list to fp16 loads alone)."""
    case = TextEncoderCase("t5", "transformers:T5EncoderModel", "transformers:T5Config",
                           TINY["transformers:T5EncoderModel"], 8, "test")
    for dtype, wo in ((torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)):
        model = build_text_encoder(case, dtype)
        kinds = {name: p.dtype for name, p in model.named_parameters()}
        assert all(d == (wo if ".wo." in n else dtype) for n, d in kinds.items()), kinds
    model = build_text_encoder(case, torch.float32)
    cast_like_transformers(model, torch.float16)
    assert model.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32


def test_a_sana_prompt_rewriting_instruction_adds_its_tokens_and_a_call_can_drop_it():
    """Both SANA pipelines prepend the complex human instruction and pad to its tokens + 300 - 2; without it, 300."""
    for family in ("sana_video", "sana_video2"):
        text_encoders = resolve(memory_settings(family).text_encoders)
        (default,) = text_encoders({})
        (plain,) = text_encoders({"complex_human_instruction": []})
        assert plain.tokens == 300 and default.tokens > 500 and "instruction" in default.note, family


def test_minimax_h3s_conditioner_is_loaded_whole_and_its_language_model_called_on_the_prompts_own_tokens():
    """MiniMax-H3's pipeline calls ``text_encoder.model`` with every hidden state kept (65 of 256 tokens x 5,120 in
    bf16) and never the language-model head, whose logits (256 x 151,936) calling the whole model adds; the weights are
    the whole model's, head included; the prompt's tokens are the plan's text tokens (no padding)."""
    from accelpatch.memory.plan import memory_plan

    (case,) = resolve(memory_settings("minimax_h3").text_encoders)({})
    trace = trace_text_encoder(case, "bfloat16")
    hidden = 65 * 256 * 5120 * 2
    assert trace.activations >= hidden, trace
    whole = trace_text_encoder(dataclasses.replace(case, calls=""), "bfloat16")  # the head run too
    assert whole.activations >= hidden + 256 * 151936 * 2 and whole.weights == trace.weights
    assert trace.activations < whole.activations
    plan = memory_plan("minimax-h3-turbo-5step", patched=False, height=96, width=160, frames=22, text_tokens=64)
    text = plan.stages[0]
    assert text.planned and text.weights == trace.weights and "Qwen3-VL-32B 33.36B, 64 tokens" in text.note, text
    assert plan.peak()[1] is True


def test_a_family_whose_text_encoder_is_not_known_names_it_with_the_reason(monkeypatch):
    from accelpatch.memory import plan as planner

    settings = dataclasses.replace(memory_settings("minimax_h3"), text_encoders=None,
                                   text_encoder="Qwen3-VL: which model the release loads is not known here")
    monkeypatch.setattr(planner, "memory_settings", lambda family: settings)
    plan = planner.memory_plan("minimax-h3-turbo-5step", patched=False, height=96, width=160, frames=22)
    text = plan.stages[0]
    assert text.name == "text encoder" and not text.planned and "Qwen3-VL" in text.note and "not known" in text.note
    assert plan.peak()[1] is False and "not planned yet: Qwen3-VL" in plan.table()


def test_a_bad_text_encoder_case_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match="output must be one of last, hidden_states, stacked, got 'all'"):
        TextEncoderCase("x", "transformers:T5EncoderModel", "transformers:T5Config", {}, 8, "test", output="all")
    with pytest.raises(ValueError, match="tokens must be >= 1, got 0"):
        TextEncoderCase("x", "transformers:T5EncoderModel", "transformers:T5Config", {}, 0, "test")


#: LTX2TextConnectors shrunk (the same fields as diffusers' defaults)
TINY_CONNECTORS = dict(caption_channels=16, text_proj_in_factor=3, video_connector_num_attention_heads=2,
                       video_connector_attention_head_dim=8, video_connector_num_layers=1,
                       video_connector_num_learnable_registers=4, audio_connector_num_attention_heads=2,
                       audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
                       audio_connector_num_learnable_registers=4)


@pytest.mark.parametrize("cfg", [1, 2])
def test_ltx2s_text_connectors_hold_what_their_real_run_holds(cfg):
    """The connectors LTX2Pipeline runs on Gemma's stacked hidden states, at a tiny size: the fake trace's weights and
    peak against LiveBytes on a real CPU call (within 10 %), the stacked input (and with CFG the negative half the
    pipeline still holds) counted."""
    from accelpatch.memory.text_encoder import trace_text_stage
    from accelpatch.models.ltx2.memory import text_connectors

    torch.set_num_threads(1)
    tiny = dataclasses.replace(text_connectors({}), settings=TINY_CONNECTORS, width=16 * 3)
    planned = trace_text_stage(tiny, "float32", 1, cfg, 32)
    measured = trace_text_stage(tiny, "float32", 1, cfg, 32, fake=False)
    assert planned[0] == measured[0] and planned[2] == measured[2]
    stacked = cfg * 32 * 16 * 3 * 4
    assert measured[1] > stacked * (1.5 if cfg == 2 else 1), measured  # the input, the negative half, what it makes
    assert abs(planned[1] - measured[1]) <= 0.10 * measured[1], (planned, measured)


def test_the_ltx2_plan_weighs_its_text_connectors_as_a_stage_of_their_own():
    """LTX-2.0's connectors (diffusers' defaults: a 188,160 -> 3,840 projection and two 2-layer connectors of width
    3,840, 1.43B parameters, 2 bytes each in bf16) are a stage between the text encoder and the transformer: their
    weights resident with everything else, or alone under model offloading; LTX-2.3's have their own configuration
    (8 gated layers per modality: tests/test_memory_ltx23.py)."""
    from accelpatch.memory.plan import memory_plan
    from accelpatch.memory.text_encoder import trace_text_stage
    from accelpatch.models.ltx2.memory import text_connectors

    weights, activations, parameters = trace_text_stage(text_connectors({}), "bfloat16", 1, 2, 1024)
    projection = 3840 * 49 * 3840
    block = 4 * 3840 * 3840 + 2 * 3840 * 4 * 3840  # attention q/k/v/o and the 4x feed-forward, biases left out
    assert abs(parameters - (projection + 4 * block)) <= 0.01 * parameters and weights == 2 * parameters
    assert activations >= 3 * 1024 * 3840 * 49 * 2, activations  # the CFG pair stacked, and the negative half
    plan = memory_plan("ltx2-distilled-8step", patched=False, height=256, width=384, frames=9)
    names = [s.name for s in plan.stages]
    assert names[:2] == ["text encoder", "text connectors"] and plan.stages[1].planned, names
    assert plan.stages[1].weights == weights and "1.43B from diffusers' LTX2TextConnectors" in plan.table()
    resident = sum(s.weights for s in plan.stages) + max(s.activations for s in plan.stages)
    assert plan.peak() == (resident, True)
    assert plan.peak(offload=True)[0] == max(s.total for s in plan.stages)
    ltx23 = text_connectors({}, "lightricks/ltx-2.3-22b")
    assert ltx23.settings["video_connector_num_layers"] == 8 and "LTX-2.3" in ltx23.source
