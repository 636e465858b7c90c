"""Every registered family's adapter, and the lookup of a model's family (the models themselves are diffusers', or
ours under accelpatch.models.sana_video2.modeling). ``accelpatch/__init__.py`` names :data:`ADAPTERS` to the core
(:func:`accelpatch.core.features.host_adapters`)."""
from __future__ import annotations

import torch

from accelpatch.core import features
from accelpatch.core.adapter import ModelAdapter
from accelpatch.models.families import families

#: one adapter per registered family (:mod:`accelpatch.models.families`), in the families' order
ADAPTERS: list[ModelAdapter] = [family.adapter_class()() for family in families()]


def find_adapter(model: torch.nn.Module) -> ModelAdapter:
    """The adapter of ``model``'s family; ValueError naming the supported classes otherwise."""
    return features.find_adapter(model, ADAPTERS)
