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


def conditioning(call, model: str, frames: int) -> int:
    """HunyuanVideo15ImageToVideoPipeline VAE-encodes its image as one frame (then repeats the latents); text to
    video encodes nothing."""
    return 1 if "i2v" in model else 0


def transformer_inputs(case) -> dict:
    """ByT5's ``case.glyph_tokens`` and ``case.image_tokens`` SigLIP tokens beside the text, all valid."""
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens, text_valid=case.text_tokens, text_2_len=case.glyph_tokens,
                text_2_valid=case.glyph_tokens, image_tokens=case.image_tokens, image=True)


#: Qwen2.5-VL-7B-Instruct's language model (the pipeline's Qwen2_5_VLTextModel)
QWEN25_VL_7B_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6, max_position_embeddings=128000)
#: ByT5-small's encoder (the glyph encoder is ByT5-small fine-tuned; its vocabulary may differ by a few hundred tokens)
BYT5_SMALL = dict(d_model=1472, d_ff=3584, d_kv=64, num_heads=6, num_layers=12, vocab_size=384,
                  feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                  relative_attention_num_buckets=32, relative_attention_max_distance=128, tie_word_embeddings=False)


#: SigLIP so400m at 384 pixels, patches of 14 (27 x 27 = the pipeline's 729 image tokens)
SIGLIP_SO400M_384 = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                         image_size=384, patch_size=14)


def text_encoders(call, model: str = "") -> tuple:
    """HunyuanVideo15Pipeline's two encoders: Qwen2.5-VL-7B's language model on 1000 tokens + its 108-token prompt
    template (every layer's hidden state asked for, one kept), and the ByT5 glyph encoder on 256 tokens; an
    image-to-video checkpoint ("i2v" in its name) adds its SigLIP image encoder on one image."""
    from accelpatch.models.families import TextEncoderCase

    image = (TextEncoderCase("SigLIP so400m (image)", "transformers:SiglipVisionModel",
                             "transformers:SiglipVisionConfig", SIGLIP_SO400M_384, 729,
                             "its 729 image tokens: SigLIP so400m-patch14-384's configuration", image_size=384),)
    text = (TextEncoderCase("Qwen2.5-VL-7B (text)", "transformers:Qwen2_5_VLTextModel",
                            "transformers:Qwen2_5_VLTextConfig", QWEN25_VL_7B_TEXT, 1000 + 108,
                            "Qwen2.5-VL-7B-Instruct's config.json (text part)", output="hidden_states"),
            TextEncoderCase("ByT5-small (glyphs)", "transformers:T5EncoderModel", "transformers:T5Config", BYT5_SMALL,
                            256, "google/byt5-small's config.json"))
    return (image if "i2v" in model else ()) + text


def causal_mask(n_frame: int, n_hw: int, dtype, device, batch_size=None):
    """The memory planner's stand-in for ``HunyuanVideo15AttnBlock.prepare_causal_attention_mask`` on fake tensors:
    the same (tokens x tokens) tensor of ``dtype``, expanded over the batch as diffusers does, without diffusers'
    Python loop over every token (49,290 of them at 480p x 121 frames, 2 minutes of a fake trace) that writes the
    causal pattern in place, values the trace does not keep."""
    import torch

    seq_len = n_frame * n_hw
    mask = torch.full((seq_len, seq_len), float("-inf"), dtype=dtype, device=device)
    return mask if batch_size is None else mask.unsqueeze(0).expand(batch_size, -1, -1)
