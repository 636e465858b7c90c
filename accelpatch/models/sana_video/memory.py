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


#: characters per Gemma token assumed for the prompt-rewriting instruction's length (its tokenizer is not here)
CHARS_PER_TOKEN = 4


def gemma2_encoder(call, instruction) -> tuple:
    """Gemma-2-2B (transformers' Gemma2Config defaults are its configuration) on the prompt padded to
    max_sequence_length (300) plus the prompt-rewriting instruction's tokens, estimated at CHARS_PER_TOKEN characters
    a token (the pipelines count them with the tokenizer, which is not downloaded here)."""
    from accelpatch.models.families import TextEncoderCase

    chosen = call.get("complex_human_instruction", instruction)
    extra = -(-len("\n".join(chosen)) // CHARS_PER_TOKEN) - 2 if chosen else 0
    tokens = int(call.get("max_sequence_length") or 300) + extra
    note = (f"300 prompt tokens + about {extra + 2} of the prompt-rewriting instruction (estimated at "
            f"{CHARS_PER_TOKEN} characters a token)" if chosen else "")
    return (TextEncoderCase("Gemma-2-2B", "transformers:Gemma2Model", "transformers:Gemma2Config", {}, tokens,
                            "transformers' Gemma2Config defaults (Gemma-2-2B)", note=note),)


def text_encoders(call, model: str = "") -> tuple:
    """SanaVideoPipeline's Gemma-2-2B with its default complex_human_instruction."""
    import inspect

    from diffusers import SanaVideoPipeline

    default = inspect.signature(SanaVideoPipeline.__call__).parameters["complex_human_instruction"].default
    return gemma2_encoder(call, default)
