"""Tiny LTX-2 audio-video transformers and pipelines (``LTX2VideoTransformer3DModel``, ``LTX2Pipeline``), built
offline from config dicts.

Config dicts (``LTX2_*_CONFIG``), a seeded transformer and keyword arguments for one forward (patchified video and
audio latents, text embeddings for both streams, a timestep, the latent grid for the RoPE), and an offline
``LTX2Pipeline``: a tiny ``Gemma3ForConditionalGeneration`` (its SigLIP tower tiny too, unused by text prompts),
a byte-fallback ``GemmaTokenizer`` built in memory (every UTF-8 byte one token, so prompts differ), LTX-2.0's text
connectors, the video VAE, the audio VAE and the vocoder, all from config dicts. diffusers is imported inside the
functions.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from accelpatch.testing._common import (_build_seeded, _cast_like_from_pretrained, _config_of, _finish_tiny_pipeline,
                      _input_dtype_and_device)

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
    [B, audio_num_frames, C_audio], text embeddings for each stream [B, text_len, caption_channels] (each stream's
    cross-attention width where the model has no prompt projections, as LTX-2.3), a timestep on
    diffusers' 0-1000 scale (and, for LTX-2.3's prompt modulation, ``sigma`` = timestep / 1000) and the latent grid
    the model builds its RoPE from."""
    config = _config_of(LTX2_TINY_CONFIG if transformer_or_config is None else transformer_or_config)
    dtype, device = _input_dtype_and_device(transformer_or_config if transformer_or_config is not None else config,
                                            dtype, device)
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(batch_size, num_frames * height * width, config["in_channels"], generator=g)
    audio = torch.randn(batch_size, audio_num_frames, config["audio_in_channels"], generator=g)
    # without its own prompt projections (LTX-2.3's use_prompt_embeddings=False) the model reads the connectors'
    # per-modality output, already as wide as each stream's cross-attention
    prompts = config.get("use_prompt_embeddings", True)
    text_width = config["caption_channels"] if prompts else config["cross_attention_dim"]
    audio_text_width = config["caption_channels"] if prompts else config["audio_cross_attention_dim"]
    text = torch.randn(batch_size, text_len, text_width, generator=g)
    audio_text = torch.randn(batch_size, text_len, audio_text_width, generator=g)
    inputs = dict(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text,
                  audio_encoder_hidden_states=audio_text)
    inputs = {k: v.to(device, dtype) for k, v in inputs.items()}
    t = torch.full((batch_size,), timestep, device=device)
    return dict(**inputs, timestep=t, sigma=t / 1000.0, num_frames=num_frames, height=height, width=width,
                audio_num_frames=audio_num_frames, return_dict=True)


#: A one-level ``AutoencoderKLLTX2Video`` (spatial and temporal compression 2, patch 1) with 8 latent channels,
#: the tiny transformer's ``in_channels``; ``latent_channels`` is set from the transformer when the pipeline is built.
LTX2_TINY_VIDEO_VAE_CONFIG: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8,), decoder_block_out_channels=(8,),
    layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
    decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
    upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
    encoder_causal=True, decoder_causal=False,
)

#: A one-level ``AutoencoderKLLTX2Audio``: 8 mel bins compressed 4x to 2, times 2 latent channels, are the tiny
#: transformer's 4 ``audio_in_channels``.
LTX2_TINY_AUDIO_VAE_CONFIG: dict[str, Any] = dict(
    base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
    resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
    mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8,
)

#: A two-stage ``LTX2Vocoder`` reading the audio VAE's 2 channels x 8 mel bins, stereo out.
LTX2_TINY_VOCODER_CONFIG: dict[str, Any] = dict(
    in_channels=16, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
    resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], leaky_relu_negative_slope=0.1, output_sampling_rate=16000,
)

_GEMMA_LAYERS = 2


def _byte_gemma_tokenizer():
    """A ``GemmaTokenizer`` with Gemma's special tokens and the 256 byte-fallback tokens only (no merges): every
    UTF-8 byte of a prompt is one token. Built in memory, no files."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    vocab.update({f"<0x{i:02X}>": len(vocab) + i for i in range(256)})
    return GemmaTokenizer(vocab=vocab, merges=[])


def _tiny_gemma3(hidden_size: int, vocab_size: int, seed: int):
    """A randomly initialised two-layer ``Gemma3ForConditionalGeneration`` ``hidden_size`` wide (the LTX-2
    transformer's ``caption_channels``); its vision tower is a one-layer SigLIP that text prompts never run."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    heads = 2
    config = Gemma3Config(
        text_config=dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=_GEMMA_LAYERS, num_attention_heads=heads, num_key_value_heads=1,
                         head_dim=hidden_size // heads, sliding_window=8, max_position_embeddings=256,
                         pad_token_id=0, eos_token_id=1, bos_token_id=2),
        vision_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=8, patch_size=4),
        mm_tokens_per_image=4)
    torch.manual_seed(seed)
    return Gemma3ForConditionalGeneration(config).eval()


def _tiny_connectors(caption_channels: int, seed: int):
    """LTX-2.0's ``LTX2TextConnectors`` (one shared projection of every Gemma layer, then a one-layer connector per
    stream) ``caption_channels`` wide: 2 heads of ``caption_channels / 2``, no learnable registers."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    if caption_channels % 2:
        raise ValueError(f"caption_channels={caption_channels} must be even (two connector heads)")
    head = caption_channels // 2
    torch.manual_seed(seed)
    return LTX2TextConnectors(
        caption_channels=caption_channels, text_proj_in_factor=_GEMMA_LAYERS + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=head, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=head, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_double_precision=False,
    ).eval()


def tiny_ltx2_pipeline(*, dtype: torch.dtype = torch.float32, seed: int = 0,
                       transformer_config: Mapping[str, Any] | None = None, transformer=None,
                       device: str | torch.device = "cpu"):
    """A complete offline ``LTX2Pipeline`` with tiny random components (default transformer:
    :data:`LTX2_TINY_CONFIG`), progress bar off. Call it with :func:`ltx2_pipeline_call_kwargs`.

    The text side is LTX-2.0's (a shared connector projection), so the transformer must be an LTX-2.0 layout (not
    :data:`LTX2_3_TINY_CONFIG`, whose prompt modulation needs LTX-2.3's per-modality connectors). The Gemma text
    encoder is as wide as the transformer's ``caption_channels``, the video VAE has its ``in_channels`` latent
    channels and the audio VAE gives its ``audio_in_channels`` (2 latent channels x 2 latent mel bins)."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    if transformer is None:
        transformer = tiny_ltx2_transformer(transformer_config, seed=seed, dtype=dtype)
    config = transformer.config
    if config.cross_attn_mod or config.audio_cross_attn_mod:
        raise ValueError("tiny_ltx2_pipeline builds LTX-2.0's text connectors; a transformer with "
                         "cross_attn_mod/audio_cross_attn_mod (LTX-2.3) needs LTX-2.3's, which it does not build")
    torch.manual_seed(seed)
    audio_vae = AutoencoderKLLTX2Audio(**LTX2_TINY_AUDIO_VAE_CONFIG).eval()
    audio_channels = audio_vae.config.latent_channels * (audio_vae.config.mel_bins // audio_vae.mel_compression_ratio)
    if config.audio_in_channels != audio_channels or config.patch_size != 1 or config.patch_size_t != 1:
        raise ValueError(f"the tiny audio VAE gives {audio_channels} audio channels and the video VAE patch 1; the "
                         f"transformer has audio_in_channels={config.audio_in_channels}, "
                         f"patch_size={config.patch_size}, patch_size_t={config.patch_size_t}")
    tokenizer = _byte_gemma_tokenizer()
    text_encoder = _tiny_gemma3(int(config.caption_channels), len(tokenizer), seed)
    connectors = _tiny_connectors(int(config.caption_channels), seed)
    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Video(**{**LTX2_TINY_VIDEO_VAE_CONFIG, "latent_channels": int(config.in_channels)}).eval()
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    torch.manual_seed(seed)
    vocoder = LTX2Vocoder(**LTX2_TINY_VOCODER_CONFIG).eval()
    if dtype != torch.float32:
        for module in (connectors, audio_vae, vocoder):
            _cast_like_from_pretrained(module, dtype)
    pipe = LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, audio_vae=audio_vae,
                        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors,
                        transformer=transformer, vocoder=vocoder)
    return _finish_tiny_pipeline(pipe, text_encoder, vae, dtype=dtype, device=device)


def ltx2_pipeline_call_kwargs(num_inference_steps: int = 2, *, prompt: str = "a robot dancing",
                              negative_prompt: str = "", height: int = 32, width: int = 32, num_frames: int = 7,
                              frame_rate: float = 25.0, guidance_scale: float = 3.0,
                              audio_guidance_scale: float = 3.0, seed: int = 0, output_type: str = "pt",
                              max_sequence_length: int = 16) -> dict[str, Any]:
    """Call kwargs for :func:`tiny_ltx2_pipeline`: 7 frames of 32 x 32 are 4 latent frames of 16 x 16, i.e. 1,024
    video tokens per forward (the video self-attention's 16 blocks of 64), with classifier-free guidance (a batch
    of two per forward). The knobs LTX-2.3 turned on by default (STG, modality guidance, rescaling, the cross
    timestep) are off: the tiny transformer is LTX-2.0's layout."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=height, width=width, num_frames=num_frames,
                frame_rate=frame_rate, num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                stg_scale=0.0, modality_scale=1.0, guidance_rescale=0.0, audio_guidance_scale=audio_guidance_scale,
                audio_stg_scale=0.0, audio_modality_scale=1.0, audio_guidance_rescale=0.0,
                spatio_temporal_guidance_blocks=None, use_cross_timestep=False,
                generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=max_sequence_length)
