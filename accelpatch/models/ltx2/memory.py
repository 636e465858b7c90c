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


def text_connectors(call, model: str, dtype, videos: int, cfg: int, tokens: int, *, fake: bool = True,
                    config=None):
    """LTX2Pipeline's ``connectors`` (``LTX2TextConnectors`` at diffusers' defaults, LTX-2.0's, which its pipeline
    loads beside Gemma 3 12B), called once as the pipeline calls it: on the stacked hidden states of ``videos``
    prompts times ``cfg`` ([negative, positive] concatenated, the negative half still referenced beside the
    concatenation) and their mask. Returns (name, weights, activations, note); ``config``: other constructor
    arguments (the check at a tiny size, ``fake=False``)."""
    import contextlib

    import torch
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accelpatch.memory.live_bytes import LiveBytes, module_bytes
    from accelpatch.testing._common import _cast_like_from_pretrained

    if "2.3" in model:
        return ("text connectors", None, None, "LTX-2.3's connectors configuration is not known here")
    dtype = getattr(torch, str(dtype).removeprefix("torch."))
    with FakeTensorMode() if fake else contextlib.nullcontext():
        connectors = LTX2TextConnectors(**dict(config or {})).eval()
        _cast_like_from_pretrained(connectors, dtype)
        width = connectors.config.caption_channels * connectors.config.text_proj_in_factor
        stacked = torch.zeros(videos * cfg, tokens, width, dtype=dtype)
        mask = torch.ones(videos * cfg, tokens, dtype=torch.long)
        with torch.no_grad(), LiveBytes() as live:
            connectors(stacked, mask)
        weights = module_bytes(connectors)
        parameters = sum(p.numel() for p in connectors.parameters())
    inputs = stacked.untyped_storage().nbytes() * (cfg + 1) // cfg if cfg > 1 else stacked.untyped_storage().nbytes()
    return ("text connectors", weights, live.peak + inputs + mask.untyped_storage().nbytes(),
            f"LTX2TextConnectors {parameters / 1e9:.2f}B (diffusers' defaults: LTX-2.0), {videos * cfg} x {tokens} "
            "tokens")
