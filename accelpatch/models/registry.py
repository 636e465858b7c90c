"""Every registered family's adapter, and the lookup of a model's family (the models themselves are diffusers', or
ours under accelpatch.models.sana_video2.modeling)."""
from __future__ import annotations

import torch

from accelpatch.core.adapter import ModelAdapter
from accelpatch.models.families import families

#: one adapter per registered family (:mod:`accelpatch.models.families`), in the families' order
ADAPTERS: list[ModelAdapter] = [family.adapter_class()() for family in families()]


def find_adapter(model: torch.nn.Module) -> ModelAdapter:
    for adapter in ADAPTERS:
        if adapter.matches(model):
            return adapter
    supported = ", ".join(name for adapter in ADAPTERS for name in adapter.class_names)
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, torch.nn.Module):  # torch.compile's wrapper (OptimizedModule) around a model
        try:
            family = find_adapter(inner).family
        except ValueError:
            family = None
        if family is not None:
            raise ValueError(f"this {type(inner).__name__} is already wrapped by torch.compile "
                             f"({type(model).__name__}): apply accelpatch before compiling (accelpatch.apply(pipe), "
                             "then pipe.transformer = torch.compile(pipe.transformer), or transformer.compile() in "
                             "place), or apply it to the model inside, its ._orig_mod")
    raise ValueError(f"accelpatch does not support {type(model).__name__}; supported model classes: {supported}")
