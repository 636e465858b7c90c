"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of LTX-2 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`, as diffusers 0.42.1's pipeline_ltx2.py does it: the release
configurations (LTX-2.0: diffusers' class defaults with split RoPE; LTX-2.3: :data:`LTX23_TRANSFORMER` and the others
below), one forward's inputs, the audio latent frames beside the video, and CFG that also runs for the audio guidance
alone. Imports nothing."""
from __future__ import annotations


#: Where LTX-2.3's configurations are read: diffusers' LTX-2 conversion presets (its ``ltx2`` assembly recipe's
#: configuration helpers, version "2.3"), kept here as what differs from the classes' defaults (LTX-2.0's)
LTX23_SOURCE = "diffusers' LTX-2 conversion presets, version 2.3"
#: LTX-2.0's transformer (19B): diffusers' class defaults but for its RoPE, which the release applies split (the
#: version 2.0 presets, as the original checkpoint's metadata says); the class defaults to interleaved, whose
#: temporaries a 720p step holds 0.6 GB more of
LTX20_TRANSFORMER = dict(rope_type="split")
#: LTX-2.0's text connectors: the class defaults, split RoPE as the presets give it
LTX20_CONNECTORS = dict(rope_type="split")
#: LTX-2.3's transformer (19.0B): gated attention, cross-attention AdaLN, STG-perturbed attention, split RoPE
LTX23_TRANSFORMER = dict(gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                         rope_type="split", use_prompt_embeddings=False, perturbed_attn=True)
#: LTX-2.3's text connectors (3.2B): 8 gated layers per modality, each with its own projection
LTX23_CONNECTORS = dict(video_connector_num_attention_heads=32, video_connector_num_layers=8, video_gated_attn=True,
                        audio_connector_num_attention_heads=32, audio_connector_attention_head_dim=64,
                        audio_connector_num_layers=8, audio_gated_attn=True, rope_type="split",
                        per_modality_projections=True, proj_bias=True)
#: LTX-2.3's video VAE (SANA-Video 2.0 decodes with it too): a narrower decoder of four stages, the third temporal
#: only, the last spatial only, no residual upsampling
LTX23_VIDEO_VAE = dict(block_out_channels=(256, 512, 1024, 1024), decoder_block_out_channels=(256, 512, 512, 1024),
                       layers_per_block=(4, 6, 4, 2, 2), decoder_layers_per_block=(4, 6, 4, 2, 2),
                       decoder_spatio_temporal_scaling=(True, True, True, True),
                       decoder_inject_noise=(False, False, False, False, False),
                       upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
                       upsample_residual=(False, False, False, False), upsample_factor=(2, 2, 1, 2),
                       decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32,
                       temporal_compression_ratio=8)
#: LTX-2.3's vocoder: ``LTX2VocoderWithBWE`` (a 16 kHz vocoder, then bandwidth extension to 48 kHz), whose defaults
#: in diffusers are the 2.3 preset's values; its audio VAE is LTX-2.0's
LTX23_VOCODER_CLASS = "diffusers.pipelines.ltx2.vocoder:LTX2VocoderWithBWE"


def is_ltx23(name: str) -> bool:
    """Whether a model name (lower case) is an LTX-2.3 release's: the configurations above, not LTX-2.0's."""
    return "2.3" in name


def release_config(name: str):
    if is_ltx23(name):
        return dict(LTX23_TRANSFORMER), f"{LTX23_SOURCE} (22B: the transformer's 19.0B)"
    return dict(LTX20_TRANSFORMER), "diffusers' LTX2VideoTransformer3DModel defaults with split RoPE (LTX-2.0, 19B)"


def ltx23_video_vae():
    """LTX-2.3's video VAE as the planner traces it (SANA-Video 2.0's registration uses it as its own)."""
    from accelpatch.models.families import VaeDecodeCase

    return VaeDecodeCase("AutoencoderKLLTX2Video", tuple(LTX23_VIDEO_VAE.items()),
                         source=f"LTX-2.3's video VAE ({LTX23_SOURCE})", repeated=("decoder",))


def video_vae(name: str):
    """LTX-2.3's video VAE for an LTX-2.3 model, else None (the family's, LTX-2.0's)."""
    return ltx23_video_vae() if is_ltx23(name) else None


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                audio_num_frames=case.audio, text_len=case.text_tokens)


def audio(frames: int, call) -> int:
    """Audio latent frames: 16 kHz, hop 160, temporal compression 4 (25 per second) over the video's duration."""
    return round(frames / float(call.get("frame_rate") or 24.0) * 16000 / 160 / 4)


def guidance(call, guidance_scale):
    """CFG runs when either guidance_scale or audio_guidance_scale (default 7.0) is above 1."""
    audio_scale = call.get("audio_guidance_scale", 7.0)
    return ((guidance_scale or 0) > 1 or (audio_scale or 0) > 1,
            f"guidance_scale {guidance_scale}, audio_guidance_scale {audio_scale}")


#: Gemma 3 12B (LTX2Pipeline's Gemma3ForConditionalGeneration: the language model and its SigLIP vision tower)
GEMMA3_12B = dict(
    text_config=dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=256, vocab_size=262208, sliding_window=1024,
                     query_pre_attn_scalar=256, rms_norm_eps=1e-6),
    vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                       image_size=896, patch_size=14, vision_use_head=False),
    mm_tokens_per_image=256)


def text_encoders(call, model: str = "") -> tuple:
    """LTX2Pipeline's Gemma 3 12B on the prompt padded to max_sequence_length (1024): every layer's hidden state
    stacked into one tensor (its logits over the vocabulary are computed too)."""
    from accelpatch.models.families import TextEncoderCase

    tokens = int(call.get("max_sequence_length") or 1024)
    return (TextEncoderCase("Gemma-3-12B", "transformers:Gemma3ForConditionalGeneration",
                            "transformers:Gemma3Config", GEMMA3_12B, tokens, "google/gemma-3-12b-it's config.json",
                            output="stacked"),)


def text_connectors(call, model: str = ""):
    """LTX2Pipeline's ``connectors``: ``LTX2TextConnectors`` (Gemma 3 12B's 3,840 channels times its 49 stacked
    hidden states in), called once on the stacked hidden states: diffusers' defaults (LTX-2.0's) or LTX-2.3's."""
    from accelpatch.models.families import TextStageCase

    settings, source = ((LTX23_CONNECTORS, f"LTX-2.3's ({LTX23_SOURCE})") if is_ltx23(model) else
                        (LTX20_CONNECTORS, "diffusers' LTX2TextConnectors defaults (LTX-2.0)"))
    return TextStageCase("text connectors", "diffusers.pipelines.ltx2.connectors:LTX2TextConnectors",
                         dict(settings), 3840 * 49, source)


def audio_decode(call, model: str, audio: int):
    """LTX2Pipeline's audio decode after the video's: ``AutoencoderKLLTX2Audio`` turns the ``audio`` latent frames
    (8 channels x 16 mel bins) into a mel spectrogram, ``LTX2Vocoder`` that into the waveform, both at diffusers'
    defaults (LTX-2.0's); LTX-2.3's vocoder is another class, with bandwidth extension to 48 kHz."""
    from accelpatch.models.families import AudioDecodeCase

    if is_ltx23(model):
        return AudioDecodeCase("diffusers:AutoencoderKLLTX2Audio", (), (8, audio, 64 // 4),
                               f"LTX-2.3's: LTX-2.0's audio VAE, then LTX2VocoderWithBWE ({LTX23_SOURCE})",
                               vocoder=LTX23_VOCODER_CLASS)
    return AudioDecodeCase("diffusers:AutoencoderKLLTX2Audio", (), (8, audio, 64 // 4),
                           "diffusers' AutoencoderKLLTX2Audio and LTX2Vocoder defaults (LTX-2.0)",
                           vocoder="diffusers.pipelines.ltx2.vocoder:LTX2Vocoder")
