"""Model code accelpatch owns (models diffusers does not ship), one package per model, in diffusers format.
Adapters (how accelpatch patches a model) live in accelpatch.adapters.

Public here (imported on first use): ``SanaVideo2Transformer3DModel``, ``SanaVideo2Pipeline``.
"""
from accelpatch._moved import lazy_attributes

_LAZY = {name: "accelpatch.modeling.sana_video2" for name in ("SanaVideo2Transformer3DModel", "SanaVideo2Pipeline")}

__getattr__ = lazy_attributes(__name__, _LAZY)
