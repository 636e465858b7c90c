"""Wan 2.x (diffusers ``WanTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, TrainingSettings, register

_LAZY = {"WanAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="wan", name="Wan 2.x", cli="wan", adapter=f"{__name__}.adapter:WanAdapter", order=40,
    demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=25),
    diffusers_tests="tests/models/transformers/test_models_transformer_wan.py",
    # the demo shows Sol-Attn: on the 2-layer, 512-token toy its defaults (dense layers 0 and 1, the 12,288-token
    # floor) would keep it wholly dense, so high would show nothing (the demo's sol_attn sections do the same)
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_wan_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:wan_call_kwargs", pipeline="WanPipeline",
                              demo_options=(("backend", "sol_attn"), ("dense_layers", ""), ("min_tokens", 0)))))
