"""Tiny MiniMax-H3 models and pipelines, built offline from config dicts.

Config dicts (``MINIMAX_H3_*_CONFIG``), a seeded ``MiniMaxH3Transformer3DModel`` and inputs
for one forward over a packed ``[text | audio | video]`` sequence (laid out by diffusers' own
``t2va`` builder), :class:`MiniMaxH3Layout` facts about such a sequence, tiny video and audio
VAEs, and an offline ``t2va`` modular pipeline with its call kwargs. diffusers is imported
inside the functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from accelpatch.testing._common import _build_seeded, _config_of, _input_dtype_and_device, _param_dtype

# --------------------------------------------------------------------------------------------
# Config dicts
# --------------------------------------------------------------------------------------------

#: diffusers' fast-test config for ``MiniMaxH3Transformer3DModel`` (2 heads x 16, ~39k parameters).
MINIMAX_H3_TINY_CONFIG: dict[str, Any] = dict(
    num_attention_heads=2,
    attention_head_dim=16,
    hidden_size=24,
    num_layers=2,
    num_refiner_layers=2,
    ffn_dim=32,
    in_channels=4,
    audio_in_channels=6,
    patch_size=(1, 2, 2),
    text_dim=8,
    freq_dim=8,
    time_embed_hidden_dim=24,
    time_embed_dim=16,
    rope_freq_dim=2,
)

#: Tiny config with the released head dim 128 (2 heads x 128, hidden 64; ~0.4M parameters).
#: ``audio_in_channels=8`` matches the tiny audio VAE, so this is the pipeline's default.
MINIMAX_H3_SOL_CONFIG: dict[str, Any] = {
    **MINIMAX_H3_TINY_CONFIG,
    "attention_head_dim": 128,
    "hidden_size": 64,
    "ffn_dim": 128,
    "audio_in_channels": 8,
    "rope_freq_dim": 16,
}

#: For CPU benchmarks at >= 8k packed rows: 4 heads x 128, 4 layers, hidden 128 (2.5M
#: parameters). One float32 forward over 8256 rows (64 text, 1024 audio, 7168 video) takes
#: ~7 s on one CPU thread, almost all of it attention.
MINIMAX_H3_MEDIUM_CONFIG: dict[str, Any] = {
    **MINIMAX_H3_SOL_CONFIG,
    "num_attention_heads": 4,
    "num_layers": 4,
    "hidden_size": 128,
    "ffn_dim": 256,
    "time_embed_hidden_dim": 64,
    "time_embed_dim": 32,
}



MINIMAX_H3_VIDEO_TAG = 0
MINIMAX_H3_TEXT_TAG = 1
MINIMAX_H3_AUDIO_TAG = 2


def tiny_minimax_h3_transformer(
    config: Mapping[str, Any] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **overrides: Any,
):
    """A randomly initialised ``MiniMaxH3Transformer3DModel`` in eval mode.

    ``config`` defaults to :data:`MINIMAX_H3_SOL_CONFIG` (head dim 128, the released head dim);
    keyword ``overrides`` replace single entries. Weights are drawn after
    ``torch.manual_seed(seed)``. With a non-float32 ``dtype`` the modules diffusers keeps in
    float32 (``proj_in``/``proj_out`` and the audio heads, time embedder, rope) stay float32,
    as after ``from_pretrained(torch_dtype=dtype)``.
    """
    from diffusers import MiniMaxH3Transformer3DModel

    cfg = {**(MINIMAX_H3_SOL_CONFIG if config is None else config), **overrides}
    return _build_seeded(MiniMaxH3Transformer3DModel, cfg, seed=seed, dtype=dtype, device=device)


@dataclass(frozen=True)
class MiniMaxH3Layout:
    """Facts about one packed MiniMax-H3 sequence, derived from its index tensors.

    ``prefix_rows`` is the number of leading rows that are exactly the text and audio rows
    (diffusers' ``t2va`` layout: ``[text | audio | video]``), or ``None`` when the text and
    audio rows are not a contiguous prefix. ``video_start`` is the first video row when video
    rows are a contiguous suffix, else ``None``.
    """

    sequence_length: int
    num_text: int
    num_audio: int
    num_video: int
    prefix_rows: int | None
    video_start: int | None

    @property
    def prefix_is_contiguous(self) -> bool:
        return self.prefix_rows is not None


def minimax_h3_layout(inputs: Mapping[str, Any]) -> MiniMaxH3Layout:
    """Layout facts of MiniMax-H3 forward kwargs (from :func:`minimax_h3_transformer_inputs` or
    captured from a pipeline call): row counts per modality and where the text+audio prefix ends.
    """
    text = inputs["text_indices"].reshape(-1).cpu()
    audio = inputs["audio_indices"].reshape(-1).cpu()
    video = inputs["video_indices"].reshape(-1).cpu()
    seq = int(inputs["position_ids"].shape[0])
    n_prefix = text.numel() + audio.numel()
    prefix = torch.cat([text, audio]).sort().values
    prefix_rows = n_prefix if torch.equal(prefix, torch.arange(n_prefix)) else None
    video_sorted = video.sort().values
    video_start = seq - video.numel()
    if not torch.equal(video_sorted, torch.arange(video_start, seq)):
        video_start = None
    return MiniMaxH3Layout(
        sequence_length=seq,
        num_text=text.numel(),
        num_audio=audio.numel(),
        num_video=video.numel(),
        prefix_rows=prefix_rows,
        video_start=video_start,
    )


def _factor_video_rows(num_video: int) -> tuple[int, int, int]:
    """Split ``num_video`` rows into (frames, rows_h, rows_w): the largest frame of at most
    32x32 rows that divides the count, as square as its divisors allow."""
    per_frame = max(d for d in range(1, min(num_video, 1024) + 1) if num_video % d == 0)
    rows_h = max(d for d in range(1, math.isqrt(per_frame) + 1) if per_frame % d == 0)
    return num_video // per_frame, rows_h, per_frame // rows_h


def _build_t2va_layout(num_text, num_frames, rows_h, rows_w, num_audio_latents, audio_channels, patch):
    """diffusers' own ``[text | audio | video]`` layout builder (the one its ``t2va`` pipeline runs)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    position_ids, token_tags, video_indices, audio_indices, text_indices, _, _ = (
        MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            torch.full((num_text,), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
            num_frames,
            rows_h * patch[1],
            rows_w * patch[2],
            num_audio_latents,
            patch,
            audio_channels,
            MINIMAX_H3_AUDIO_TAG,
            MINIMAX_H3_VIDEO_TAG,
        )
    )
    return position_ids, token_tags, video_indices, audio_indices, text_indices


def minimax_h3_transformer_inputs(
    transformer_or_config: Any,
    *,
    batch_size: int = 1,
    num_text: int = 6,
    num_audio: int = 8,
    video_frames: int = 3,
    height: int = 4,
    width: int = 4,
    num_video: int | None = None,
    audio_channels: int = 2,
    video_timestep: float = 0.5,
    audio_timestep: float = 0.7,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    layout: str = "text_audio_video",
) -> dict[str, torch.Tensor]:
    """Keyword arguments for one direct ``MiniMaxH3Transformer3DModel`` forward over a packed sequence.

    The layout is built by diffusers' own ``t2va`` layout builder
    (``MiniMaxH3PrepareLayoutStep.build_packed_sequence``), so positions and tags match what
    the modular pipeline feeds the model:

    * rows ``[0, num_text)`` are text (tag 1, position ``(i, 0, 0)``);
    * then ``num_audio`` audio rows (tag 2), channel-major over ``audio_channels`` stereo
      channels, on the media clock starting at ``num_text``, pinned to the width grid's ends;
    * then the video rows (tag 0), frame-major, with ``(t, h, w)`` positions on diffusers'
      non-uniform temporal grid and aspect-normalised spatial grid.

    Video size: ``video_frames`` x ``height`` x ``width`` *latent* frames (height/width must be
    multiples of the spatial patch), or ``num_video`` packed rows, factored into frames of at
    most 32x32 rows. ``num_audio`` must be a multiple of ``audio_channels``. Sizes of 8k+ rows
    cost only the tensor allocations.

    ``layout="shuffled"`` applies one seeded permutation to the rows (indices, tags, positions
    and timestep indices move together), for code that must not assume contiguous modalities.

    Timesteps are in [0, 1] (1 = clean): video and text rows at ``video_timestep``, audio rows
    at ``audio_timestep``, reduced to distinct ``timestep`` values plus per-row
    ``timestep_indices`` exactly as the pipeline does. ``position_ids`` are float64 like the
    pipeline's (the model's rope casts them to float32). Use :func:`minimax_h3_layout` on the
    result for ``prefix_rows`` and the per-modality counts. The forward returns ``.sample``
    shaped like ``hidden_states`` and ``.audio_sample`` like ``audio_hidden_states``.
    """
    config = _config_of(transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config, dtype, device)
    if layout not in ("text_audio_video", "shuffled"):
        raise ValueError(f"layout must be 'text_audio_video' or 'shuffled', got {layout!r}")
    patch = tuple(int(p) for p in config.get("patch_size", (1, 2, 2)))
    in_channels = int(config.get("in_channels", 24))
    audio_in = int(config.get("audio_in_channels", 32))
    text_dim = int(config.get("text_dim", 5120))
    if patch[0] != 1:
        raise ValueError(f"only temporal patch 1 is supported, got patch_size {patch}")
    if num_text < 1:
        raise ValueError(f"num_text must be >= 1, got {num_text}")
    if audio_channels < 1 or num_audio < 0 or num_audio % audio_channels:
        raise ValueError(
            f"num_audio ({num_audio}) must be a non-negative multiple of audio_channels ({audio_channels})"
        )
    if num_video is not None:
        if num_video < 1:
            raise ValueError(f"num_video must be >= 1, got {num_video}")
        video_frames, rows_h, rows_w = _factor_video_rows(num_video)
    else:
        if height % patch[1] or width % patch[2]:
            raise ValueError(f"latent height/width ({height}, {width}) must be multiples of the patch {patch[1:]}")
        rows_h, rows_w = height // patch[1], width // patch[2]
    position_ids, token_tags, video_indices, audio_indices, text_indices = _build_t2va_layout(
        num_text, video_frames, rows_h, rows_w, num_audio // audio_channels, audio_channels, patch
    )
    seq = position_ids.shape[0]

    # Per-row timesteps, reduced the way MiniMaxH3SetTimestepsStep does.
    row_t = torch.full((seq,), float(video_timestep), dtype=torch.float32)
    row_t[audio_indices] = float(audio_timestep)
    timestep, timestep_indices = torch.unique(row_t, sorted=True, return_inverse=True)

    if layout == "shuffled":
        perm = torch.randperm(seq, generator=torch.Generator().manual_seed(seed + 1))  # new row r <- old row perm[r]
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(seq)  # old row i -> new row inverse[i]
        position_ids = position_ids[perm]
        token_tags = token_tags[perm]
        timestep_indices = timestep_indices[perm]
        video_indices = inverse[video_indices]
        audio_indices = inverse[audio_indices]
        text_indices = inverse[text_indices]

    g = torch.Generator().manual_seed(seed)
    n_video = video_indices.numel()
    tensors = {
        "hidden_states": torch.randn(batch_size, n_video, in_channels * math.prod(patch), generator=g),
        "audio_hidden_states": torch.randn(batch_size, audio_indices.numel(), audio_in, generator=g),
        "encoder_hidden_states": torch.randn(batch_size, num_text, text_dim, generator=g),
    }
    inputs: dict[str, torch.Tensor] = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
    inputs.update(
        timestep=timestep.to(device),
        timestep_indices=timestep_indices.to(device),
        token_tags=token_tags.to(device),
        position_ids=position_ids.to(device),
        video_indices=video_indices.to(device),
        audio_indices=audio_indices.to(device),
        text_indices=text_indices.to(device),
    )
    return inputs


#: the tiny ``AutoencoderKLMiniMaxH3`` video VAE's shape (its latent channels are the transformer's): the release's
#: 16x spatial and 4x temporal compression, 17-frame clips with 3 latent frames dropped, a 2-layer ViT decoder
MINIMAX_H3_TINY_VIDEO_VAE_CONFIG: dict[str, Any] = dict(
    block_out_channels=(8, 8, 8, 8), layers_per_block=1, spatial_downsample_factors=(2, 2, 2, 2),
    temporal_downsample_factors=(1, 2, 2, 1), norm_num_groups=8, decoder_num_layers=2, decoder_num_attention_heads=2,
    decoder_attention_head_dim=8, decoder_num_register_tokens=2, decoder_ffn_mult=2, clip_length=17, token_drop=3)


def _tiny_minimax_h3_video_vae(latent_channels: int):
    from diffusers import AutoencoderKLMiniMaxH3

    return AutoencoderKLMiniMaxH3(latent_channels=latent_channels, latents_mean=[0.0] * latent_channels,
                                  latents_std=[1.0] * latent_channels, **MINIMAX_H3_TINY_VIDEO_VAE_CONFIG)


def _tiny_minimax_h3_audio_vae(latent_channels: int):
    import warnings

    from diffusers import AutoencoderKLMiniMaxH3Audio

    latent_dim = 2 * latent_channels
    with warnings.catch_warnings():
        # The DAC/BigVGAN stack uses torch.nn.utils.weight_norm, which warns that it is deprecated.
        warnings.simplefilter("ignore", FutureWarning)
        return AutoencoderKLMiniMaxH3Audio(
            encoder_dim=4,
            encoder_rates=(2, 2),
            latent_dim=latent_dim,
            latent_channels=latent_channels,
            num_attention_heads=2,
            decoder_dim=16,
            decoder_rates=(2, 2),
            decoder_kernel_sizes=(4, 4),
            resblock_kernel_sizes=(3,),
            resblock_dilation_sizes=((1, 3),),
            sampling_rate=160,
            latents_mean=[0.0] * latent_channels,
            latents_std=[1.0] * latent_channels,
        )


def tiny_minimax_h3_pipeline(
    *,
    transformer=None,
    transformer_config: Mapping[str, Any] | None = None,
    seed: int = 0,
):
    """An offline ``MiniMaxH3ModularPipeline`` (``t2va``) with tiny random components.

    The ``text_encoder`` sub-block is removed, so the pipeline is driven by ``prompt_embeds``
    (see :func:`minimax_h3_pipeline_call_kwargs`). Components: the transformer (``transformer``
    if given, else built from ``transformer_config``, default :data:`MINIMAX_H3_SOL_CONFIG`),
    a tiny ``AutoencoderKLMiniMaxH3`` video VAE (16x spatial compression, 17-frame clips, latent
    channels = the transformer's ``in_channels``), a tiny ``AutoencoderKLMiniMaxH3Audio`` (hop 4,
    latent channels = ``audio_in_channels``), and ``MiniMaxH3Scheduler`` with shift 12 (video)
    and 3 (audio). The pipeline is guidance-distilled: one transformer forward per step, and
    ``num_inference_steps=N`` runs N - 1 forwards.
    """
    from diffusers import MiniMaxH3Blocks, MiniMaxH3Scheduler

    if transformer is None:
        transformer = tiny_minimax_h3_transformer(transformer_config, seed=seed)
    torch.manual_seed(seed)
    vae = _tiny_minimax_h3_video_vae(int(transformer.config.in_channels)).eval()
    torch.manual_seed(seed)
    audio_vae = _tiny_minimax_h3_audio_vae(int(transformer.config.audio_in_channels)).eval()
    blocks = MiniMaxH3Blocks()
    blocks.sub_blocks.pop("text_encoder")
    pipe = blocks.init_pipeline()
    pipe.update_components(
        transformer=transformer,
        vae=vae,
        audio_vae=audio_vae,
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
    )
    _disable_progress_bars(getattr(pipe, "_blocks", blocks))
    return pipe


def _disable_progress_bars(block) -> None:
    """Silence every loop block's progress bar. ``ModularPipeline.set_progress_bar_config``
    only reaches the top-level sub-blocks, and the MiniMax-H3 denoise loop is three levels down
    (``denoise -> t2va -> denoise``)."""
    if hasattr(block, "progress_bar") and hasattr(block, "set_progress_bar_config"):
        block.set_progress_bar_config(disable=True)
    for sub in getattr(block, "sub_blocks", {}).values():
        _disable_progress_bars(sub)


def minimax_h3_pipeline_call_kwargs(
    num_inference_steps: int = 3,
    *,
    pipeline=None,
    text_dim: int | None = None,
    text_len: int = 5,
    height: int = 32,
    width: int = 32,
    num_frames: int = 124,
    seed: int = 0,
    output_type: str = "pt",
) -> dict[str, Any]:
    """Keyword arguments for a standard tiny MiniMax-H3 ``t2va`` call (text-encoder-free).

    ``prompt_embeds`` is a seeded (1, text_len, text_dim) tensor with ``text_token_tags`` all 1
    (text); ``text_dim`` is read from ``pipeline.transformer`` when given, else defaults to
    :data:`MINIMAX_H3_SOL_CONFIG`'s. 124 frames at 24 fps is the shortest clip the pipeline
    accepts (5 s; ``17n + 5`` frames) and gives 37 latent frames; at 32x32 the packed sequence
    has ``text_len + 414 + 37`` rows (456 by default). 3 steps = 2 transformer forwards.
    The call returns a ``PipelineState``: ``state.get("videos")`` is (1, num_frames, 3, H, W)
    in [0, 1] and ``state.get("audio")`` (1, 2, samples); or pass ``output="videos"``.
    A fresh ``generator`` seeded with ``seed`` makes repeated calls bit-identical.
    """
    if text_dim is None:
        if pipeline is not None:
            text_dim = int(pipeline.transformer.config.text_dim)
        else:
            text_dim = int(MINIMAX_H3_SOL_CONFIG["text_dim"])
    g = torch.Generator().manual_seed(seed)
    prompt_embeds = torch.randn(1, text_len, text_dim, generator=g)
    if pipeline is not None:
        prompt_embeds = prompt_embeds.to(_param_dtype(pipeline.transformer))
    return dict(
        prompt_embeds=prompt_embeds,
        text_token_tags=torch.full((text_len,), MINIMAX_H3_TEXT_TAG, dtype=torch.long),
        height=height,
        width=width,
        num_frames=num_frames,
        num_inference_steps=num_inference_steps,
        output_type=output_type,
        generator=torch.Generator().manual_seed(seed + 1),
    )
