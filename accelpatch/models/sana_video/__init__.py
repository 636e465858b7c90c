"""SANA-Video (diffusers ``SanaVideoTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter;
:mod:`.block` and :mod:`.linear_attention` its fast paths (the adapter's docstring says which tier each holds).
Imported on first use: importing this package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes

_LAZY = {"SanaVideoAdapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)
