"""HunyuanVideo 1.5's tiny pipeline for training (:func:`accelpatch.tiny_models.train_family`): how it is built,
what its transformer reads, and how a trained one is called.

Why a module of its own: diffusers' ``HunyuanVideo15Pipeline`` feeds its transformer more than latents and one
text embedding. The Qwen2.5-VL stream (the prompt after the chat template's system prefix, with its mask), the
ByT5 glyph stream (quoted text only: zeros and an all-zero mask for the procedural prompts), image embeddings
(zeros in text-to-video) and, as ``hidden_states``, the latents concatenated with zero condition latents and a zero
mask channel. Training feeds exactly these (:func:`text_inputs`, :func:`model_inputs`), so the trained weights are
called as they learned.

What: the release's shape in small: a 16x spatial, 4x temporal ``AutoencoderKLHunyuanVideo15`` with 32 latent
channels and patch 1, so 13 x 128 x 256 clips are 4 x 8 x 16 = 512 video tokens; 2 heads x 128; a word-level
tokenizer with Qwen's chat template and special tokens (the byte-level test tokenizer made every colour a
sequence of letters); the Qwen stream 16 tokens long after the prefix, the glyph and image streams 4.
"""
from __future__ import annotations

from typing import Any

import torch

from accelpatch.tiny_models import procedural
from accelpatch.tiny_models.shipped import MAX_SEQUENCE_LENGTH

#: the trained tiny transformer: the test config's 2 heads x 128 and RoPE axes, 2 dual-stream blocks, 1 refiner
#: block, patch 1; 65 input channels (32 latent + 32 condition + 1 mask), Qwen text 32 wide, feed-forward 2x
HUNYUAN_VIDEO15_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    in_channels=65, out_channels=32, num_attention_heads=2, attention_head_dim=128, num_layers=2,
    num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=32,
    text_embed_2_dim=8, image_embed_dim=8, rope_theta=256.0, rope_axes_dim=(16, 56, 56), task_type="t2v")
#: the trained tiny VAE: the release's class, compression (16x spatial, 4x temporal) and 32 latent channels, 8 to
#: 64 channels wide (~2.6M parameters; the class needs its last width a multiple of twice the latent channels).
#: **Not yet good enough to ship** (docs/tiny-models.md): after two passes it keeps 23 % of the clips' colour
#: saturation, round-trip MSE 0.18 (8 latent channels, 16 wide, 0.4M: 26 %, 0.17); a 300-step probe reconstructs
#: even the shape clips at MSE ~0.1 with 36 % of their saturation, where Wan's 8x VAE reaches 0.01-0.03. Its encoder
#: fails on a batch of more than one clip in diffusers 0.42 (its mid-block attention mask broadcasts against the
#: batch), so it trains one clip per step (``vae_batch_size=1``).
HUNYUAN_VIDEO15_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=32, block_out_channels=(8, 16, 16, 32, 64), layers_per_block=1,
    spatial_compression_ratio=16, temporal_compression_ratio=4)
#: the glyph (ByT5) and image streams' lengths: the procedural prompts quote no text, and text-to-video's image
#: embeddings are zeros the transformer masks, so both only need to exist
GLYPH_TOKENS = 4
IMAGE_TOKENS = 4
#: classifier-free guidance of the trained pipeline (its guider's scale: the pipeline's call takes none)
GUIDANCE_SCALE = 4.0


def chat_word_tokenizer():
    """:func:`accelpatch.tiny_models.train.word_tokenizer` with Qwen's special tokens (``<|im_start|>``,
    ``<|im_end|>``) and chat template, so the pipeline's ``apply_chat_template`` and its system-prefix crop work as
    with the released tokenizer, one token per procedural word."""
    from accelpatch.testing.hunyuan_video15 import QWEN_CHAT_TEMPLATE
    from accelpatch.tiny_models.train import word_tokenizer

    tokenizer = word_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def build_hunyuan_video15_pipeline(seed: int = 0, *, vae=None):
    """An untrained tiny ``TinyHunyuanVideo15Pipeline`` (``HunyuanVideo15Pipeline`` that saves its sequence
    lengths): the transformer of :data:`HUNYUAN_VIDEO15_TRANSFORMER_CONFIG`, the VAE of
    :data:`HUNYUAN_VIDEO15_VAE_CONFIG` (or ``vae``), the tiny Qwen2.5-VL and ByT5 encoders of the test pipeline over
    :func:`chat_word_tokenizer`, the flow-matching Euler scheduler at shift 3 (as it trains) and CFG at
    :data:`GUIDANCE_SCALE`, all seeded."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    from accelpatch.testing.hunyuan_video15 import tiny_hunyuan_video15_pipeline
    from accelpatch.tiny_models.train import FLOW_SHIFT, _seeded_transformer_and_vae

    transformer, vae = _seeded_transformer_and_vae(seed, HunyuanVideo15Transformer3DModel,
                                                   HUNYUAN_VIDEO15_TRANSFORMER_CONFIG, vae,
                                                   vae_class=AutoencoderKLHunyuanVideo15.__name__,
                                                   vae_config=HUNYUAN_VIDEO15_VAE_CONFIG)
    return tiny_hunyuan_video15_pipeline(seed=seed + 2, transformer=transformer.eval(), vae=vae,
                                         tokenizer=chat_word_tokenizer(), guidance_scale=GUIDANCE_SCALE,
                                         text_len=MAX_SEQUENCE_LENGTH, glyph_len=GLYPH_TOKENS,
                                         image_tokens=IMAGE_TOKENS, flow_shift=FLOW_SHIFT)


def text_inputs(pipe, prompts: list[str], encode_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The transformer's text-side inputs for ``prompts``, one row each, as the pipeline's call builds them: both
    streams with their masks from ``encode_prompt`` and the zero image embeddings of text-to-video."""
    embeds, mask, glyph, glyph_mask = pipe.encode_prompt(prompts, device=torch.device("cpu"), batch_size=len(prompts),
                                                         **encode_kwargs)
    images = torch.zeros(len(prompts), pipe.vision_num_semantic_tokens, pipe.vision_states_dim, dtype=embeds.dtype)
    return dict(encoder_hidden_states=embeds, encoder_attention_mask=mask, encoder_hidden_states_2=glyph,
                encoder_attention_mask_2=glyph_mask, image_embeds=images)


def model_inputs(latents: torch.Tensor) -> dict[str, torch.Tensor]:
    """``hidden_states`` as text-to-video builds it: the latents, zero condition latents and a zero mask channel."""
    mask = latents.new_zeros(latents.shape[0], 1, *latents.shape[2:])
    return {"hidden_states": torch.cat([latents, torch.zeros_like(latents), mask], dim=1)}


def hunyuan_video15_call_kwargs(prompt: str = "a red square moves left", *, num_inference_steps: int = 8,
                                seed: int = 0, negative_prompt: str = "", output_type: str = "pt") -> dict[str, Any]:
    """Call kwargs for a trained tiny HunyuanVideo 1.5 pipeline at its training size: 13 frames of 128 x 256 (512
    tokens per forward). Its guidance is its guider's (:data:`GUIDANCE_SCALE`; the pipeline's call takes none) and
    its sequence lengths are in its config."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=procedural.VIDEO_HEIGHT,
                width=procedural.VIDEO_WIDTH, num_frames=procedural.VIDEO_FRAMES,
                num_inference_steps=num_inference_steps, generator=torch.Generator().manual_seed(seed),
                output_type=output_type)
