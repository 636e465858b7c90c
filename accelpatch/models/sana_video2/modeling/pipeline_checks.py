"""The checks :class:`~accelpatch.models.sana_video2.modeling.pipeline.SanaVideo2Pipeline` runs on a call's
arguments before any work (:class:`SanaVideo2InputChecksMixin`: the pipeline's ``check_inputs``), with the messages
that name the argument and what it must be.
"""
from __future__ import annotations

import math

from accelpatch.models.sana_video2.modeling.pipeline_prompts import motion_prompt_suffix

__all__ = ["OUTPUT_TYPES", "SanaVideo2InputChecksMixin"]

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


class SanaVideo2InputChecksMixin:
    """``check_inputs`` of :class:`~accelpatch.models.sana_video2.modeling.pipeline.SanaVideo2Pipeline` (its VAE
    compression, transformer config, text encoder and callback tensor names)."""

    def check_inputs(self, prompt, negative_prompt, height, width, frames, num_inference_steps, guidance_scale,
                     num_videos_per_prompt, prompt_embeds, prompt_attention_mask, negative_prompt_embeds,
                     negative_prompt_attention_mask, output_type, max_sequence_length, motion_score,
                     callback_on_step_end_tensor_inputs):
        spatial, temporal = self.vae_scale_factor_spatial, self.vae_scale_factor_temporal
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % spatial:
                raise ValueError(f"`{name}` must be a positive multiple of the VAE's spatial compression {spatial}, "
                                 f"got {value!r}")
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1 or (frames - 1) % temporal:
            raise ValueError(f"`frames` must be of the form {temporal}k+1 (1, {temporal + 1}, {2 * temporal + 1}, ...) "
                             f"for the VAE's temporal compression {temporal}, got {frames!r}")
        for name, value in (("num_inference_steps", num_inference_steps),
                            ("num_videos_per_prompt", num_videos_per_prompt),
                            ("max_sequence_length", max_sequence_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be an int >= 1, got {value!r}")
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float)) \
                or not math.isfinite(guidance_scale):
            raise ValueError(f"`guidance_scale` must be a finite number, got {guidance_scale!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {', '.join(map(repr, OUTPUT_TYPES))}, got {output_type!r}")
        motion_prompt_suffix(motion_score)  # validates
        if callback_on_step_end_tensor_inputs is not None:
            unknown = [k for k in callback_on_step_end_tensor_inputs if k not in self._callback_tensor_inputs]
            if unknown:
                raise ValueError(f"`callback_on_step_end_tensor_inputs` must be among {self._callback_tensor_inputs}, "
                                 f"got unknown {unknown}")

        if prompt is not None and prompt_embeds is not None:
            raise ValueError("pass either `prompt` or `prompt_embeds`, not both")
        if prompt is None and prompt_embeds is None:
            raise ValueError("pass `prompt` (a string or a list of strings) or `prompt_embeds`")
        prompt_ok = isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) > 0
                                                and all(isinstance(p, str) for p in prompt))
        if prompt is not None and not prompt_ok:
            raise ValueError(f"`prompt` must be a string or a non-empty list of strings, got {type(prompt).__name__}")
        if negative_prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("pass either `negative_prompt` or `negative_prompt_embeds`, not both")
        if prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("`negative_prompt_embeds` goes with `prompt_embeds`; with `prompt`, pass "
                             "`negative_prompt`")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            batch = len(prompt) if isinstance(prompt, list) else 1 if prompt is not None else prompt_embeds.shape[0]
            if not (isinstance(negative_prompt, list) and all(isinstance(p, str) for p in negative_prompt)):
                raise ValueError("`negative_prompt` must be a string or a list of strings, got "
                                 f"{type(negative_prompt).__name__}")
            if len(negative_prompt) != batch:
                raise ValueError(f"`negative_prompt` has {len(negative_prompt)} entries for {batch} prompts")

        caption_channels = self.transformer.config.caption_channels
        for name, embeds, mask_name, mask in (
                ("prompt_embeds", prompt_embeds, "prompt_attention_mask", prompt_attention_mask),
                ("negative_prompt_embeds", negative_prompt_embeds, "negative_prompt_attention_mask",
                 negative_prompt_attention_mask)):
            if embeds is None:
                continue
            if mask is None:
                raise ValueError(f"`{mask_name}` is required with `{name}`")
            if embeds.dim() != 3 or embeds.shape[-1] != caption_channels:
                raise ValueError(f"`{name}` must be [batch, tokens, {caption_channels}] (the transformer's "
                                 f"caption_channels), got {tuple(embeds.shape)}")
            if tuple(mask.shape) != tuple(embeds.shape[:2]):
                raise ValueError(f"`{mask_name}` must be [batch, tokens] = {tuple(embeds.shape[:2])}, got "
                                 f"{tuple(mask.shape)}")
        if prompt_embeds is not None and negative_prompt_embeds is not None \
                and prompt_embeds.shape != negative_prompt_embeds.shape:
            raise ValueError("`prompt_embeds` and `negative_prompt_embeds` must have the same shape, got "
                             f"{tuple(prompt_embeds.shape)} and {tuple(negative_prompt_embeds.shape)}")
        if guidance_scale > 1 and prompt_embeds is not None and negative_prompt_embeds is None:
            if self.tokenizer is None or self.text_encoder is None:
                raise ValueError("guidance_scale > 1 needs `negative_prompt_embeds` and "
                                 "`negative_prompt_attention_mask` when the pipeline has no text encoder")
            if max_sequence_length != prompt_embeds.shape[1]:
                raise ValueError(f"the negative prompt would be encoded to max_sequence_length={max_sequence_length}"
                                 f" tokens but `prompt_embeds` has {prompt_embeds.shape[1]}; leave "
                                 "max_sequence_length unset or pass `negative_prompt_embeds`")
