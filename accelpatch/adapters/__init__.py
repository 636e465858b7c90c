"""Model adapters, one per supported model family: how accelpatch patches each (the models themselves are diffusers',
or ours under accelpatch.modeling)."""
from __future__ import annotations

import torch

from .base import ModelAdapter
from .hunyuan_video15 import HunyuanVideo15Adapter
from .ltx2 import LTX2Adapter
from .minimax_h3 import MiniMaxH3Adapter
from .sana_video import SanaVideoAdapter
from .sana_video2 import SanaVideo2Adapter
from .wan import WanAdapter

ADAPTERS: list[ModelAdapter] = [SanaVideoAdapter(), SanaVideo2Adapter(), MiniMaxH3Adapter(), WanAdapter(),
                                 HunyuanVideo15Adapter(), LTX2Adapter()]


def find_adapter(model: torch.nn.Module) -> ModelAdapter:
    for adapter in ADAPTERS:
        if adapter.matches(model):
            return adapter
    supported = ", ".join(name for adapter in ADAPTERS for name in adapter.class_names)
    raise ValueError(f"accelpatch does not support {type(model).__name__}; supported model classes: {supported}")
