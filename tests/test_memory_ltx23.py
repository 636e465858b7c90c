"""LTX-2.3 in the memory plan (issue #44): its transformer, text connectors, video VAE (SANA-Video 2.0's too) and
vocoder from diffusers' LTX-2 conversion presets (version 2.3), kept in ``accelpatch.models.ltx2.memory`` as what
differs from the classes' defaults. The presets cannot be checked against the checkpoint here (no weights), so the
tests check what must hold between them and what the release says: the parts fit one another, and the transformer
and the connectors add up to the "22B" of the checkpoint's name."""
from __future__ import annotations

import inspect

import torch
from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE
from torch._subclasses.fake_tensor import FakeTensorMode

from accelpatch.memory.plan import memory_plan
from accelpatch.models.ltx2.memory import LTX23_CONNECTORS, LTX23_VIDEO_VAE, release_config

MODEL = "diffusers/LTX-2.3-Distilled-Diffusers"  # diffusers' own LTX-2.3 repository name


def _config(cls, deltas) -> dict:
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    return {**defaults, **deltas}


def _parameters(cls, deltas) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in cls(**deltas).parameters())


def test_ltx23s_parts_fit_one_another_and_add_up_to_its_22b():
    """The connectors' per-modality outputs are as wide as the transformer's cross-attentions (it has no prompt
    projections of its own), the video VAE's latents are the transformer's channels at its VAE scale factors, the
    vocoder reads the audio VAE's channels x mel bins; transformer and connectors: 22.2B parameters."""
    deltas, _ = release_config(MODEL.lower())
    transformer = _config(LTX2VideoTransformer3DModel, deltas)
    connectors = _config(LTX2TextConnectors, LTX23_CONNECTORS)
    assert transformer["use_prompt_embeddings"] is False
    assert connectors["per_modality_projections"] is True
    assert connectors["video_hidden_dim"] == transformer["cross_attention_dim"] == (
        connectors["video_connector_num_attention_heads"] * connectors["video_connector_attention_head_dim"])
    assert connectors["audio_hidden_dim"] == transformer["audio_cross_attention_dim"] == (
        connectors["audio_connector_num_attention_heads"] * connectors["audio_connector_attention_head_dim"])
    total = _parameters(LTX2VideoTransformer3DModel, deltas) + _parameters(LTX2TextConnectors, LTX23_CONNECTORS)
    assert 22.0e9 < total < 22.5e9, total

    with FakeTensorMode():  # one latent frame pair of 8 x 8 decodes to 9 frames of 256 x 256 (8 x 32 x 32)
        vae = AutoencoderKLLTX2Video(**LTX23_VIDEO_VAE)
        video = vae.decode(torch.empty(1, transformer["in_channels"], 2, 8, 8)).sample
    assert vae.config.latent_channels == transformer["in_channels"] and tuple(video.shape) == (1, 3, 9, 256, 256)
    assert tuple(transformer["vae_scale_factors"]) == (8, 32, 32)
    audio_vae = _config(AutoencoderKLLTX2Audio, {})
    vocoder = _config(LTX2VocoderWithBWE, {})
    assert vocoder["in_channels"] == audio_vae["output_channels"] * audio_vae["mel_bins"]
    assert vocoder["input_sampling_rate"] == audio_vae["sample_rate"] and vocoder["output_sampling_rate"] == 48000


def test_an_ltx23_plan_weighs_every_stage_with_its_own_configurations():
    """A recipe naming an LTX-2.3 model: the 19.0B transformer, its 3.2B connectors, LTX-2.3's video VAE (0.73B)
    and the BWE vocoder after LTX-2.0's audio VAE, every stage planned (LTX-2.0's plans keep diffusers' defaults:
    tests/test_memory_text_encoder.py, tests/test_memory_audio.py)."""
    recipe = dict(name="ltx23-plan", description="LTX-2.3 at a small size", model=MODEL, pipeline="diffusion",
                  dtype="bf16", call=dict(prompt="a drummer", height=256, width=256, num_frames=9,
                                          num_inference_steps=8, guidance_scale=1.0, audio_guidance_scale=1.0))
    plan = memory_plan(recipe, patched=False)
    stages = {stage.name: stage for stage in plan.stages}
    assert list(stages) == ["text encoder", "text connectors", "transformer step, unpatched", "VAE decode",
                            "audio decode"] and all(s.planned for s in plan.stages), plan.table()
    table = plan.table()
    assert "18.99B parameters" in table and "3.17B from LTX-2.3's" in table, table
    vae = 2 * _parameters(AutoencoderKLLTX2Video, LTX23_VIDEO_VAE)  # bf16; its latent statistics are buffers
    assert vae < stages["VAE decode"].weights <= vae + 4 * 2 * 128, (stages["VAE decode"], vae)
    vocoder = _parameters(LTX2VocoderWithBWE, {}) + _parameters(AutoencoderKLLTX2Audio, {})
    assert abs(stages["audio decode"].weights - 2 * vocoder) <= 0.01 * stages["audio decode"].weights, stages
    assert "LTX2VocoderWithBWE" in plan.details["audio_decode"] and "LTX-2.3's video VAE" in plan.details["vae"]
