"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of SANA-Video beyond its registered
:class:`~accelpatch.models.families.MemorySettings`: the release configuration known here and one forward's inputs
(as diffusers 0.42.1's pipeline_sana_video.py passes them, with the text mask). Imports nothing."""
from __future__ import annotations


def release_config(name: str):
    """The 2B 480p model's configuration (:mod:`accelpatch.testing.sana_video`'s); the 720p 2B model has the LTX-2
    VAE, so other latents, and is not known here."""
    if "2b-480p" in name:
        return "SANA_VIDEO_RELEASE_CONFIG", "accelpatch.testing.sana_video.SANA_VIDEO_RELEASE_CONFIG (2B)"
    return None


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens, with_mask=True)
