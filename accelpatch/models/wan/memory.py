"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of Wan beyond its registered
:class:`~accelpatch.models.families.MemorySettings`: the release configurations known here, one forward's inputs, and
how ``WanPipeline`` (diffusers 0.42.1's pipeline_wan.py) rounds the frames. Imports nothing."""
from __future__ import annotations


def release_config(name: str):
    """Wan 2.1 T2V 1.3B's configuration (:mod:`accelpatch.testing.wan`'s) and 14B's (diffusers' defaults), and Wan
    2.2 A14B's experts: each of the two has Wan 2.1 14B's shape (Wan 2.2's own t2v_A14B configuration: dim
    5,120, 40 heads, 40 layers, feed-forward 13,824, 16 latent channels, the Wan 2.1 VAE and UMT5-XXL), the I2V
    ones reading 36 channels (:data:`WAN22_I2V_A14B`)."""
    if "wan2.1-t2v-1.3b" in name:
        return "WAN_1_3B_CONFIG", "accelpatch.testing.wan.WAN_1_3B_CONFIG (Wan 2.1 T2V 1.3B)"
    if "wan2.1-t2v-14b" in name:
        return {}, "diffusers' WanTransformer3DModel defaults (Wan 2.1 14B)"
    if "wan2.2-t2v-a14b" in name:
        return {}, "diffusers' WanTransformer3DModel defaults (Wan 2.1 14B's shape: Wan 2.2 T2V A14B's experts)"
    if "wan2.2-i2v-a14b" in name:
        return WAN22_I2V_A14B, ("Wan 2.2 I2V A14B's experts: Wan 2.1 14B's shape reading 36 latent channels "
                                "(diffusers' Wan conversion configuration)")
    return None


#: Wan 2.2 I2V A14B's experts, as diffusers' Wan conversion configures them: Wan 2.1 14B's shape (its class
#: defaults) reading 36 channels, the 16 noisy latents beside the 4 of the frame mask and the 16 of the encoded
#: conditioning video; no image encoder (no image_dim), unlike Wan 2.1 I2V's CLIP
WAN22_I2V_A14B = {"in_channels": 36}


def conditioning(call, model: str, frames: int) -> int:
    """WanImageToVideoPipeline VAE-encodes a video of every frame of the call (the image, then zeros, or the last
    image too) before denoising; text-to-video encodes nothing."""
    return frames if "i2v" in model else 0


def experts(name: str) -> int:
    """WanPipeline loads Wan 2.2 A14B's two experts (``transformer`` for high noise, ``transformer_2`` below its
    boundary), one running each step; every other Wan one."""
    return 2 if "wan2.2" in name and "a14b" in name else 1


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens)


def frames(n: int) -> int:
    """WanPipeline rounds num_frames down to 4k + 1 (its VAE's temporal compression is 4)."""
    return n // 4 * 4 + 1 if (n - 1) % 4 else n


#: UMT5-XXL's encoder as the Wan 2.1 Diffusers checkpoints ship it (text_encoder/config.json)
UMT5_XXL = dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=256384,
                feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                relative_attention_num_buckets=32, relative_attention_max_distance=128, tie_word_embeddings=False)


def text_encoders(call, model: str = "") -> tuple:
    """WanPipeline's UMT5-XXL encoder on the prompt padded to max_sequence_length (512 by default)."""
    from accelpatch.models.families import TextEncoderCase

    tokens = int(call.get("max_sequence_length") or 512)
    return (TextEncoderCase("UMT5-XXL encoder", "transformers:UMT5EncoderModel", "transformers:UMT5Config",
                            UMT5_XXL, tokens, "the Wan 2.1 Diffusers checkpoints' text_encoder/config.json"),)
