"""Tiny HunyuanVideo 1.5 transformers, built offline from config dicts.

A config dict (``HUNYUAN_VIDEO15_SOL_CONFIG``), a seeded ``HunyuanVideo15Transformer3DModel`` and the inputs of
one forward (latents, the two text streams with padding masks, image embeddings: zeros for text-to-video, as the
pipeline passes them). No pipeline: HunyuanVideo 1.5's needs a Qwen2.5-VL text encoder and a ByT5 one. diffusers
is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ._common import _build_seeded, _config_of, _input_dtype_and_device

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
