"""Classes accelpatch offers in the ``diffusers`` namespace, where ``DiffusionPipeline.from_pretrained`` looks up a
saved folder's ``_class_name``: a pipeline class of accelpatch's own then loads with diffusers' generic loader once
the module that offers it is imported. The offer is lazy (a module ``__getattr__``, PEP 562, which Python consults
before diffusers' own lazy lookup), so the class's module is imported only when diffusers asks for it; a name
diffusers defines itself is never shadowed."""
from __future__ import annotations

import importlib

#: offered name -> "module:attribute" that defines it
_OFFERED: dict[str, str] = {}


def offer_to_diffusers(name: str, where: str) -> None:
    """Make ``diffusers.<name>`` resolve to the class ``where`` names ("module:attribute"), imported on first use."""
    import diffusers

    namespace = vars(diffusers)
    if (name in namespace or name in getattr(diffusers, "_class_to_module", {})
            or name in getattr(diffusers, "_objects", {})):
        return
    _OFFERED[name] = where
    previous = namespace.get("__getattr__")
    if getattr(previous, "_accelpatch_offers", False):
        return  # our lookup is installed: it reads _OFFERED

    def __getattr__(attribute: str):
        if attribute in _OFFERED:
            module, _, value = _OFFERED[attribute].partition(":")
            found = getattr(importlib.import_module(module), value)
            setattr(diffusers, attribute, found)  # for good: later lookups find the attribute itself
            return found
        if previous is not None:
            return previous(attribute)
        raise AttributeError(f"module 'diffusers' has no attribute {attribute!r}")  # then diffusers' own lookup

    __getattr__._accelpatch_offers = True
    diffusers.__getattr__ = __getattr__
