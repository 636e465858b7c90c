"""HunyuanVideo 1.5 (diffusers ``HunyuanVideo15Transformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, MemorySettings, TrainingSettings, VaeDecodeCase, register

_LAZY = {"HunyuanVideo15Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="hunyuan_video15", name="HunyuanVideo 1.5", cli="hunyuan-video15",
    adapter=f"{__name__}.adapter:HunyuanVideo15Adapter", order=50, demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=6),
    diffusers_tests="tests/models/transformers/test_models_transformer_hunyuan_1_5.py",
    memory=MemorySettings(  # read from diffusers 0.42.1's pipeline_hunyuan_video1_5*.py
        names=("hunyuanvideo-1.5", "hunyuan-video15"), name_order=40,
        transformer="diffusers:HunyuanVideo15Transformer3DModel", release_config=f"{__name__}.memory:release_config",
        conditioning=f"{__name__}.memory:conditioning",
        transformer_inputs=f"{__name__}.memory:transformer_inputs", temporal=4, spatial=16, multiple=16,
        text_tokens=1000, text_source="HunyuanVideo 1.5 pads Qwen2.5-VL to 1000 tokens, ByT5 to 256, and adds 729 "
        "SigLIP image tokens", cfg="sequential", guidance=None, size=None, text_encoder="Qwen2.5-VL, ByT5 and SigLIP",
        text_encoders=f"{__name__}.memory:text_encoders",
        vae=VaeDecodeCase(
            "AutoencoderKLHunyuanVideo15", source="diffusers' AutoencoderKLHunyuanVideo15 defaults; whole, its "
            "mid-block attends over the whole clip's latents with a frame-causal mask", repeated=("decoder",),
            stand_ins=(("diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15:"
                        "HunyuanVideo15AttnBlock.prepare_causal_attention_mask", f"{__name__}.memory:causal_mask"),))),
    # the pipeline feeds two text streams, zero image embeddings and latents with zero condition channels: the
    # trained tiny one learns from exactly those (accelpatch.tiny_models.hunyuan_video15). Its VAE learns from two
    # clips a step, encoded and decoded one per call (a batch fails in diffusers 0.42), at 3e-4 (measured: at 4e-3 a
    # tiny 16x one's posterior variance blew up within 50 steps; at 1e-3 two 700-step passes left the 8x one at MSE
    # 0.12-0.18 with 10-23 % of the colour; at 3e-4 one clip a step gave yellow back red; two clips a step: MSE 0.067,
    # 93 %, every colour). Its transformer still draws 3 of 8 prompts' colours (2 or 4 layers, lr 5e-4 to 2e-3), so
    # no trained HunyuanVideo 1.5 ships (docs/tiny-models.md)
    training=TrainingSettings(build="accelpatch.tiny_models.hunyuan_video15:build_hunyuan_video15_pipeline",
                              call_kwargs="accelpatch.tiny_models.hunyuan_video15:hunyuan_video15_call_kwargs",
                              pipeline="TinyHunyuanVideo15Pipeline",
                              pipeline_module="accelpatch.models.hunyuan_video15.pipeline",
                              text_inputs="accelpatch.tiny_models.hunyuan_video15:text_inputs",
                              model_inputs="accelpatch.tiny_models.hunyuan_video15:model_inputs",
                              config_defaults=(("vae_batch_size", 2), ("vae_clips_per_call", 1), ("vae_lr", 3e-4)),
                              demo_options=(("backend", "sol_attn"), ("dense_layers", ""), ("min_tokens", 0)))))
