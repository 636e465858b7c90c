"""SANA-Video 2.0: accelpatch's own ``SanaVideo2Transformer3DModel`` and ``SanaVideo2Pipeline`` in diffusers format
(:mod:`.modeling`, checkpoints from :mod:`.release`), and how accelpatch patches it: :mod:`.adapter` holds the model's
site table (which module, which fast path, which tier) and its adapter, :mod:`.lossless` its lossless fused paths,
:mod:`.high` its ``high`` paths.
Imported on first use: importing this package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, TrainingSettings, register

_LAZY = {"SanaVideo2Adapter": f"{__name__}.adapter", "SanaVideo2Transformer3DModel": f"{__name__}.modeling",
         "SanaVideo2Pipeline": f"{__name__}.modeling"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="sana_video2", name="SANA-Video 2.0", cli="sana-video2", adapter=f"{__name__}.adapter:SanaVideo2Adapter",
    order=20, demo=DemoSettings("sana", "SANA_VIDEO2_MEDIUM_CONFIG", steps=4, rounds=12, seconds=11),
    # its own LTX-2 VAE; no prompt-rewriting instruction and no motion-score suffix (the tiny vocabulary has neither).
    # The demo shows Sol-Attn on the softmax anchor (its BF16 anchor path needs CUDA); the default guard would keep
    # the toy's anchor, layer 1, dense, and its 512 tokens are under the default floor
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_sana_video2_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:sana_video2_call_kwargs",
                              pipeline="SanaVideo2Pipeline", pipeline_module=f"{__name__}.modeling",
                              encode_kwargs=(("complex_human_instruction", None), ("motion_score", None)),
                              demo_options=(("backend", "sol_attn"), ("dense_layers", ""), ("min_tokens", 0)))))
