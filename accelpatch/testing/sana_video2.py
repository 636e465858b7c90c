"""Tiny SANA-Video 2.0 models, built offline from config dicts.

Config dicts (``SANA_VIDEO2_*_CONFIG``; the release sizes are the model's defaults), a seeded
``SanaVideo2Transformer3DModel`` with non-trivial Attention Residual weights (the release initialises them to
zero, which makes every mix a plain mean and would hide mixing bugs), its forward inputs, and the release-sized
models on the meta device. diffusers is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import (_build_seeded, _cast_like_from_pretrained, _config_of, _input_dtype_and_device,
                                        _trained)

#: Every structural feature of the release at 404,612 parameters (``sana_video2_checkpoint.md`` §5): 4 layers with
#: the anchor at 3, linear head dim 16 / softmax head dim 32 (all three RoPE axes non-empty), Attention Residual
#: groups {0, 1, 2} and {3}, a caption of 8 tokens × 32 channels.
SANA_VIDEO2_TINY_CONFIG: dict[str, Any] = dict(
    in_channels=8, hidden_size=64, depth=4, num_heads=4, linear_head_dim=16, softmax_head_dim=32,
    softmax_ratio=0.25, mlp_ratio=4.0, caption_channels=32, model_max_length=8, attn_res_block_size=3,
    input_size=2,
)

#: The release's head dims (128 linear / 256 softmax) at a CPU-friendly width: 2 anchors in 8 layers, groups of 4
#: (11.7M parameters; one float32 forward at latents [2, 16, 2, 8, 8] takes ~0.1 s on one thread), for benchmarks
#: and head-dim-sensitive fast paths.
SANA_VIDEO2_MEDIUM_CONFIG: dict[str, Any] = dict(
    in_channels=16, hidden_size=256, depth=8, num_heads=2, linear_head_dim=128, softmax_head_dim=256,
    softmax_ratio=0.25, mlp_ratio=4.0, caption_channels=64, model_max_length=16, attn_res_block_size=4,
    input_size=2,
)

#: The released 5B model (the class defaults) and the 14B one.
SANA_VIDEO2_5B_CONFIG: dict[str, Any] = {}
SANA_VIDEO2_14B_CONFIG: dict[str, Any] = dict(hidden_size=4096, depth=40, num_heads=32)


def tiny_sana_video2_transformer(config: Mapping[str, Any] | None = None, *, dtype: torch.dtype = torch.float32,
                                 seed: int = 0, device: str | torch.device = "cpu", **overrides: Any):
    """A randomly initialised ``SanaVideo2Transformer3DModel`` in eval mode (``config`` defaults to
    :data:`SANA_VIDEO2_TINY_CONFIG`; ``overrides`` replace single entries). The Attention Residual projections are
    drawn too (N(0, 1)), so that mixing depends on them."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel

    cfg = {**(SANA_VIDEO2_TINY_CONFIG if config is None else config), **overrides}
    # built where it will run (under ``with torch.device("cuda")`` a 5B model is not initialised on the CPU), the
    # projections drawn on the CPU with a CPU generator (explicitly: the default device may be another) and copied
    model = _build_seeded(SanaVideo2Transformer3DModel, cfg, seed=seed, dtype=torch.float32, device=device)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for proj in (model.attn_res.attn_proj, model.attn_res.mlp_proj, model.attn_res.final_proj):
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=generator, device="cpu"))
    if dtype != torch.float32:
        _cast_like_from_pretrained(model, dtype)
    return model.to(device).eval()


def sana_video2_transformer_inputs(transformer_or_config: Any, *, batch_size: int = 2, frames: int = 3,
                                   height: int = 4, width: int = 6, text_len: int | None = None,
                                   per_frame_timesteps: bool = False, seed: int = 0, dtype: torch.dtype | None = None,
                                   device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """Keyword arguments for one forward: latents [B, C, F, H, W], a caption [B, L, caption_channels] with the last
    tokens of the second item masked out, and timesteps on the 0-1000 scale with a fractional part (the model
    truncates them). ``per_frame_timesteps``: [B, 1, F, 1, 1] with frame 0 clean (image-to-video)."""
    config = _config_of(transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config, dtype, device)
    text_len = int(config.get("model_max_length", 300)) if text_len is None else text_len
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch_size, config.get("in_channels", 128), frames, height, width, generator=g)
    caption = torch.randn(batch_size, text_len, config.get("caption_channels", 2304), generator=g)
    mask = torch.ones(batch_size, text_len, dtype=torch.long)
    if batch_size > 1:
        mask[1, max(1, text_len * 5 // 8):] = 0
    if per_frame_timesteps:
        timestep = (torch.rand(batch_size, 1, frames, 1, 1, generator=g) * 1000.0)
        timestep[:, :, 0] = 0.0
    else:
        timestep = torch.tensor([999.0, 500.7] + [250.3] * max(0, batch_size - 2))[:batch_size]
    return dict(hidden_states=latents.to(device, dtype), encoder_hidden_states=caption.to(device, dtype),
                timestep=timestep.to(device), encoder_attention_mask=mask.to(device))


def sana_video2_transformer_on_meta(config: Mapping[str, Any] | None = None, **overrides: Any):
    """A release-sized model (``config`` defaults to the 5B release) with every tensor on the meta device: shapes
    and parameter counts without memory."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel

    with torch.device("meta"):
        return SanaVideo2Transformer3DModel(**{**(SANA_VIDEO2_5B_CONFIG if config is None else config), **overrides})


# --------------------------------------------------------------------------------------------
# Pipeline
# --------------------------------------------------------------------------------------------

#: A tiny ``AutoencoderKLLTX2Video`` with the release's stride (8, 32, 32): patch 4 and three spatial and three
#: temporal 2x stages, 8 channels wide (decoding a 2 x 2 x 2 latent to 9 x 64 x 64 takes ~10 ms on one thread).
#: ``latent_channels`` is set to the transformer's ``in_channels`` by :func:`tiny_sana_video2_pipeline`.
SANA_VIDEO2_TINY_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=8,
    block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 16, 32),
    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
    spatio_temporal_scaling=(True, True, True, True), decoder_spatio_temporal_scaling=(True, True, True),
    decoder_inject_noise=(False, False, False, False),
    downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    upsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal"),
    upsample_residual=(True, True, True), upsample_factor=(2, 2, 2),
    patch_size=4, patch_size_t=1, spatial_compression_ratio=32, temporal_compression_ratio=8,
)

#: The same tiny VAE with 8x spatial compression (patch size 1): many latent tokens at small frame sizes, so quality
#: checks over decoded frames stay cheap (16 x 16 x 3 latents = 768 tokens decode to 17 x 128 x 128 frames).
SANA_VIDEO2_TINY_VAE_8X_CONFIG: dict[str, Any] = {**SANA_VIDEO2_TINY_VAE_CONFIG, "patch_size": 1,
                                                  "spatial_compression_ratio": 8}


def tiny_sana_video2_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                              device: str | torch.device = "cpu", transformer_config: Mapping[str, Any] | None = None,
                              vae_config: Mapping[str, Any] | None = None, trained: bool = False):
    """A complete offline ``SanaVideo2Pipeline`` with tiny random components, progress bar off.

    ``trained=True`` returns instead the shipped tiny SANA-Video 2.0 trained on procedural clips (issue #43; 13
    frames of 128 x 256, word-level prompts: call it with
    :func:`accelpatch.tiny_models.shipped.sana_video2_call_kwargs`); ``transformer_config`` and ``vae_config`` are
    refused with it.

    Components: :func:`tiny_sana_video2_transformer` (``transformer_config``, default
    :data:`SANA_VIDEO2_TINY_CONFIG`), a tiny ``AutoencoderKLLTX2Video`` with the release stride (8, 32, 32)
    (``vae_config``, default :data:`SANA_VIDEO2_TINY_VAE_CONFIG`; latent channels = the transformer's
    ``in_channels``), a one-layer
    ``Gemma2Model`` whose width is the transformer's ``caption_channels``, the argument-free ``GemmaTokenizer()``
    (5 tokens, built offline: every text is one ``<unk>``, so prompts do not change the output; build a pipeline
    with a real vocabulary to test prompt handling) and the release scheduler (flow DPM-Solver++, shift 12). The
    same arguments give bit-identical pipelines. Call it with :func:`sana_video2_pipeline_call_kwargs`.
    """
    from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

    from accelpatch.models.sana_video2.modeling import SanaVideo2Pipeline

    if trained:
        return _trained("sana-video2", "tiny_sana_video2_pipeline", dtype=dtype, device=device,
                        transformer_config=transformer_config, vae_config=vae_config)
    transformer = tiny_sana_video2_transformer(transformer_config, seed=seed, dtype=dtype)
    vae = _build_seeded(_ltx2_vae_class(), {**(SANA_VIDEO2_TINY_VAE_CONFIG if vae_config is None else vae_config),
                                            "latent_channels": int(transformer.config.in_channels)},
                        seed=seed, dtype=dtype, device="cpu")
    torch.manual_seed(seed)
    text_encoder = Gemma2Model(Gemma2Config(
        head_dim=16, hidden_size=int(transformer.config.caption_channels), intermediate_size=64,
        num_attention_heads=2, num_hidden_layers=1, num_key_value_heads=2, vocab_size=8,
        attn_implementation="eager"))
    if dtype != torch.float32:
        text_encoder.to(dtype)
    pipe = SanaVideo2Pipeline(tokenizer=GemmaTokenizer(), text_encoder=text_encoder.eval(), vae=vae,
                              transformer=transformer, scheduler=SanaVideo2Pipeline.release_scheduler())
    if torch.device(device) != torch.device("cpu"):
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _ltx2_vae_class():
    from diffusers import AutoencoderKLLTX2Video

    return AutoencoderKLLTX2Video


def sana_video2_pipeline_call_kwargs(num_inference_steps: int = 2, *, prompt: str = "a tiny test video",
                                     negative_prompt: str | None = None, height: int = 64, width: int = 96,
                                     frames: int = 9, guidance_scale: float = 8.0, seed: int = 0,
                                     output_type: str = "pt") -> dict[str, Any]:
    """Keyword arguments for a quick tiny ``SanaVideo2Pipeline`` call.

    64 x 96 pixels and 9 frames (latents 2 x 2 x 3 at the release stride), the release's guidance scale 8 (so CFG
    runs: one transformer call per step with batch 2), the release's prompt handling (complex human instruction,
    motion score 20, negative prompt when ``negative_prompt`` is None) and text length (the transformer's
    ``model_max_length``). A fresh generator seeded with ``seed`` makes repeated calls bit-identical. With
    ``output_type="pt"``, ``.frames`` is (1, frames, 3, height, width) in [0, 1].
    """
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width, frames=frames,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, output_type=output_type,
                generator=torch.Generator().manual_seed(seed))
