"""SANA-Video 2.0: accelpatch's own ``SanaVideo2Transformer3DModel`` and ``SanaVideo2Pipeline`` in diffusers format
(:mod:`.modeling`, checkpoints from :mod:`.release`), and how accelpatch patches it: :mod:`.adapter` holds the model's
site table (which module, which fast path, which tier) and its adapter, :mod:`.lossless` its lossless fused paths,
:mod:`.high` its ``high`` paths.
Imported on first use: importing this package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, MemorySettings, TrainingSettings, register
from accelpatch.models.ltx2.memory import ltx23_video_vae

_LAZY = {"SanaVideo2Adapter": f"{__name__}.adapter", "SanaVideo2Transformer3DModel": f"{__name__}.modeling",
         "SanaVideo2Pipeline": f"{__name__}.modeling"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="sana_video2", name="SANA-Video 2.0", cli="sana-video2", adapter=f"{__name__}.adapter:SanaVideo2Adapter",
    order=20, demo=DemoSettings("sana", "SANA_VIDEO2_MEDIUM_CONFIG", steps=4, rounds=12, seconds=11),
    # read from our SanaVideo2Pipeline; its names are tried before SANA-Video's ("sana-video2" holds "sana-video")
    memory=MemorySettings(
        names=("sana-video2", "sana-video-2.0"), name_order=10,
        transformer=f"{__name__}.modeling:SanaVideo2Transformer3DModel",
        release_config=f"{__name__}.memory:release_config",
        transformer_inputs=f"{__name__}.memory:transformer_inputs",
        temporal=8, spatial=32, multiple=32, text_tokens=300,
        text_source="SanaVideo2Pipeline: the transformer's model_max_length 300", cfg="batch", guidance=8.0,
        size=(736, 1280, 193), text_encoder="Gemma-2",
        text_encoders=f"{__name__}.memory:text_encoders",
        vae=ltx23_video_vae()),
    # its own LTX-2 VAE; no prompt-rewriting instruction and no motion-score suffix (the tiny vocabulary has neither).
    # The demo shows Sol-Attn on the softmax anchor (its BF16 anchor path needs CUDA); the default guard would keep
    # the toy's anchor, layer 1, dense, and its 512 tokens are under the default floor
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_sana_video2_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:sana_video2_call_kwargs",
                              pipeline="SanaVideo2Pipeline", pipeline_module=f"{__name__}.modeling",
                              encode_kwargs=(("complex_human_instruction", None), ("motion_score", None)),
                              demo_options=(("backend", "sol_attn"), ("dense_layers", ""), ("min_tokens", 0)))))
