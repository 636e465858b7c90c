"""Model code accelpatch owns (models diffusers does not ship), one package per model, in diffusers format.
Adapters (how accelpatch patches a model) live in accelpatch.adapters.

Public here (imported on first use): ``SanaVideo2Transformer3DModel``, ``SanaVideo2Pipeline``.
"""


_LAZY = {name: "accelpatch.modeling.sana_video2" for name in ("SanaVideo2Transformer3DModel", "SanaVideo2Pipeline")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
