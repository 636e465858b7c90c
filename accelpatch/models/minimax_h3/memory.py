"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of MiniMax-H3 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`, as diffusers 0.42.1's modular pipeline (modular_pipelines/
minimax_h3) does it: its video VAE encodes 17n + 5 frames into 5n + 2 latents, the transformer sees 40 audio latents
per second on 2 channels as rows beside the video, the default canvas is its own 16:9 one, and its conditioner is a
Qwen3-VL of the 32B's shape. Imports diffusers only for the canvas."""
from __future__ import annotations


def release_config(name: str):
    return {}, "diffusers' MiniMaxH3Transformer3DModel defaults (the release: 56 x 128 heads, hidden 5376)"


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, num_text=case.text_tokens, num_audio=case.audio, video_frames=case.frames,
                height=case.height, width=case.width, audio_channels=2)


def frames(n: int) -> int:
    """The pipeline's frames: ``n`` rounded up to 17k + 5."""
    while n % 17 != 5:
        n += 1
    return n


def latent_frames(n: int) -> int:
    return (n - 5) // 17 * 5 + 2


def audio(frames: int, call) -> int:
    """Audio rows: 40 audio latents per second of 24 fps video, on 2 channels."""
    return round(frames / 24 * 40) * 2


def canvas() -> tuple[int, int, int]:
    """The 16:9 canvas (short edge 768, at most 768 x 1344 pixels) and 124 frames."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    return (*resolve_canvas_size(16, 9, 32, 768, 768 * 1344), 124)


def audio_decode(call, model: str, audio: int):
    """The modular pipeline's audio decode after the video's: its mono ``AutoencoderKLMiniMaxH3Audio`` (diffusers'
    defaults: 32 latent channels, 40 latents a second, a BigVGAN-style decoder to 32 kHz) decodes the two stereo
    channels as two rows of ``audio // 2`` latents each."""
    from accelpatch.models.families import AudioDecodeCase

    return AudioDecodeCase("diffusers:AutoencoderKLMiniMaxH3Audio", (), (32, audio // 2),
                           "diffusers' AutoencoderKLMiniMaxH3Audio defaults", batch_rows=2)


#: MiniMax-H3's conditioner, Qwen3-VL-32B's shape: the fields the release's text_encoder/config.json has (a public
#: conversion check of the release asserts them: 64 layers of width 5,120, feed-forward 25,600, 64 query and 8
#: key-value heads of 128; a 27-layer SigLIP-style vision tower of width 1,152 projecting to 5,120), diffusers' own
#: pipeline agreeing (it reads ``hidden_states[50]`` of shape (1, tokens, 5,120)); vocabulary and rotary base as
#: Qwen3-VL ships them; untied head (the checkpoint stores lm_head.weight)
QWEN3_VL_32B = dict(
    text_config=dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[24, 20, 20],
                                          mrope_interleaved=True)),
    vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120,
                       patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=2304,
                       deepstack_visual_indexes=[8, 16, 24]),
    tie_word_embeddings=False)


def text_encoders(call, model: str = "") -> tuple:
    """The modular pipeline's conditioner: ``Qwen3VLForConditionalGeneration`` loaded whole (its vision tower and
    language-model head too), called as ``text_encoder.model(..., output_hidden_states=True)`` on the prompt's own
    tokens, unpadded (the plan's text tokens), every hidden state kept while it reads the 51st; a text-only
    prompt (reference images would add vision tokens)."""
    from accelpatch.models.families import TextEncoderCase

    return (TextEncoderCase("Qwen3-VL-32B", "transformers:Qwen3VLForConditionalGeneration",
                            "transformers:Qwen3VLConfig", QWEN3_VL_32B, 256,
                            "the release's text_encoder/config.json fields (Qwen3-VL-32B's shape; see "
                            "accelpatch.models.minimax_h3.memory.QWEN3_VL_32B)", output="hidden_states",
                            calls="model", unpadded=True,
                            note="a text-only prompt; its vision tower and head loaded, not run"),)
