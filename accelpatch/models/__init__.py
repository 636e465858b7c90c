"""Model adapters, one per supported model family."""
from __future__ import annotations

import torch

from .base import ModelAdapter
from .sana_video import SanaVideoAdapter

ADAPTERS: list[ModelAdapter] = [SanaVideoAdapter()]


def find_adapter(model: torch.nn.Module) -> ModelAdapter:
    for adapter in ADAPTERS:
        if adapter.matches(model):
            return adapter
    supported = ", ".join(name for adapter in ADAPTERS for name in adapter.class_names)
    raise ValueError(f"accelpatch does not support {type(model).__name__}; supported model classes: {supported}")
