"""LTX-2 and LTX-2.3 (diffusers ``LTX2VideoTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, register

_LAZY = {"LTX2Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="ltx2", name="LTX-2", cli="ltx2", adapter=f"{__name__}.adapter:LTX2Adapter", order=60,
    demo=DemoSettings("sol", None, steps=2, rounds=6, outputs=("frames", "audio"), seconds=6),
    diffusers_tests="tests/models/transformers/test_models_transformer_ltx2.py"))
