"""HunyuanVideo 1.5's tiny pipeline for training (:func:`accelpatch.tiny_models.train_family`): how it is built,
what its transformer reads, and how a trained one is called.

Why a module of its own: diffusers' ``HunyuanVideo15Pipeline`` feeds its transformer more than latents and one
text embedding. The Qwen2.5-VL stream (the prompt after the chat template's system prefix, with its mask), the
ByT5 glyph stream (quoted text only: zeros and an all-zero mask for the procedural prompts), image embeddings
(zeros in text-to-video) and, as ``hidden_states``, the latents concatenated with zero condition latents and a zero
mask channel. Training feeds exactly these (:func:`text_inputs`, :func:`model_inputs`), so the trained weights are
called as they learned.

What: the release's classes in small, with the release's pixels per token: an 8x spatial, 4x temporal
``AutoencoderKLHunyuanVideo15`` with 16 latent channels under a transformer of patch 2 (the release: a 16x VAE under
patch 1; a tiny 16x VAE did not hold the clips, docs/tiny-models.md), so 13 x 128 x 256 clips are 4 x 16 x 32
latents and 4 x 8 x 16 = 512 video tokens; 2 heads x 128; a word-level
tokenizer with Qwen's chat template and special tokens (the byte-level test tokenizer made every colour a
sequence of letters); the Qwen stream 16 tokens long after the prefix, the glyph and image streams 4.
"""
from __future__ import annotations

from typing import Any

import torch

from accelpatch.tiny_models import procedural
from accelpatch.tiny_models.shipped import MAX_SEQUENCE_LENGTH

#: the trained tiny transformer: the test config's 2 heads x 128 and RoPE axes, 2 dual-stream blocks, 1 refiner
#: block, patch 2; 33 input channels (16 latent + 16 condition + 1 mask), Qwen text 32 wide, feed-forward 2x
HUNYUAN_VIDEO15_TRANSFORMER_CONFIG: dict[str, Any] = dict(
    in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=128, num_layers=2,
    num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=32,
    text_embed_2_dim=8, image_embed_dim=8, rope_theta=256.0, rope_axes_dim=(16, 56, 56), task_type="t2v")
#: the trained tiny VAE: the release's class at 8x spatial, 4x temporal compression, 16 latent channels, 8 to 32
#: channels wide (1.0M parameters; the class needs its last width a multiple of twice the latent channels), under a
#: transformer of patch 2: the release's 16 pixels per token at a fifth of a tiny 16x VAE's cost a step. **Nothing
#: ships yet** (docs/tiny-models.md): tiny 16x VAEs (32 latent channels, 8-64 wide) kept 22-35 % of the clips'
#: colour saturation at round-trip MSE 0.18, and the transformer trained on one drew no shape; this one reached MSE
#: 0.09-0.12 in 2 x 150 steps at learning rate 1e-3 and did worse in 2 x 700 (MSE 0.12-0.18, 10-23 %); at 3e-4 (the
#: family's default now) one clip a step gave MSE 0.086, 84 %, but yellow shapes back red. Its encoder and decoder
#: fail on a batch of more than one clip in diffusers 0.42 (its mid-block attention mask broadcasts against the
#: batch), so it learns from two clips a step encoded and decoded one per call (``vae_batch_size=2``,
#: ``vae_clips_per_call=1``): MSE 0.067, 93 %, every colour read back. The transformer trained on it still drew 3
#: of 8 prompts' colours: it is what does not ship yet.
HUNYUAN_VIDEO15_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(8, 16, 32, 32), layers_per_block=1,
    spatial_compression_ratio=8, temporal_compression_ratio=4)
#: the glyph (ByT5) and image streams' lengths: the procedural prompts quote no text, and text-to-video's image
#: embeddings are zeros the transformer masks, so both only need to exist
GLYPH_TOKENS = 4
IMAGE_TOKENS = 4
#: classifier-free guidance of the trained pipeline (its guider's scale: the pipeline's call takes none)
GUIDANCE_SCALE = 4.0


#: Qwen's ChatML chat template (what the released tokenizer applies), for the tiny tokenizers
QWEN_CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_word_tokenizer():
    """:func:`accelpatch.tiny_models.train.word_tokenizer` with Qwen's special tokens (``<|im_start|>``,
    ``<|im_end|>``) and chat template, so the pipeline's ``apply_chat_template`` and its system-prefix crop work as
    with the released tokenizer, one token per procedural word."""
    from accelpatch.tiny_models.train import word_tokenizer

    tokenizer = word_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def tiny_qwen25_vl_text(hidden_size: int, tokenizer, seed: int):
    """A randomly initialised two-layer ``Qwen2_5_VLTextModel`` ``hidden_size`` wide (the transformer's
    ``text_embed_dim``): 2 heads, multimodal RoPE sections split over the head's half dim as released (t, h, w).
    The pipeline reads the hidden state two layers before the last: here, the token embeddings."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    if hidden_size % 16:
        raise ValueError(f"text_embed_dim={hidden_size} must be a multiple of 16 (2 heads, 3 RoPE sections)")
    half = hidden_size // 4  # half the head dim of 2 heads
    sections = [half // 4, half // 4, half - 2 * (half // 4)]
    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1e6,
        rope_scaling={"mrope_section": sections, "rope_type": "default", "type": "default"},
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return Qwen2_5_VLTextModel(config).eval()


def tiny_byt5(d_model: int, seed: int):
    """The file-free ``ByT5Tokenizer`` and a one-layer ``T5EncoderModel`` ``d_model`` wide (the transformer's
    ``text_embed_2_dim``) over its vocabulary."""
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    tokenizer = ByT5Tokenizer()
    torch.manual_seed(seed)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=max(d_model // 2, 1),
                                      d_ff=2 * d_model, num_layers=1, num_heads=2,
                                      relative_attention_num_buckets=8)).eval()
    return tokenizer, encoder


def build_hunyuan_video15_pipeline(seed: int = 0, *, vae=None):
    """An untrained tiny ``TinyHunyuanVideo15Pipeline`` (``HunyuanVideo15Pipeline`` that saves its sequence
    lengths): the transformer of :data:`HUNYUAN_VIDEO15_TRANSFORMER_CONFIG`, the VAE of
    :data:`HUNYUAN_VIDEO15_VAE_CONFIG` (or ``vae``), tiny Qwen2.5-VL and ByT5 encoders over
    :func:`chat_word_tokenizer` and ByT5's own tokenizer, the flow-matching Euler scheduler at shift 3 (as it
    trains) and CFG at :data:`GUIDANCE_SCALE`, all seeded."""
    from diffusers import (AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15Transformer3DModel)
    from diffusers.guiders import ClassifierFreeGuidance

    from accelpatch.models.hunyuan_video15.pipeline import TinyHunyuanVideo15Pipeline
    from accelpatch.tiny_models.train import FLOW_SHIFT, _seeded_transformer_and_vae

    transformer, vae = _seeded_transformer_and_vae(seed, HunyuanVideo15Transformer3DModel,
                                                   HUNYUAN_VIDEO15_TRANSFORMER_CONFIG, vae,
                                                   vae_class=AutoencoderKLHunyuanVideo15.__name__,
                                                   vae_config=HUNYUAN_VIDEO15_VAE_CONFIG)
    tokenizer = chat_word_tokenizer()
    widths = HUNYUAN_VIDEO15_TRANSFORMER_CONFIG
    text_encoder = tiny_qwen25_vl_text(int(widths["text_embed_dim"]), tokenizer, seed + 2)
    tokenizer_2, text_encoder_2 = tiny_byt5(int(widths["text_embed_2_dim"]), seed + 2)
    pipe = TinyHunyuanVideo15Pipeline(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer.eval(),
                                      vae=vae.eval(), scheduler=FlowMatchEulerDiscreteScheduler(shift=FLOW_SHIFT),
                                      text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                                      guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE_SCALE))
    pipe.fit_lengths(text=MAX_SEQUENCE_LENGTH, glyph=GLYPH_TOKENS, image=IMAGE_TOKENS)
    return pipe


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
