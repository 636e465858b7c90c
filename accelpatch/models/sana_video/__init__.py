"""SANA-Video (diffusers ``SanaVideoTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter;
:mod:`.block` and :mod:`.linear_attention` its fast paths (the adapter's docstring says which tier each holds).
Imported on first use: importing this package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import (DemoSettings, Family, MemorySettings, RecipeSettings, TrainingSettings,
                                        VaeDecodeCase, register)

_LAZY = {"SanaVideoAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="sana_video", name="SANA-Video", cli="sana-video", adapter=f"{__name__}.adapter:SanaVideoAdapter", order=10,
    demo=DemoSettings("sana", "SANA_VIDEO_RELEASE_LIKE_CONFIG", steps=4, rounds=12, seconds=8),
    recipe=RecipeSettings(transformer_config="SANA_VIDEO_RELEASE_LIKE_CONFIG"),
    # read from diffusers 0.42.1's pipeline_sana_video.py; its 480p models decode with the Wan 2.1 VAE
    memory=MemorySettings(
        names=("sana-video",), name_order=20, transformer="diffusers:SanaVideoTransformer3DModel",
        release_config=f"{__name__}.memory:release_config",
        transformer_inputs=f"{__name__}.memory:transformer_inputs",
        temporal=4, spatial=8, multiple=16, text_tokens=300,
        text_source="SanaVideoPipeline pads the prompt to max_sequence_length 300", cfg="batch", guidance=6.0,
        size=(480, 832, 81), text_encoder="Gemma-2",
        text_encoders=f"{__name__}.memory:text_encoders",
        vae=VaeDecodeCase("AutoencoderKLWan", source="diffusers' AutoencoderKLWan defaults (the Wan 2.1 VAE)",
                          repeated=("decoder",), encode_repeated=("encoder",))),
    # decodes with Wan's VAE class and latent normalisation, so it trains on the shipped Wan's VAE; no
    # prompt-rewriting instruction (the tiny vocabulary has none). The demo shows the step cache at threshold 0.3
    # with 3 warm-up steps (reuses 2 of 8 steps and passes validate's gates here; with the default 2 it fails the
    # floors, docs/tiny-models.md): its own high path (BF16 operands in the linear attention's first GEMM) needs
    # CUDA, and the cache's default threshold reuses no step of this 8-step call
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_sana_video_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:sana_video_call_kwargs",
                              pipeline="SanaVideoPipeline", vae_from="wan",
                              encode_kwargs=(("complex_human_instruction", ()),),
                              demo_options=(("cache", "first_block"), ("cache_threshold", 0.3),
                                            ("cache_warmup_steps", 3)),
                              # 4 layers at these settings learn direction from a "moves" phase, and a mixed phase
                              # after it keeps growth apart from shrinking (docs/tiny-models.md)
                              config_defaults=(("lr", 1e-3), ("steps", 7000), ("motion_steps", 2000),
                                               ("motion_words", (("moves",), ("moves", "grows", "shrinks")))))))
