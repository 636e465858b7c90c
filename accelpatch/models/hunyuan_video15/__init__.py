"""HunyuanVideo 1.5 (diffusers ``HunyuanVideo15Transformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, register

_LAZY = {"HunyuanVideo15Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="hunyuan_video15", name="HunyuanVideo 1.5", cli="hunyuan-video15",
    adapter=f"{__name__}.adapter:HunyuanVideo15Adapter", order=50, demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=6),
    diffusers_tests="tests/models/transformers/test_models_transformer_hunyuan_1_5.py"))
