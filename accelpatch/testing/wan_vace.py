"""Tiny Wan VACE models and pipelines, built offline from config dicts.

Config dicts (``WAN_VACE_*_CONFIG``), a seeded ``WanVACETransformer3DModel`` and inputs for one forward (the latents,
the text and the control latents the VACE branch takes), and an offline ``WanVACEPipeline`` with the tiny UMT5 text
encoder, tokenizer and Wan VAE of :mod:`accelpatch.testing.wan`, called with a seeded control video, a mask and
seeded text embeddings (:func:`text_embeddings` says why not prompt text). diffusers is imported inside the
functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import _build_seeded, _config_of, _finish_tiny_pipeline, _input_dtype_and_device
from accelpatch.testing.wan import WAN_TINY_CONFIG

#: diffusers' fast-test shape for ``WanVACETransformer3DModel`` (2 heads x 12, hidden 24), with 2 main blocks, a VACE
#: block at each (layers 0 and 1) and the control channels the pipeline feeds with the tiny Wan VAE: 2 x 16 latent
#: channels (inactive, reactive) + 8 x 8 mask channels = 96.
WAN_VACE_TINY_CONFIG: dict[str, Any] = {**WAN_TINY_CONFIG, "vace_layers": [0, 1], "vace_in_channels": 96}

#: :data:`WAN_VACE_TINY_CONFIG` at the released head dim 128 (2 heads x 128, hidden 256): the Sol-Attn kernels' head
#: dim, as :data:`accelpatch.testing.WAN_SOL_CONFIG`.
WAN_VACE_SOL_CONFIG: dict[str, Any] = {**WAN_VACE_TINY_CONFIG, "attention_head_dim": 128, "ffn_dim": 256}


def tiny_wan_vace_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                              seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``WanVACETransformer3DModel`` in eval mode (default :data:`WAN_VACE_SOL_CONFIG`)."""
    from diffusers import WanVACETransformer3DModel

    config = {**(WAN_VACE_SOL_CONFIG if config is None else dict(config)), **overrides}
    return _build_seeded(WanVACETransformer3DModel, config, seed=seed, dtype=dtype, device=device)


def wan_vace_transformer_inputs(transformer_or_config: Any = None, *, batch_size: int = 1, num_frames: int = 4,
                                height: int = 32, width: int = 32, text_len: int = 8, timestep: float = 500.0,
                                seed: int = 0, dtype: torch.dtype | None = None,
                                device: str | torch.device | None = None) -> dict[str, Any]:
    """Keyword arguments for one forward: latents [B, C, F, H, W], a timestep on diffusers' 0-1000 scale, text
    embeddings [B, text_len, text_dim] and control latents [B, vace_in_channels, F, H, W]."""
    config = _config_of(WAN_VACE_SOL_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch_size, config["in_channels"], num_frames, height, width, generator=generator)
    text = torch.randn(batch_size, text_len, config["text_dim"], generator=generator)
    control = torch.randn(batch_size, config["vace_in_channels"], num_frames, height, width, generator=generator)
    return dict(hidden_states=latents.to(device, dtype), timestep=torch.full((batch_size,), timestep, device=device),
                encoder_hidden_states=text.to(device, dtype), control_hidden_states=control.to(device, dtype),
                return_dict=True)


def tiny_wan_vace_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                           transformer_config: Mapping[str, Any] | None = None, transformer=None,
                           device: str | torch.device = "cpu"):
    """A complete offline ``WanVACEPipeline`` with tiny random components (default transformer:
    :data:`WAN_VACE_SOL_CONFIG`): the one-layer UMT5 text encoder as wide as the transformer's ``text_dim``, the
    argument-free ``GemmaTokenizer()`` and the tiny Wan VAE, as :func:`accelpatch.testing.tiny_wan_pipeline` has them;
    the progress bar is disabled. Call it with :func:`wan_vace_pipeline_call_kwargs`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanVACEPipeline
    from transformers import GemmaTokenizer

    from accelpatch.testing.sana_video import _tiny_wan_vae
    from accelpatch.testing.wan import _tiny_umt5

    if transformer is None:
        transformer = tiny_wan_vace_transformer(transformer_config, seed=seed, dtype=dtype)
    text_encoder = _tiny_umt5(int(transformer.config.text_dim), seed)
    torch.manual_seed(seed)
    vae = _tiny_wan_vae().eval()
    pipe = WanVACEPipeline(tokenizer=GemmaTokenizer(), text_encoder=text_encoder, vae=vae,
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer)
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def control_video(num_frames: int, height: int, width: int, *, seed: int = 0) -> tuple[list, list]:
    """A seeded random control video and its mask, as lists of PIL images: the mask's left half is black (those
    pixels condition the generation), its right half white (generated)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    frames = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(num_frames)]
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[:, width // 2:] = 255
    return frames, [Image.fromarray(mask)] * num_frames


def text_embeddings(max_sequence_length: int, text_dim: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random ``prompt_embeds`` and ``negative_prompt_embeds`` [1, max_sequence_length, text_dim]: diffusers
    0.42.1's Wan VACE and Wan Animate pipelines clean prompt text with ``ftfy`` unconditionally (their Wan
    siblings check ``is_ftfy_available()``), and ftfy is no dependency here, so the tiny calls pass embeddings."""
    generator = torch.Generator().manual_seed(seed + 1)
    return {name: torch.randn(1, max_sequence_length, text_dim, generator=generator)
            for name in ("prompt_embeds", "negative_prompt_embeds")}


def wan_vace_pipeline_call_kwargs(num_inference_steps: int = 2, *, height: int = 128, width: int = 256,
                                  num_frames: int = 13, guidance_scale: float = 5.0, seed: int = 0,
                                  output_type: str = "pt", max_sequence_length: int = 16,
                                  conditioning_scale: float = 1.0,
                                  text_dim: int = WAN_VACE_SOL_CONFIG["text_dim"]) -> dict[str, Any]:
    """Call kwargs for :func:`tiny_wan_vace_pipeline`: a seeded control video with a half mask
    (:func:`control_video`) and seeded text embeddings (:func:`text_embeddings`, for a transformer whose
    ``text_dim`` is ``text_dim``); 13 frames of 128 x 256 are 4 latent frames of 16 x 32, i.e. 512 tokens per
    forward (8 Sol-Attn key blocks of 64; with CFG, two forwards per step), as :func:`wan_pipeline_call_kwargs`: the
    VAE encoding the control video twice and decoding the result is most of a tiny call's time."""
    video, mask = control_video(num_frames, height, width, seed=seed)
    return dict(**text_embeddings(max_sequence_length, text_dim, seed=seed), video=video, mask=mask,
                conditioning_scale=conditioning_scale, height=height, width=width, num_frames=num_frames,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=max_sequence_length)
