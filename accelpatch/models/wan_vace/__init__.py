"""Wan VACE (diffusers ``WanVACETransformer3DModel``: Wan 2.1 VACE, and Wan 2.2 VACE's ``transformer`` and
``transformer_2``): how accelpatch patches it. Its main blocks are Wan's own classes (diffusers imports them from
``transformer_wan``), so :mod:`.adapter`'s site table puts Wan's fast paths on them; :mod:`.high` holds the one
site kind of its own (the control branch's attention, dense under ``sol_attn``). Imported on first use: importing
this package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, register

_LAZY = {"WanVACEAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="wan_vace", name="Wan VACE", cli="wan-vace", adapter=f"{__name__}.adapter:WanVACEAdapter", order=42,
    demo=DemoSettings("sol", None, steps=2, rounds=6, seconds=51, measured_on="a 2-core AVX-512 EPYC"),
    diffusers_tests="tests/models/transformers/test_models_transformer_wan_vace.py"))
