"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of LTX-2 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`, as diffusers 0.42.1's pipeline_ltx2.py does it: the release
configuration known here (LTX-2.0), one forward's inputs, the audio latent frames beside the video, and CFG that also
runs for the audio guidance alone. Imports nothing."""
from __future__ import annotations


def release_config(name: str):
    if "2.3" not in name:
        return {}, "diffusers' LTX2VideoTransformer3DModel defaults (LTX-2.0, 19B)"
    return None


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
    """LTX2Pipeline's ``connectors``: ``LTX2TextConnectors`` at diffusers' defaults (LTX-2.0's: Gemma 3 12B's 3,840
    channels times its 49 stacked hidden states in), called once on the stacked hidden states; LTX-2.3's
    configuration is not known here."""
    from accelpatch.models.families import TextStageCase

    if "2.3" in model:
        return "LTX-2.3's text connectors (another configuration) are not known here"
    return TextStageCase("text connectors", "diffusers.pipelines.ltx2.connectors:LTX2TextConnectors", {},
                         3840 * 49, "diffusers' LTX2TextConnectors defaults (LTX-2.0)")


def audio_decode(call, model: str, audio: int):
    """LTX2Pipeline's audio decode after the video's: ``AutoencoderKLLTX2Audio`` turns the ``audio`` latent frames
    (8 channels x 16 mel bins) into a mel spectrogram, ``LTX2Vocoder`` that into the waveform, both at diffusers'
    defaults (LTX-2.0's); LTX-2.3's vocoder (another class, with bandwidth extension) is not known here."""
    from accelpatch.models.families import AudioDecodeCase

    if "2.3" in model:
        return "LTX-2.3's vocoder (LTX2VocoderWithBWE, another configuration) is not known here"
    return AudioDecodeCase("diffusers:AutoencoderKLLTX2Audio", (), (8, audio, 64 // 4),
                           "diffusers' AutoencoderKLLTX2Audio and LTX2Vocoder defaults (LTX-2.0)",
                           vocoder="diffusers.pipelines.ltx2.vocoder:LTX2Vocoder")
