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
