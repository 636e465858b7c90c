"""Tiny Wan 2.x models and pipelines, built offline from config dicts.

Config dicts (``WAN_*_CONFIG``), a seeded ``WanTransformer3DModel`` and inputs for one forward, and an offline
``WanPipeline`` (Wan 2.1: one transformer; Wan 2.2: ``transformer`` and ``transformer_2`` split by
``boundary_ratio``) with a tiny UMT5 text encoder, the argument-free ``GemmaTokenizer()`` (a 5-token vocabulary built
offline; the pipeline only needs ids and a mask) and the tiny Wan VAE SANA-Video's tiny pipeline uses. diffusers is
imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import (_build_seeded, _config_of, _finish_tiny_pipeline, _input_dtype_and_device,
                                        _trained)

#: diffusers' fast-test config for ``WanTransformer3DModel`` (2 heads x 12, hidden 24).
WAN_TINY_CONFIG: dict[str, Any] = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)

#: Tiny config with the released head dim 128 (2 heads x 128, hidden 256, 2 layers; ~1.8M parameters): the
#: Sol-Attn kernels' head dim. At the default inputs (4 latent frames of 32 x 32) a forward sees 1,024 tokens
#: (16 blocks of 64), long enough that Sol-Attn routes most block pairs to the approximate path.
WAN_SOL_CONFIG: dict[str, Any] = {**WAN_TINY_CONFIG, "attention_head_dim": 128, "ffn_dim": 256}

#: Wan2.1-T2V-1.3B's released shape (12 heads x 128, 30 layers), for building on the meta device only.
WAN_1_3B_CONFIG: dict[str, Any] = {**WAN_TINY_CONFIG, "num_attention_heads": 12, "attention_head_dim": 128,
                                   "text_dim": 4096, "ffn_dim": 8960, "num_layers": 30, "rope_max_seq_len": 1024}


def tiny_wan_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                         seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``WanTransformer3DModel`` in eval mode (default :data:`WAN_SOL_CONFIG`)."""
    from diffusers import WanTransformer3DModel

    config = {**(WAN_SOL_CONFIG if config is None else dict(config)), **overrides}
    return _build_seeded(WanTransformer3DModel, config, seed=seed, dtype=dtype, device=device)


def wan_transformer_on_meta(config: Mapping[str, Any] | None = None, **overrides: Any):
    """A release-sized ``WanTransformer3DModel`` on the meta device (no weight storage): diffusers' defaults, the
    Wan2.1-14B shape (40 heads x 128, 40 layers), unless ``config`` (e.g. :data:`WAN_1_3B_CONFIG`) says otherwise.
    For inspecting patching at the released shape, not for running."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**{**(config or {}), **overrides})
    return model.eval()


def wan_transformer_inputs(transformer_or_config: Any = None, *, batch_size: int = 1, num_frames: int = 4,
                           height: int = 32, width: int = 32, text_len: int = 8, timestep: float = 500.0,
                           seed: int = 0, dtype: torch.dtype | None = None,
                           device: str | torch.device | None = None, image_len: int = 0) -> dict[str, Any]:
    """Keyword arguments for one forward: latents [B, C, F, H, W] (F x H/2 x W/2 tokens with patch (1, 2, 2)),
    a timestep on diffusers' 0-1000 scale (1000 = noise) and text embeddings [B, text_len, text_dim]; with
    ``image_len``, image-encoder tokens [B, image_len, image_dim] too (Wan 2.1 I2V's CLIP tokens)."""
    config = _config_of(WAN_SOL_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch_size, config["in_channels"], num_frames, height, width, generator=generator)
    text = torch.randn(batch_size, text_len, config["text_dim"], generator=generator)
    inputs = dict(hidden_states=latents.to(device, dtype), timestep=torch.full((batch_size,), timestep, device=device),
                  encoder_hidden_states=text.to(device, dtype), return_dict=True)
    if image_len:
        if not config.get("image_dim"):
            raise ValueError(f"image_len={image_len} needs a transformer with an image embedder (image_dim), "
                             f"this one has image_dim={config.get('image_dim')!r}")
        image = torch.randn(batch_size, image_len, config["image_dim"], generator=generator)
        inputs["encoder_hidden_states_image"] = image.to(device, dtype)
    return inputs


def _tiny_umt5(d_model: int, seed: int):
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(vocab_size=8, d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                       relative_attention_num_buckets=8)).eval()


def tiny_wan_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                      transformer_config: Mapping[str, Any] | None = None, transformer=None, transformer_2=None,
                      two_transformers: bool = False, boundary_ratio: float = 0.5,
                      device: str | torch.device = "cpu", trained: bool = False):
    """A complete offline ``WanPipeline`` with tiny random components (default transformer: :data:`WAN_SOL_CONFIG`).

    ``trained=True`` returns instead the shipped tiny Wan trained on procedural clips (issue #43; 13 frames of
    128 x 256, word-level prompts: call it with :func:`accelpatch.tiny_models.wan_call_kwargs`); the options that
    build random components are refused with it.

    ``two_transformers=True`` (or a ``transformer_2``) builds Wan 2.2's layout: ``transformer`` denoises the steps
    whose timestep is at or above ``boundary_ratio * 1000``, ``transformer_2`` the rest. The text encoder is a
    one-layer ``UMT5EncoderModel`` as wide as the transformer's ``text_dim``; the progress bar is disabled. Call it
    with :func:`wan_pipeline_call_kwargs`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import GemmaTokenizer

    from accelpatch.testing.sana_video import _tiny_wan_vae

    if trained:
        return _trained("wan", "tiny_wan_pipeline", dtype=dtype, device=device, transformer_config=transformer_config,
                        transformer=transformer, transformer_2=transformer_2, two_transformers=two_transformers)
    if transformer is None:
        transformer = tiny_wan_transformer(transformer_config, seed=seed, dtype=dtype)
    if transformer_2 is None and two_transformers:
        transformer_2 = tiny_wan_transformer(transformer_config, seed=seed + 1, dtype=dtype)
    text_encoder = _tiny_umt5(int(transformer.config.text_dim), seed)
    torch.manual_seed(seed)
    vae = _tiny_wan_vae().eval()
    pipe = WanPipeline(tokenizer=GemmaTokenizer(), text_encoder=text_encoder, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer,
                       transformer_2=transformer_2, boundary_ratio=boundary_ratio if transformer_2 is not None
                       else None)
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def wan_pipeline_call_kwargs(num_inference_steps: int = 2, *, prompt: str = "a tiny test video",
                             negative_prompt: str = "", height: int = 128, width: int = 256, num_frames: int = 13,
                             guidance_scale: float = 5.0, seed: int = 0, output_type: str = "pt",
                             max_sequence_length: int = 16) -> dict[str, Any]:
    """Call kwargs for :func:`tiny_wan_pipeline`: 13 frames of 128 x 256 are 4 latent frames of 16 x 32, i.e.
    512 tokens per forward (8 Sol-Attn key blocks of 64; with CFG, two forwards per step), the size the trained
    tiny Wan makes; most of a tiny call's time is the VAE's, which grows with the pixels."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=max_sequence_length)
