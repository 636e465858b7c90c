"""``TinyHunyuanVideo15Pipeline``: diffusers' ``HunyuanVideo15Pipeline`` whose sequence lengths are part of its
saved configuration.

diffusers keeps them as plain attributes set in ``__init__`` (the Qwen prompt's system prefix it crops, 108 tokens,
and its 1,000 tokens; ByT5's 256; 729 image tokens), which ``save_pretrained`` does not write: a tiny pipeline built
with shorter ones (:func:`accelpatch.testing.tiny_hunyuan_video15_pipeline`) came back from ``from_pretrained``
with the release's, so a saved tiny pipeline, or one trained at its own lengths, would not run as it was built.
This subclass takes them as ``__init__`` arguments and registers them in its config (``model_index.json``), which
``from_pretrained`` passes back. Importing this module offers it in the ``diffusers`` namespace, so
``DiffusionPipeline.from_pretrained`` loads a saved folder after that import (the tiny builder and the shipped
trained pipeline's loader import it).
"""
from __future__ import annotations

from diffusers import HunyuanVideo15Pipeline

from accelpatch.core.diffusers_namespace import offer_to_diffusers

#: the four lengths and diffusers' values for the release (its ``__init__`` sets them)
RELEASE_LENGTHS = {"prompt_template_encode_start_idx": 108, "tokenizer_max_length": 1000,
                   "tokenizer_2_max_length": 256, "vision_num_semantic_tokens": 729}


class TinyHunyuanVideo15Pipeline(HunyuanVideo15Pipeline):
    """``HunyuanVideo15Pipeline`` with its text, glyph and image sequence lengths saved in its config (defaults: the
    release's, so it behaves as diffusers' class unless built shorter)."""

    def __init__(self, text_encoder, tokenizer, transformer, vae, scheduler, text_encoder_2, tokenizer_2, guider,
                 prompt_template_encode_start_idx: int = 108, tokenizer_max_length: int = 1000,
                 tokenizer_2_max_length: int = 256, vision_num_semantic_tokens: int = 729):
        super().__init__(text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer, vae=vae,
                         scheduler=scheduler, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, guider=guider)
        self.set_lengths(prompt_template_encode_start_idx=prompt_template_encode_start_idx,
                         tokenizer_max_length=tokenizer_max_length, tokenizer_2_max_length=tokenizer_2_max_length,
                         vision_num_semantic_tokens=vision_num_semantic_tokens)

    def set_lengths(self, **lengths: int) -> None:
        """Set any of the four lengths (:data:`RELEASE_LENGTHS`' names), in the config and where diffusers' methods
        read them; ValueError naming a length that is unknown or too small."""
        for name, value in lengths.items():
            if name not in RELEASE_LENGTHS:
                raise ValueError(f"unknown length {name!r}; the lengths are {', '.join(RELEASE_LENGTHS)}")
            least = 0 if name == "prompt_template_encode_start_idx" else 1
            if int(value) < least:
                raise ValueError(f"{name}={value} must be at least {least}")
        lengths = {name: int(value) for name, value in lengths.items()}
        self.register_to_config(**lengths)
        self.__dict__.update(lengths)

    def fit_lengths(self, *, text: int, glyph: int, image: int) -> None:
        """Set the lengths for this pipeline's own tokenizer: ``text`` Qwen tokens after the chat template's system
        prefix, which it counts with this tokenizer (the release's 108 are its tokenizer's count), ``glyph`` ByT5
        tokens and ``image`` image tokens."""
        prefix = f"<|im_start|>system\n{self.system_message}<|im_end|>\n<|im_start|>user\n"
        self.set_lengths(prompt_template_encode_start_idx=len(self.tokenizer(prefix)["input_ids"]),
                         tokenizer_max_length=text, tokenizer_2_max_length=glyph, vision_num_semantic_tokens=image)


offer_to_diffusers("TinyHunyuanVideo15Pipeline",
                   "accelpatch.models.hunyuan_video15.pipeline:TinyHunyuanVideo15Pipeline")
