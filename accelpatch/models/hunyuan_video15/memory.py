"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of HunyuanVideo 1.5 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`: the release configuration known here (480p I2V) and one
forward's inputs, as diffusers 0.42.1's pipeline_hunyuan_video1_5*.py passes them: two text streams (Qwen2.5-VL and
ByT5) and SigLIP image tokens. Imports nothing."""
from __future__ import annotations


def release_config(name: str):
    """diffusers' defaults (480p I2V, 8.3B), with ``use_meanflow`` for the step-distilled checkpoints as diffusers'
    conversion script sets it."""
    if "i2v" in name:
        distilled = "step-distilled" in name
        return ({"use_meanflow": True} if distilled else {}), (
            "diffusers' HunyuanVideo15Transformer3DModel defaults (480p I2V, 8.3B)"
            + (" with use_meanflow (step-distilled)" if distilled else ""))
    return None


def transformer_inputs(case) -> dict:
    """ByT5's ``case.glyph_tokens`` and ``case.image_tokens`` SigLIP tokens beside the text, all valid."""
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens, text_valid=case.text_tokens, text_2_len=case.glyph_tokens,
                text_2_valid=case.glyph_tokens, image_tokens=case.image_tokens, image=True)
