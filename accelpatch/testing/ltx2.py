"""Tiny LTX-2 audio-video transformers (``LTX2VideoTransformer3DModel``), built offline from config dicts.

Config dicts (``LTX2_*_CONFIG``), a seeded transformer and keyword arguments for one forward (patchified video and
audio latents, text embeddings for both streams, a timestep, the latent grid for the RoPE). No pipeline: LTX-2's
needs a Gemma text encoder, a connector, two VAEs and a vocoder. diffusers is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ._common import _build_seeded, _config_of, _input_dtype_and_device

#: Tiny LTX-2 (2 layers): video 2 heads x 128 (hidden 256, the Sol-Attn kernels' head dim), audio 2 heads x 32
#: (hidden 64). The text cross-attention widths equal each stream's hidden size (the caption projections map the
#: text to them), as in the release (4096 and 2048). At the default inputs (4 latent frames of 16 x 16) the video
#: self-attention sees 1,024 tokens (16 blocks of 64), the audio one 32.
LTX2_TINY_CONFIG: dict[str, Any] = dict(
    in_channels=8,
    out_channels=8,
    num_attention_heads=2,
    attention_head_dim=128,
    cross_attention_dim=256,
    audio_in_channels=4,
    audio_out_channels=4,
    audio_num_attention_heads=2,
    audio_attention_head_dim=32,
    audio_cross_attention_dim=64,
    num_layers=2,
    caption_channels=16,
)

#: LTX-2.3's switches on the tiny shape: per-head gated attention, prompt modulation, the perturbed (STG)
#: processor, split RoPE.
LTX2_3_TINY_CONFIG: dict[str, Any] = {**LTX2_TINY_CONFIG, "gated_attn": True, "audio_gated_attn": True,
                                      "cross_attn_mod": True, "audio_cross_attn_mod": True, "perturbed_attn": True,
                                      "rope_type": "split"}


def tiny_ltx2_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                          seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``LTX2VideoTransformer3DModel`` in eval mode (default :data:`LTX2_TINY_CONFIG`)."""
    from diffusers import LTX2VideoTransformer3DModel

    config = {**(LTX2_TINY_CONFIG if config is None else dict(config)), **overrides}
    return _build_seeded(LTX2VideoTransformer3DModel, config, seed=seed, dtype=dtype, device=device)


def ltx2_transformer_inputs(transformer_or_config: Any = None, *, batch_size: int = 1, num_frames: int = 4,
                            height: int = 16, width: int = 16, audio_num_frames: int = 32, text_len: int = 8,
                            timestep: float = 500.0, seed: int = 0, dtype: torch.dtype | None = None,
                            device: str | torch.device | None = None) -> dict[str, Any]:
    """Keyword arguments for one forward: patchified video latents [B, F*H*W, C] (patch size 1), audio latents
    [B, audio_num_frames, C_audio], text embeddings for each stream [B, text_len, caption_channels], a timestep on
    diffusers' 0-1000 scale (and, for LTX-2.3's prompt modulation, ``sigma`` = timestep / 1000) and the latent grid
    the model builds its RoPE from."""
    config = _config_of(LTX2_TINY_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(batch_size, num_frames * height * width, config["in_channels"], generator=g)
    audio = torch.randn(batch_size, audio_num_frames, config["audio_in_channels"], generator=g)
    text = torch.randn(batch_size, text_len, config["caption_channels"], generator=g)
    audio_text = torch.randn(batch_size, text_len, config["caption_channels"], generator=g)
    inputs = dict(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                  audio_encoder_hidden_states=audio_text)
    inputs = {k: v.to(device, dtype) for k, v in inputs.items()}
    t = torch.full((batch_size,), timestep, device=device)
    return dict(**inputs, timestep=t, sigma=t / 1000.0, num_frames=num_frames, height=height, width=width,
                audio_num_frames=audio_num_frames, return_dict=True)
