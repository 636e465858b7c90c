"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of SANA-Video 2.0 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`: the release configurations (5B and 14B, in
:mod:`accelpatch.testing.sana_video2`) and one forward's inputs, as our ``SanaVideo2Pipeline`` passes them. Imports
nothing."""
from __future__ import annotations


def release_config(name: str):
    if "5b" in name:
        return "SANA_VIDEO2_5B_CONFIG", "SanaVideo2Transformer3DModel defaults (the 5B release)"
    if "14b" in name:
        return "SANA_VIDEO2_14B_CONFIG", "accelpatch.testing.sana_video2.SANA_VIDEO2_14B_CONFIG"
    return None


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens)


def text_encoders(call, model: str = "") -> tuple:
    """SanaVideo2Pipeline's Gemma-2-2B-IT with the release's prompt-rewriting instruction (RELEASE_CHI_PROMPT)."""
    from accelpatch.models.sana_video.memory import gemma2_encoder
    from accelpatch.models.sana_video2.modeling.pipeline import RELEASE_CHI_PROMPT

    return gemma2_encoder(call, RELEASE_CHI_PROMPT)
