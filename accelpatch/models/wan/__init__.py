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
    training=TrainingSettings(build="accelpatch.tiny_models.train:build_wan_pipeline",
                              call_kwargs="accelpatch.tiny_models.shipped:wan_call_kwargs", pipeline="WanPipeline")))
