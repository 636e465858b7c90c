"""Wan 2.x (diffusers ``WanTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, MemorySettings, TrainingSettings, VaeDecodeCase, register

_LAZY = {"WanAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="wan", name="Wan 2.x", cli="wan", adapter=f"{__name__}.adapter:WanAdapter", order=40,
    demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=25),
    diffusers_tests="tests/models/transformers/test_models_transformer_wan.py",
    # read from diffusers 0.42.1's pipeline_wan.py; tried last: "wan" is a short word
    memory=MemorySettings(
        names=("wan",), name_order=60, transformer="diffusers:WanTransformer3DModel",
        release_config=f"{__name__}.memory:release_config", experts=f"{__name__}.memory:experts",
        conditioning=f"{__name__}.memory:conditioning",
        transformer_inputs=f"{__name__}.memory:transformer_inputs", frames=f"{__name__}.memory:frames",
        temporal=4, spatial=8, multiple=16, text_tokens=512,
        text_source="WanPipeline (and WanImageToVideoPipeline) pads the prompt to max_sequence_length 512", cfg="sequential", guidance=5.0,
        size=(480, 832, 81), text_encoder="UMT5-XXL",
        text_encoders=f"{__name__}.memory:text_encoders",
        vae=VaeDecodeCase("AutoencoderKLWan", source="diffusers' AutoencoderKLWan defaults (the Wan 2.1 VAE)",
                          repeated=("decoder",), encode_repeated=("encoder",))),
    # the demo shows Sol-Attn: on the 4-layer, 512-token toy its 12,288-token floor would keep it wholly dense, so
    # high would show nothing; its default guard (layers 0 and 1 dense) misses the 24 dB floor on one frame there,
    # the guard over three layers passes (docs/tiny-models.md)
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_wan_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:wan_call_kwargs", pipeline="WanPipeline",
                              demo_options=(("backend", "sol_attn"), ("dense_layers", "0,1,2"), ("min_tokens", 0)),
                              # the shipped run: 4 layers at 1e-3 on the full clip mix, then the "moves" clips
                              # alone (docs/tiny-models.md: direction 1 of 16 without that phase, 12 with it)
                              config_defaults=(("lr", 1e-3), ("steps", 7000), ("motion_steps", 2000)))))
