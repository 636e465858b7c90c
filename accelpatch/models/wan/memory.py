"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of Wan beyond its registered
:class:`~accelpatch.models.families.MemorySettings`: the release configurations known here, one forward's inputs, and
how ``WanPipeline`` (diffusers 0.42.1's pipeline_wan.py) rounds the frames. Imports nothing."""
from __future__ import annotations


def release_config(name: str):
    """Wan 2.1 T2V 1.3B's configuration (:mod:`accelpatch.testing.wan`'s) and 14B's (diffusers' defaults), and Wan
    2.2 A14B's experts: each of the two has Wan 2.1 14B's shape (Wan 2.2's own t2v_A14B configuration: dim
    5,120, 40 heads, 40 layers, feed-forward 13,824, 16 latent channels, the Wan 2.1 VAE and UMT5-XXL), the I2V
    ones reading 36 channels (:data:`WAN22_I2V_A14B`); Wan 2.1 I2V 14B (480p and 720p alike,
    :data:`WAN21_I2V_14B`), which also reads its CLIP image encoder's tokens. Wan 2.1 FLF2V (two images, positions
    for their tokens) is not known here."""
    if "wan2.1-t2v-1.3b" in name:
        return "WAN_1_3B_CONFIG", "accelpatch.testing.wan.WAN_1_3B_CONFIG (Wan 2.1 T2V 1.3B)"
    if "wan2.1-t2v-14b" in name:
        return {}, "diffusers' WanTransformer3DModel defaults (Wan 2.1 14B)"
    if "wan2.2-t2v-a14b" in name:
        return {}, "diffusers' WanTransformer3DModel defaults (Wan 2.1 14B's shape: Wan 2.2 T2V A14B's experts)"
    if "wan2.1-i2v-14b" in name:
        return WAN21_I2V_14B, ("Wan 2.1 I2V 14B: Wan 2.1 14B's shape reading 36 latent channels and 257 CLIP image "
                               "tokens of 1,280 (diffusers' Wan conversion configuration)")
    if "wan2.2-i2v-a14b" in name:
        return WAN22_I2V_A14B, ("Wan 2.2 I2V A14B's experts: Wan 2.1 14B's shape reading 36 latent channels "
                                "(diffusers' Wan conversion configuration)")
    return None


#: Wan 2.2 I2V A14B's experts, as diffusers' Wan conversion configures them: Wan 2.1 14B's shape (its class
#: defaults) reading 36 channels, the 16 noisy latents beside the 4 of the frame mask and the 16 of the encoded
#: conditioning video; no image encoder (no image_dim), unlike Wan 2.1 I2V's CLIP
WAN22_I2V_A14B = {"in_channels": 36}


#: Wan 2.1 I2V 14B's transformer, as diffusers' Wan conversion configures the 480p and 720p checkpoints: Wan 2.1
#: 14B's shape (its class defaults) reading 36 channels, its image embedder taking CLIP's 1,280-wide tokens and every
#: block's cross-attention adding their keys and values (added_kv_proj_dim 5,120)
WAN21_I2V_14B = {"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}

#: the CLIP image tokens WanImageToVideoPipeline hands the transformer: ViT-H/14 at 224 pixels, 16 x 16 patches and
#: the class token, one image (its second-to-last hidden state)
CLIP_IMAGE_TOKENS = 257


def conditioning(call, model: str, frames: int) -> int:
    """WanImageToVideoPipeline VAE-encodes a video of every frame of the call (the image, then zeros, or the last
    image too) before denoising; text-to-video encodes nothing."""
    return frames if "i2v" in model else 0


def experts(name: str) -> int:
    """WanPipeline loads Wan 2.2 A14B's two experts (``transformer`` for high noise, ``transformer_2`` below its
    boundary), one running each step; every other Wan one."""
    return 2 if "wan2.2" in name and "a14b" in name else 1


def transformer_inputs(case) -> dict:
    """The latents and text; with Wan 2.1 I2V's image embedder (``image_dim``), CLIP's image tokens too."""
    config = case.config if isinstance(case.config, dict) else {}
    return dict(batch_size=case.batch, num_frames=case.frames, height=case.height, width=case.width,
                text_len=case.text_tokens, image_len=CLIP_IMAGE_TOKENS if config.get("image_dim") else 0)


def frames(n: int) -> int:
    """WanPipeline rounds num_frames down to 4k + 1 (its VAE's temporal compression is 4)."""
    return n // 4 * 4 + 1 if (n - 1) % 4 else n


#: UMT5-XXL's encoder as the Wan 2.1 Diffusers checkpoints ship it (text_encoder/config.json)
UMT5_XXL = dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=256384,
                feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", is_gated_act=True,
                relative_attention_num_buckets=32, relative_attention_max_distance=128, tie_word_embeddings=False)


#: CLIP ViT-H/14's vision tower (laion/CLIP-ViT-H-14-laion2B-s32B-b79K, which diffusers' Wan conversion loads as
#: Wan 2.1 I2V's image_encoder): width 1,280, 32 layers of 16 heads, MLP 5,120, patches of 14 at 224 pixels, a
#: 1,024-wide projection
CLIP_VIT_H_14 = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                     image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu")


def text_encoders(call, model: str = "") -> tuple:
    """WanPipeline's UMT5-XXL encoder on the prompt padded to max_sequence_length (512 by default); Wan 2.1 I2V
    adds its CLIP image encoder, called on the image with every layer's hidden state asked for (it keeps the
    second-to-last)."""
    from accelpatch.models.families import TextEncoderCase

    tokens = int(call.get("max_sequence_length") or 512)
    text = (TextEncoderCase("UMT5-XXL encoder", "transformers:UMT5EncoderModel", "transformers:UMT5Config",
                            UMT5_XXL, tokens, "the Wan 2.1 Diffusers checkpoints' text_encoder/config.json"),)
    image = (TextEncoderCase("CLIP ViT-H/14 (image)", "transformers:CLIPVisionModelWithProjection",
                             "transformers:CLIPVisionConfig", CLIP_VIT_H_14, CLIP_IMAGE_TOKENS,
                             "laion/CLIP-ViT-H-14-laion2B-s32B-b79K's vision configuration (diffusers' Wan conversion)",
                             output="hidden_states", image_size=224,
                             note="image encoder: in the plan's dtype; diffusers' Wan 2.1 I2V example loads it in "
                                  "float32, twice its weights"),)
    return (image if "wan2.1-i2v" in model else ()) + text
