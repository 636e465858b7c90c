"""Tiny SANA-Video models and pipelines, built offline from config dicts.

Config dicts (``SANA_VIDEO_*_CONFIG``), a seeded ``SanaVideoTransformer3DModel`` and its
forward inputs, a release-sized transformer on the meta device, and a complete tiny
``SanaVideoPipeline`` (tiny Wan VAE, one-layer Gemma-2 text encoder) with its call kwargs.
diffusers and transformers are imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import (_build_seeded, _config_of, _finish_tiny_pipeline, _input_dtype_and_device,
                                        _trained)

# --------------------------------------------------------------------------------------------
# Config dicts
# --------------------------------------------------------------------------------------------

#: diffusers' own fast-test config for ``SanaVideoTransformer3DModel`` (39k parameters,
#: 2 heads x 12). ``cross_attention_dim`` must equal heads x head dim.
SANA_VIDEO_TINY_CONFIG: dict[str, Any] = dict(
    in_channels=16,
    out_channels=16,
    num_attention_heads=2,
    attention_head_dim=12,
    num_layers=2,
    num_cross_attention_heads=2,
    cross_attention_head_dim=12,
    cross_attention_dim=24,
    caption_channels=8,
    mlp_ratio=2.5,
    dropout=0.0,
    attention_bias=False,
    sample_size=8,
    patch_size=(1, 2, 2),
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)

#: Tiny config with the released head dim (112), so head-dim-sensitive fast paths apply
#: (2 heads x 112, ~2.4M parameters).
SANA_VIDEO_RELEASE_LIKE_CONFIG: dict[str, Any] = {
    **SANA_VIDEO_TINY_CONFIG,
    "attention_head_dim": 112,
    "cross_attention_head_dim": 112,
    "cross_attention_dim": 224,
}

#: A little bigger, for CPU benchmarks: 4 heads x 112, 4 layers (16.8M parameters). One float32
#: forward on one CPU thread: ~35 ms at latents (1, 16, 3, 8, 8), ~75 ms at (1, 16, 3, 16, 16).
SANA_VIDEO_MEDIUM_CONFIG: dict[str, Any] = {
    **SANA_VIDEO_TINY_CONFIG,
    "num_attention_heads": 4,
    "attention_head_dim": 112,
    "num_cross_attention_heads": 4,
    "cross_attention_head_dim": 112,
    "cross_attention_dim": 448,
    "num_layers": 4,
    "caption_channels": 32,
    "sample_size": 32,
    "rope_max_seq_len": 64,
}

#: The released SANA-Video 2B shape (diffusers' constructor defaults): 20 heads x 112 = 2240
#: wide, 20 layers, Gemma-2 captions (2304). Only ever build this on the meta device.
SANA_VIDEO_RELEASE_CONFIG: dict[str, Any] = dict(
    in_channels=16,
    out_channels=16,
    num_attention_heads=20,
    attention_head_dim=112,
    num_layers=20,
    num_cross_attention_heads=20,
    cross_attention_head_dim=112,
    cross_attention_dim=2240,
    caption_channels=2304,
    mlp_ratio=2.5,
    sample_size=30,
    patch_size=(1, 2, 2),
    norm_elementwise_affine=False,
    norm_eps=1e-6,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=1024,
)


def tiny_sana_video_transformer(
    config: Mapping[str, Any] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **overrides: Any,
):
    """A randomly initialised ``SanaVideoTransformer3DModel`` in eval mode.

    ``config`` defaults to :data:`SANA_VIDEO_TINY_CONFIG`; keyword ``overrides`` replace single
    entries. Weights are drawn after ``torch.manual_seed(seed)``, so equal arguments give equal
    weights.
    """
    from diffusers import SanaVideoTransformer3DModel

    cfg = {**(SANA_VIDEO_TINY_CONFIG if config is None else config), **overrides}
    return _build_seeded(SanaVideoTransformer3DModel, cfg, seed=seed, dtype=dtype, device=device)


def sana_video_transformer_inputs(
    transformer_or_config: Any,
    *,
    batch_size: int = 1,
    num_frames: int = 3,
    height: int = 8,
    width: int = 8,
    text_len: int = 6,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    with_mask: bool = False,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Keyword arguments for one ``SanaVideoTransformer3DModel`` forward.

    Returns ``hidden_states`` (B, in_channels, F, H, W) latents, ``encoder_hidden_states``
    (B, text_len, caption_channels), ``timestep`` (B,) on the 0-1000 scale, and with
    ``with_mask=True`` an ``encoder_attention_mask`` (B, text_len) of ones whose batch item b
    has its last b text tokens masked out (0), so per-item masking is exercised.
    ``height``/``width`` are latent sizes and must be multiples of the spatial patch.
    ``dtype``/``device`` default to the model's (float32/CPU for a config dict).
    Use as ``model(**inputs).sample``, which has the shape of ``hidden_states``.
    """
    config = _config_of(transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config, dtype, device)
    in_channels = int(config.get("in_channels", 16))
    caption_channels = int(config.get("caption_channels", 2304))
    patch = tuple(config.get("patch_size", (1, 2, 2)))
    if num_frames % patch[0] or height % patch[1] or width % patch[2]:
        raise ValueError(
            f"latent size (F={num_frames}, H={height}, W={width}) is not divisible by patch_size {patch}"
        )
    if with_mask and text_len < batch_size:
        raise ValueError(f"with_mask needs text_len >= batch_size, got {text_len} < {batch_size}")
    g = torch.Generator().manual_seed(seed)
    inputs = {
        "hidden_states": torch.randn(batch_size, in_channels, num_frames, height, width, generator=g),
        "encoder_hidden_states": torch.randn(batch_size, text_len, caption_channels, generator=g),
        "timestep": torch.rand(batch_size, generator=g) * 1000.0,
    }
    inputs = {k: v.to(device=device, dtype=dtype) for k, v in inputs.items()}
    if with_mask:
        mask = torch.ones(batch_size, text_len, dtype=torch.long)
        for b in range(1, batch_size):
            mask[b, text_len - b :] = 0
        inputs["encoder_attention_mask"] = mask.to(device)
    return inputs


def sana_video_transformer_on_meta(num_layers: int = 20, **config: Any):
    """A release-sized ``SanaVideoTransformer3DModel`` on the meta device (no weight storage).

    Defaults to :data:`SANA_VIDEO_RELEASE_CONFIG` (20 heads x 112, 2240 wide, 20 layers, ~2B
    parameters), with ``config`` overriding entries. Parameters are ``is_meta``: use it to time
    or inspect patching (module discovery, processor swaps) at the released shape, not to run.
    """
    from diffusers import SanaVideoTransformer3DModel

    cfg = {**SANA_VIDEO_RELEASE_CONFIG, "num_layers": num_layers, **config}
    with torch.device("meta"):
        model = SanaVideoTransformer3DModel(**cfg)
    return model.eval()


def _tiny_wan_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )


def tiny_sana_video_pipeline(
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    transformer_config: Mapping[str, Any] | None = None,
    transformer=None,
    device: str | torch.device = "cpu",
    trained: bool = False,
):
    """A complete offline ``SanaVideoPipeline`` with tiny random components.

    ``trained=True`` returns instead the shipped tiny SANA-Video trained on procedural clips (issue #43; 13 frames
    of 128 x 256, word-level prompts, flow DPM-Solver++: call it with
    :func:`accelpatch.tiny_models.shipped.sana_video_call_kwargs`); ``transformer_config`` and ``transformer`` are
    refused with it.

    Components: the tiny transformer (``transformer`` if given, else built from
    ``transformer_config``, default :data:`SANA_VIDEO_TINY_CONFIG`; a given transformer keeps
    its dtype), a tiny ``AutoencoderKLWan``
    (z_dim 16, 4x temporal / 8x spatial compression), a one-layer ``Gemma2Model`` whose width
    equals the transformer's ``caption_channels``, the argument-free ``GemmaTokenizer()`` (a
    5-token vocabulary built offline), and ``DPMSolverMultistepScheduler()``. The progress bar
    is disabled. Call it with :func:`sana_video_pipeline_call_kwargs`.
    """
    from diffusers import DPMSolverMultistepScheduler, SanaVideoPipeline
    from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

    if trained:
        return _trained("sana-video", "tiny_sana_video_pipeline", dtype=dtype, device=device,
                        transformer_config=transformer_config, transformer=transformer)
    if transformer is None:
        transformer = tiny_sana_video_transformer(transformer_config, seed=seed, dtype=dtype)
    caption_channels = int(transformer.config.caption_channels)
    torch.manual_seed(seed)
    vae = _tiny_wan_vae()
    torch.manual_seed(seed)
    text_encoder = Gemma2Model(
        Gemma2Config(
            head_dim=16,
            hidden_size=caption_channels,
            intermediate_size=64,
            num_attention_heads=2,
            num_hidden_layers=1,
            num_key_value_heads=2,
            vocab_size=8,
            attn_implementation="eager",
        )
    )
    pipe = SanaVideoPipeline(
        tokenizer=GemmaTokenizer(),
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        transformer=transformer,
        scheduler=DPMSolverMultistepScheduler(),
    )
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def sana_video_pipeline_call_kwargs(
    num_inference_steps: int = 2,
    *,
    prompt: str = "a tiny test video",
    negative_prompt: str = "",
    height: int = 32,
    width: int = 32,
    frames: int = 9,
    guidance_scale: float = 4.5,
    max_sequence_length: int = 16,
    seed: int = 0,
    output_type: str = "pt",
) -> dict[str, Any]:
    """Keyword arguments for a standard tiny ``SanaVideoPipeline`` call.

    32x32, 9 frames (3 latent frames), 16 text tokens, no prompt rewriting
    (``complex_human_instruction=[]``), no resolution binning (it only accepts released
    sample sizes). ``guidance_scale > 1`` turns CFG on, which diffusers runs batched: one
    transformer forward per step with B = 2. A fresh ``generator`` seeded with ``seed`` is
    included, so repeated calls are bit-identical. With ``output_type="pt"`` the result's
    ``.frames`` is (1, frames, 3, height, width) in [0, 1].
    """
    return dict(
        prompt=prompt,
        negative_prompt=negative_prompt,
        height=height,
        width=width,
        frames=frames,
        num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale,
        max_sequence_length=max_sequence_length,
        complex_human_instruction=[],
        use_resolution_binning=False,
        output_type=output_type,
        generator=torch.Generator().manual_seed(seed),
    )
