"""Wan Animate (diffusers ``WanAnimateTransformer3DModel``: Wan2.2-Animate): how accelpatch patches it. Its blocks
are diffusers' copies of Wan's (``transformer_wan_animate`` holds ``# Copied from`` copies of ``WanTransformerBlock``,
``WanAttention`` and ``WanAttnProcessor``), so :mod:`.lossless` and :mod:`.high` are Wan's fast paths pointed at
those copies, and :mod:`.adapter` says where they sit. Imported on first use: importing this package imports neither
torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, register

_LAZY = {"WanAnimateAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="wan_animate", name="Wan Animate", cli="wan-animate", adapter=f"{__name__}.adapter:WanAnimateAdapter",
    order=44, demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=45, measured_on="a 2-core AVX-512 EPYC"),
    diffusers_tests="tests/models/transformers/test_models_transformer_wan_animate.py"))
