"""SANA-Video 2.0's prompts as the release handles them (``inference_sana_video.py``; sources in
:class:`~accelpatch.models.sana_video2.modeling.pipeline.SanaVideo2Pipeline`'s docstring): the complex human
instruction and the negative prompt of the release, the motion suffix (:func:`motion_prompt_suffix`), and
:class:`SanaVideo2PromptMixin`, the pipeline's ``assemble_prompts`` and ``encode_prompt``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

__all__ = ["RELEASE_CHI_PROMPT", "RELEASE_NEGATIVE_PROMPT", "RELEASE_MAX_SEQUENCE_LENGTH", "RELEASE_MOTION_SCORE",
           "motion_prompt_suffix", "SanaVideo2PromptMixin"]

#: ``text_encoder.chi_prompt`` of the release yaml: prepended (joined by newlines) to every positive prompt.
RELEASE_CHI_PROMPT: tuple[str, ...] = (
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable for '
    "image generation. Evaluate the level of detail in the user prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial "
    "relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping "
    "peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing street "
    "lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass "
    "skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:",
    "User Prompt: ",
)
#: The release's default negative prompt.
RELEASE_NEGATIVE_PROMPT = (
    "A chaotic sequence with misshapen, deformed limbs in heavy motion blur, sudden disappearance, jump cuts, jerky "
    "movements, rapid shot changes, frames out of sync, inconsistent character shapes, temporal artifacts, jitter, "
    "and ghosting effects, creating a disorienting visual experience."
)
#: ``--motion_score`` of the release's documented command (the script's own default is 10).
RELEASE_MOTION_SCORE = 20
#: ``text_encoder.model_max_length``: text tokens the transformer sees.
RELEASE_MAX_SEQUENCE_LENGTH = 300


def motion_prompt_suffix(motion_score: Optional[int], high_motion: bool = False) -> str:
    """What the release appends to every positive prompt: ``" motion score: N."`` for ``motion_score`` N > 0,
    otherwise ``" high motion"`` or ``" low motion"`` (``high_motion``); ``motion_score=None`` appends nothing (not
    a release setting: for prompts that already carry their own)."""
    if motion_score is None:
        return ""
    if isinstance(motion_score, bool) or not isinstance(motion_score, (int, float)) or not math.isfinite(motion_score):
        raise ValueError(f"motion_score must be an int or None, got {motion_score!r}")
    if motion_score > 0:
        return f" motion score: {int(motion_score)}."
    return " high motion" if high_motion else " low motion"


class SanaVideo2PromptMixin:
    """The prompt handling of :class:`~accelpatch.models.sana_video2.modeling.pipeline.SanaVideo2Pipeline` (its
    ``tokenizer``, ``text_encoder`` and execution device)."""

    @staticmethod
    def assemble_prompts(prompt: Union[str, Sequence[str]], *, motion_score: Optional[int] = RELEASE_MOTION_SCORE,
                         high_motion: bool = False,
                         complex_human_instruction: Optional[Sequence[str]] = RELEASE_CHI_PROMPT) -> list[str]:
        """The texts the tokenizer receives for positive prompts: instruction + ``prompt.strip()`` + motion suffix."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        prefix = "\n".join(complex_human_instruction) if complex_human_instruction else ""
        suffix = motion_prompt_suffix(motion_score, high_motion)
        return [prefix + p.strip() + suffix for p in prompts]

    def _encode_texts(self, texts: list[str], *, instruction: Optional[Sequence[str]], max_sequence_length: int,
                      device: torch.device, dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise ``texts`` (already assembled), run the text encoder, keep BOS + the last ``L - 1`` positions."""
        if self.tokenizer is None or self.text_encoder is None:
            raise ValueError("encoding a prompt needs the pipeline's tokenizer and text_encoder; this pipeline has "
                             "none, so pass prompt_embeds/prompt_attention_mask (and negative_prompt_embeds/"
                             "negative_prompt_attention_mask when guidance_scale > 1) instead")
        length = max_sequence_length
        prefix = "\n".join(instruction) if instruction else ""
        if prefix:
            # the release's "magic number 2": BOS, and the instruction's trailing token (which merges into the
            # prompt's first one); never fewer than L tokens (only a degenerate tokenizer would get there)
            length = max(max_sequence_length, len(self.tokenizer.encode(prefix)) + max_sequence_length - 2)
        tokens = self.tokenizer(texts, padding="max_length", max_length=length, truncation=True,
                                add_special_tokens=True, return_tensors="pt", padding_side="right")
        input_ids = tokens.input_ids.to(device)
        mask = tokens.attention_mask.to(device)
        hidden = self.text_encoder(input_ids, attention_mask=mask)[0]
        keep = [0] + list(range(-max_sequence_length + 1, 0))
        return hidden[:, keep].to(dtype=dtype, device=device), mask[:, keep]

    def encode_prompt(
        self,
        prompt: Union[str, list[str], None],
        do_classifier_free_guidance: bool = True,
        negative_prompt: Union[str, list[str], None] = RELEASE_NEGATIVE_PROMPT,
        num_videos_per_prompt: int = 1,
        device: Optional[torch.device] = None,
        prompt_embeds: Optional[torch.Tensor] = None,
        negative_prompt_embeds: Optional[torch.Tensor] = None,
        prompt_attention_mask: Optional[torch.Tensor] = None,
        negative_prompt_attention_mask: Optional[torch.Tensor] = None,
        max_sequence_length: int = RELEASE_MAX_SEQUENCE_LENGTH,
        complex_human_instruction: Optional[Sequence[str]] = RELEASE_CHI_PROMPT,
        motion_score: Optional[int] = RELEASE_MOTION_SCORE,
        high_motion: bool = False,
    ):
        """Text-encoder hidden states and masks for the transformer, as the release builds them (see the class
        docstring). Returns ``(prompt_embeds, prompt_attention_mask, negative_prompt_embeds,
        negative_prompt_attention_mask)``, each repeated ``num_videos_per_prompt`` times per prompt; the negative
        pair is None without guidance."""
        device = device or self._execution_device
        dtype = self.text_encoder.dtype if self.text_encoder is not None else None
        if prompt_embeds is None:
            texts = self.assemble_prompts(prompt, motion_score=motion_score, high_motion=high_motion,
                                          complex_human_instruction=complex_human_instruction)
            prompt_embeds, prompt_attention_mask = self._encode_texts(
                texts, instruction=complex_human_instruction, max_sequence_length=max_sequence_length,
                device=device, dtype=dtype)
        batch_size = prompt_embeds.shape[0]
        prompt_embeds = prompt_embeds.to(device).repeat_interleave(num_videos_per_prompt, dim=0)
        prompt_attention_mask = prompt_attention_mask.to(device).repeat_interleave(num_videos_per_prompt, dim=0)

        if not do_classifier_free_guidance:
            return prompt_embeds, prompt_attention_mask, None, None
        if negative_prompt_embeds is None:
            negative_prompt = RELEASE_NEGATIVE_PROMPT if negative_prompt is None else negative_prompt
            negatives = [negative_prompt] * batch_size if isinstance(negative_prompt, str) else list(negative_prompt)
            if len(negatives) != batch_size:
                raise ValueError(f"negative_prompt has {len(negatives)} entries but there are {batch_size} prompts")
            negative_prompt_embeds, negative_prompt_attention_mask = self._encode_texts(
                negatives, instruction=None, max_sequence_length=max_sequence_length, device=device, dtype=dtype)
        negative_prompt_embeds = negative_prompt_embeds.to(device).repeat_interleave(num_videos_per_prompt, dim=0)
        negative_prompt_attention_mask = negative_prompt_attention_mask.to(device).repeat_interleave(
            num_videos_per_prompt, dim=0)
        return prompt_embeds, prompt_attention_mask, negative_prompt_embeds, negative_prompt_attention_mask
