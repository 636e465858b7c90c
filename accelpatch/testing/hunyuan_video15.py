"""Tiny HunyuanVideo 1.5 transformers and text-to-video pipelines, built offline from config dicts.

A config dict (``HUNYUAN_VIDEO15_SOL_CONFIG``), a seeded ``HunyuanVideo15Transformer3DModel`` and the inputs of
one forward (latents, the two text streams with padding masks, image embeddings: zeros for text-to-video, as the
pipeline passes them), and an offline ``HunyuanVideo15Pipeline``: a tiny ``Qwen2_5_VLTextModel`` with a byte-level
``Qwen2Tokenizer`` built in memory (Qwen's chat format), a tiny ByT5 (``T5EncoderModel`` with the file-free
``ByT5Tokenizer``) for the quoted glyph text, a tiny ``AutoencoderKLHunyuanVideo15``, the flow-matching scheduler
and classifier-free guidance. diffusers is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import (_build_seeded, _cast_like_from_pretrained, _config_of, _finish_tiny_pipeline,
                      _input_dtype_and_device, _trained)

#: 2 heads x 128 (the released head dim, the Sol-Attn kernels'; RoPE axes 16 + 56 + 56 = 128 as released),
#: 2 dual-stream blocks, 1 refiner block, patch 1 (one token per latent pixel), narrow text/image inputs.
#: ~9.3M parameters (4.2M of them the ByT5 projection's fixed 2048 x 2048 layer).
HUNYUAN_VIDEO15_SOL_CONFIG: dict[str, Any] = dict(
    in_channels=4,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=128,
    num_layers=2,
    num_refiner_layers=1,
    mlp_ratio=1.0,
    patch_size=1,
    patch_size_t=1,
    qk_norm="rms_norm",
    text_embed_dim=16,
    text_embed_2_dim=8,
    image_embed_dim=8,
    rope_theta=256.0,
    rope_axes_dim=(16, 56, 56),
    task_type="t2v",
)


def tiny_hunyuan_video15_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                                     seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``HunyuanVideo15Transformer3DModel`` in eval mode (default
    :data:`HUNYUAN_VIDEO15_SOL_CONFIG`)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    config = {**(HUNYUAN_VIDEO15_SOL_CONFIG if config is None else dict(config)), **overrides}
    return _build_seeded(HunyuanVideo15Transformer3DModel, config, seed=seed, dtype=dtype, device=device)


def hunyuan_video15_transformer_inputs(transformer_or_config: Any = None, *, batch_size: int = 1,
                                       num_frames: int = 4, height: int = 16, width: int = 16, text_len: int = 8,
                                       text_valid: int = 6, text_2_len: int = 4, text_2_valid: int = 3,
                                       image_tokens: int = 4, image: bool = False, timestep: float = 500.0,
                                       seed: int = 0, dtype: torch.dtype | None = None,
                                       device: str | torch.device | None = None) -> dict[str, Any]:
    """Keyword arguments for one forward: latents [B, C, F, H, W] (F x H x W tokens with patch 1), a timestep on
    diffusers' 0-1000 scale in the model's dtype (as the pipeline passes it; the time embedding needs it so), the
    Qwen text stream [B, text_len, text_embed_dim] whose first ``text_valid`` tokens are valid (the mask's 1s), the
    ByT5 stream likewise, and image embeddings [B, image_tokens, image_embed_dim]: zeros unless ``image`` (zeros
    make the model mask every image token, its text-to-video case)."""
    config = _config_of(HUNYUAN_VIDEO15_SOL_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    for name, valid, length in (("text_valid", text_valid, text_len), ("text_2_valid", text_2_valid, text_2_len)):
        if not 0 <= valid <= length:
            raise ValueError(f"{name}={valid} must lie in 0-{length} (the stream's length)")
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch_size, config["in_channels"], num_frames, height, width, generator=generator)
    text = torch.randn(batch_size, text_len, config["text_embed_dim"], generator=generator)
    text_2 = torch.randn(batch_size, text_2_len, config["text_embed_2_dim"], generator=generator)
    images = torch.randn(batch_size, image_tokens, config["image_embed_dim"], generator=generator)
    if not image:
        images = torch.zeros_like(images)
    mask = (torch.arange(text_len) < text_valid).long().expand(batch_size, -1)
    mask_2 = (torch.arange(text_2_len) < text_2_valid).long().expand(batch_size, -1)
    to = lambda x: x.to(device, dtype)  # noqa: E731
    return dict(hidden_states=to(latents), timestep=torch.full((batch_size,), timestep, device=device, dtype=dtype),
                encoder_hidden_states=to(text), encoder_attention_mask=mask.to(device),
                encoder_hidden_states_2=to(text_2), encoder_attention_mask_2=mask_2.to(device),
                image_embeds=to(images), return_dict=True)


#: :data:`HUNYUAN_VIDEO15_SOL_CONFIG` as the text-to-video pipeline feeds it: 4 latent channels in and out, the
#: input being the latents, the (zero) condition latents and a (zero) mask channel concatenated (4 + 4 + 1).
HUNYUAN_VIDEO15_PIPELINE_CONFIG: dict[str, Any] = {**HUNYUAN_VIDEO15_SOL_CONFIG, "in_channels": 9, "out_channels": 4}

#: diffusers' fast-test ``AutoencoderKLHunyuanVideo15`` shape: 4 latent channels, spatial compression 4, temporal 2.
HUNYUAN_VIDEO15_TINY_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
    spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
    upsample_match_channel=False,
)

def _byte_qwen_tokenizer():
    """A ``Qwen2Tokenizer`` whose vocabulary is the 256 byte-level symbols and Qwen's special tokens, no merges
    (every UTF-8 byte one token), with Qwen's ChatML chat template. Built in memory, no files."""
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from accelpatch.tiny_models.hunyuan_video15 import QWEN_CHAT_TEMPLATE

    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    vocab.update({token: len(vocab) + i for i, token in enumerate(specials)})
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_tokens([AddedToken(token, special=True) for token in specials[1:]])
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def tiny_hunyuan_video15_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                                  transformer_config: Mapping[str, Any] | None = None, transformer=None,
                                  guidance_scale: float = 6.0, text_len: int = 64, glyph_len: int = 32,
                                  image_tokens: int = 16, device: str | torch.device = "cpu", trained: bool = False):
    """A complete offline text-to-video ``HunyuanVideo15Pipeline`` (a
    :class:`~accelpatch.models.hunyuan_video15.pipeline.TinyHunyuanVideo15Pipeline`, which saves its sequence
    lengths) with tiny random components (default transformer: :data:`HUNYUAN_VIDEO15_PIPELINE_CONFIG`), progress
    bar off. Call it with :func:`hunyuan_video15_pipeline_call_kwargs`.

    diffusers' pipeline keeps its sequence lengths as attributes (1,000 Qwen tokens after a 108-token system prefix,
    256 ByT5 tokens, for the released tokenizers, and 729 image tokens, zeros in text-to-video, which the transformer
    masks out); here the Qwen stream is ``text_len`` tokens after the system prefix as this tokenizer counts it,
    ByT5's ``glyph_len`` and the image stream ``image_tokens``, so the joint attention stays small. The transformer's
    ``in_channels`` must be ``2 * out_channels + 1`` (latents, condition latents, mask) and ``out_channels`` is
    the VAE's latent channels. ``guidance_scale`` > 1 runs classifier-free guidance (two forwards per step).

    ``trained=True`` returns instead the shipped tiny HunyuanVideo 1.5 trained on procedural clips (issue #43; 13
    frames of 128 x 256, word-level prompts: call it with
    :func:`accelpatch.tiny_models.hunyuan_video15.hunyuan_video15_call_kwargs`); ``transformer_config`` and
    ``transformer`` are refused with it."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler
    from diffusers.guiders import ClassifierFreeGuidance

    from accelpatch.models.hunyuan_video15.pipeline import TinyHunyuanVideo15Pipeline
    from accelpatch.tiny_models.hunyuan_video15 import tiny_byt5, tiny_qwen25_vl_text

    if trained:
        return _trained("hunyuan-video15", "tiny_hunyuan_video15_pipeline", dtype=dtype, device=device,
                        transformer_config=transformer_config, transformer=transformer)
    if transformer is None:
        transformer = tiny_hunyuan_video15_transformer(
            HUNYUAN_VIDEO15_PIPELINE_CONFIG if transformer_config is None else transformer_config,
            seed=seed, dtype=dtype)
    config = transformer.config
    if config.in_channels != 2 * config.out_channels + 1:
        raise ValueError(f"in_channels={config.in_channels} must be 2 * out_channels + 1 = "
                         f"{2 * config.out_channels + 1}: the text-to-video pipeline feeds latents, condition "
                         f"latents and a mask channel")
    for name, value in (("text_len", text_len), ("glyph_len", glyph_len), ("image_tokens", image_tokens)):
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    tokenizer = _byte_qwen_tokenizer()
    text_encoder = tiny_qwen25_vl_text(int(config.text_embed_dim), tokenizer, seed)
    tokenizer_2, text_encoder_2 = tiny_byt5(int(config.text_embed_2_dim), seed)
    torch.manual_seed(seed)
    vae = AutoencoderKLHunyuanVideo15(**{**HUNYUAN_VIDEO15_TINY_VAE_CONFIG,
                                         "latent_channels": int(config.out_channels)}).eval()
    if dtype != torch.float32:
        _cast_like_from_pretrained(text_encoder_2, dtype)
    pipe = TinyHunyuanVideo15Pipeline(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer,
                                      vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                      text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                                      guider=ClassifierFreeGuidance(guidance_scale=guidance_scale))
    # saved in its config, so from_pretrained keeps them; the Qwen prefix counted by this tokenizer
    pipe.fit_lengths(text=text_len, glyph=glyph_len, image=image_tokens)
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def hunyuan_video15_pipeline_call_kwargs(num_inference_steps: int = 2, *,
                                         prompt: str = 'a tiny test video of a sign that says "hello"',
                                         negative_prompt: str = "", height: int = 64, width: int = 64,
                                         num_frames: int = 7, seed: int = 0,
                                         output_type: str = "pt") -> dict[str, Any]:
    """Call kwargs for :func:`tiny_hunyuan_video15_pipeline`: 7 frames of 64 x 64 are 4 latent frames of 16 x 16,
    i.e. 1,024 video tokens per forward (16 blocks of 64) ahead of the text and image tokens; the quoted word in
    the prompt is the glyph text the ByT5 encoder reads."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
                num_inference_steps=num_inference_steps, generator=torch.Generator().manual_seed(seed),
                output_type=output_type)
