"""Tiny Wan Animate models and pipelines, built offline from config dicts.

Config dicts (``WAN_ANIMATE_*_CONFIG``), a seeded ``WanAnimateTransformer3DModel`` and inputs for one forward (the
latents with the reference frame, the pose latents, the face video, text and CLIP image embeddings), and an offline
``WanAnimatePipeline`` with the tiny UMT5 text encoder, tokenizer and Wan VAE of :mod:`accelpatch.testing.wan` and a
tiny CLIP vision encoder, called with seeded reference image, pose and face videos and seeded text embeddings
(:func:`accelpatch.testing.wan_vace.text_embeddings` says why not prompt text). diffusers is imported inside the
functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import _build_seeded, _config_of, _finish_tiny_pipeline, _input_dtype_and_device
from accelpatch.testing.wan import WAN_TINY_CONFIG
from accelpatch.testing.wan_vace import text_embeddings

#: diffusers' fast-test shape for ``WanAnimateTransformer3DModel`` (2 heads x 12, hidden 24, 2 blocks, a face adapter
#: after block 0, the small motion encoder), with the latent channels of the tiny Wan VAE (16: in_channels 2 x 16 + 4)
#: and a 16-wide CLIP image embedding.
WAN_ANIMATE_TINY_CONFIG: dict[str, Any] = {
    **WAN_TINY_CONFIG, "in_channels": 36, "latent_channels": 16, "out_channels": 16, "image_dim": 16,
    "motion_encoder_channel_sizes": {"4": 16, "8": 16, "16": 16}, "motion_encoder_size": 16, "motion_style_dim": 8,
    "motion_dim": 4, "motion_encoder_dim": 16, "face_encoder_hidden_dim": 16, "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 2}

#: :data:`WAN_ANIMATE_TINY_CONFIG` at the released head dim 128 (2 heads x 128, hidden 256): the Sol-Attn kernels'
#: head dim, as :data:`accelpatch.testing.WAN_SOL_CONFIG`.
WAN_ANIMATE_SOL_CONFIG: dict[str, Any] = {**WAN_ANIMATE_TINY_CONFIG, "attention_head_dim": 128, "ffn_dim": 256}


def tiny_wan_animate_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                                 seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``WanAnimateTransformer3DModel`` in eval mode (default :data:`WAN_ANIMATE_SOL_CONFIG`)."""
    from diffusers import WanAnimateTransformer3DModel

    config = {**(WAN_ANIMATE_SOL_CONFIG if config is None else dict(config)), **overrides}
    return _build_seeded(WanAnimateTransformer3DModel, config, seed=seed, dtype=dtype, device=device)


def face_frames(latent_frames: int) -> int:
    """The face-video frames that go with ``latent_frames`` latent frames (the reference frame included): the face
    encoder keeps one motion frame per 4 video frames and the model prepends one for the reference, and its face
    adapter needs one motion frame per latent frame."""
    return 4 * (latent_frames - 2) + 1


def wan_animate_transformer_inputs(transformer_or_config: Any = None, *, batch_size: int = 1, num_frames: int = 4,
                                   height: int = 32, width: int = 32, text_len: int = 8, image_len: int = 8,
                                   timestep: float = 500.0, seed: int = 0, dtype: torch.dtype | None = None,
                                   device: str | torch.device | None = None) -> dict[str, Any]:
    """Keyword arguments for one forward: latents [B, 2C + 4, F, H, W] (``num_frames`` >= 2 latent frames, the first
    the reference), a timestep on diffusers' 0-1000 scale, text embeddings [B, text_len, text_dim], CLIP image
    embeddings [B, image_len, image_dim], pose latents [B, C, F - 1, H, W] and a face video
    [B, 3, :func:`face_frames`, S, S] (S: ``motion_encoder_size``)."""
    config = _config_of(WAN_ANIMATE_SOL_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    generator = torch.Generator().manual_seed(seed)
    size = config["motion_encoder_size"]
    tensors = dict(
        hidden_states=torch.randn(batch_size, config["in_channels"], num_frames, height, width, generator=generator),
        encoder_hidden_states=torch.randn(batch_size, text_len, config["text_dim"], generator=generator),
        encoder_hidden_states_image=torch.randn(batch_size, image_len, config["image_dim"], generator=generator),
        pose_hidden_states=torch.randn(batch_size, config["latent_channels"], num_frames - 1, height, width,
                                       generator=generator),
        face_pixel_values=torch.rand(batch_size, 3, face_frames(num_frames), size, size, generator=generator) * 2 - 1)
    return dict({name: t.to(device, dtype) for name, t in tensors.items()},
                timestep=torch.full((batch_size,), timestep, device=device), return_dict=True)


def _tiny_clip_vision(hidden_size: int, seed: int):
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(seed)
    return CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=hidden_size, projection_dim=hidden_size, num_hidden_layers=1, num_attention_heads=2, image_size=4,
        intermediate_size=16, patch_size=1)).eval()


def tiny_wan_animate_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                              transformer_config: Mapping[str, Any] | None = None, transformer=None,
                              device: str | torch.device = "cpu"):
    """A complete offline ``WanAnimatePipeline`` with tiny random components (default transformer:
    :data:`WAN_ANIMATE_SOL_CONFIG`): the one-layer UMT5 text encoder, the argument-free ``GemmaTokenizer()`` and the
    tiny Wan VAE of :func:`accelpatch.testing.tiny_wan_pipeline`, and a one-layer CLIP vision encoder (4 x 4 images,
    as wide as the transformer's ``image_dim``) with its image processor; the progress bar is disabled. Call it with
    :func:`wan_animate_pipeline_call_kwargs`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanAnimatePipeline
    from transformers import GemmaTokenizer

    try:  # the PIL processor: CLIPImageProcessor says it falls back to it where torchvision is missing
        from transformers import CLIPImageProcessorPil as CLIPImageProcessor
    except ImportError:
        from transformers import CLIPImageProcessor

    from accelpatch.testing.sana_video import _tiny_wan_vae
    from accelpatch.testing.wan import _tiny_umt5

    if transformer is None:
        transformer = tiny_wan_animate_transformer(transformer_config, seed=seed, dtype=dtype)
    text_encoder = _tiny_umt5(int(transformer.config.text_dim), seed)
    image_encoder = _tiny_clip_vision(int(transformer.config.image_dim), seed)
    torch.manual_seed(seed)
    vae = _tiny_wan_vae().eval()
    pipe = WanAnimatePipeline(tokenizer=GemmaTokenizer(), text_encoder=text_encoder, vae=vae,
                              scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                              image_processor=CLIPImageProcessor(crop_size=4, size=4), image_encoder=image_encoder,
                              transformer=transformer)
    if dtype != torch.float32:
        image_encoder.to(dtype)
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def _frames(count: int, height: int, width: int, rng) -> list:
    import numpy as np
    from PIL import Image

    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def wan_animate_pipeline_call_kwargs(num_inference_steps: int = 2, *, height: int = 128, width: int = 256,
                                     num_frames: int = 13,
                                     face_size: int = WAN_ANIMATE_SOL_CONFIG["motion_encoder_size"],
                                     guidance_scale: float = 1.0, seed: int = 0, output_type: str = "pt",
                                     max_sequence_length: int = 16,
                                     text_dim: int = WAN_ANIMATE_SOL_CONFIG["text_dim"]) -> dict[str, Any]:
    """Call kwargs for :func:`tiny_wan_animate_pipeline` (``mode="animate"``, one segment of ``num_frames``): a seeded
    reference image, pose video and face video (``face_size`` square: the transformer's ``motion_encoder_size``) and
    seeded text embeddings; 13 frames of 128 x 256 are 4 latent frames of 16 x 32 and the reference frame, i.e.
    640 tokens per forward (guidance 1.0, diffusers' default for Animate: one forward per step); the VAE encoding the
    conditioning videos and decoding the result is most of a tiny call's time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return dict(**text_embeddings(max_sequence_length, text_dim, seed=seed),
                image=_frames(1, height, width, rng)[0], pose_video=_frames(num_frames, height, width, rng),
                face_video=_frames(num_frames, face_size, face_size, rng), height=height, width=width,
                segment_frame_length=num_frames, mode="animate", num_inference_steps=num_inference_steps,
                guidance_scale=guidance_scale, generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=max_sequence_length)
