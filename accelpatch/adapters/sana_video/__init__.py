"""SANA-Video (diffusers ``SanaVideoTransformer3DModel``): its sites are the self-attention modules
``transformer_blocks.N.attn1`` (ReLU linear attention), each carrying the BF16-input GEMM fast path (``high``).
The cross-attention ``attn2`` goes through diffusers' dispatcher and is left alone."""
from __future__ import annotations

import re
from typing import Any, Iterator

import torch

from ..sites.sana_linear_attention import BF16_LINEAR_ATTENTION
from .base import ModelAdapter

_SELF_ATTENTION = re.compile(r"transformer_blocks\.(\d+)\.attn1")


class SanaVideoAdapter(ModelAdapter):
    family = "SANA-Video"
    cache_blocks = "transformer_blocks"
    cache_methods = ("first_block", "mag")
    model_classes = (("diffusers", "SanaVideoTransformer3DModel"),)
    backends = ()

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple]:
        for path, module in model.named_modules():
            match = _SELF_ATTENTION.fullmatch(path)
            if match is not None:
                yield path, module, BF16_LINEAR_ATTENTION, int(match.group(1))
