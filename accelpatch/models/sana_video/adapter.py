"""SANA-Video (diffusers ``SanaVideoTransformer3DModel``): the whole story of what accelpatch does to it.

Sites, per block ``transformer_blocks.N``:

- the block itself: AdaLN modulations and gated residual adds fused (``lossless``, :mod:`.block`);
- ``attn1`` (ReLU linear attention): two stacked fast paths (:mod:`.linear_attention`): the BF16-input first GEMM
  (``high``) over the restatement with its prologue and epilogue fused (``lossless``);
- ``ff`` (GLUMB): its SiLU and GLU gate fused (``lossless``, bf16).

The cross-attention ``attn2`` goes through diffusers' dispatcher and is left alone. Every lossless path is
bit-identical to diffusers: its fused ops are verified against the eager chain on first sight (accelpatch.lossless.verify).

Sequence parallelism through diffusers' ``enable_parallelism`` (after ``apply``): the plan (:meth:`cp_plan`) and the
split-aware layers (:meth:`prepare_parallel`) of :mod:`.sequence_parallel`, idle until the model is split.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Optional

import torch

from accelpatch.core.adapter import ModelAdapter
from accelpatch.models.sana_video.block import FUSED_BLOCK, FUSED_GLUMB
from accelpatch.models.sana_video.linear_attention import BF16_LINEAR_ATTENTION, FUSED_LINEAR_ATTENTION

_SITE = re.compile(r"transformer_blocks\.(\d+)(\.attn1|\.ff)?")


class SanaVideoAdapter(ModelAdapter):
    family = "SANA-Video"
    cache_blocks = "transformer_blocks"
    cache_methods = ("first_block", "mag")
    model_classes = (("diffusers", "SanaVideoTransformer3DModel"),)
    backends = ()

    def cp_plan(self, model: torch.nn.Module) -> dict:
        from accelpatch.models.sana_video.sequence_parallel import cp_plan

        return cp_plan(model)

    def prepare_parallel(self, model: torch.nn.Module) -> Optional[Callable[[], None]]:
        from accelpatch.models.sana_video.sequence_parallel import split_layers

        return split_layers(model)

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple]:
        for path, module in model.named_modules():
            match = _SITE.fullmatch(path)
            if match is None:
                continue
            layer, part = int(match.group(1)), match.group(2)
            if part is None:
                yield path, module, FUSED_BLOCK, layer
            elif part == ".attn1":
                yield path, module, BF16_LINEAR_ATTENTION, layer
                yield path, module, FUSED_LINEAR_ATTENTION, layer
            else:
                yield path, module, FUSED_GLUMB, layer
