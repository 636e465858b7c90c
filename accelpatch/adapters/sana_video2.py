"""SANA-Video 2.0 (accelpatch's ``SanaVideo2Transformer3DModel``): its sites are the self-attention modules
``blocks.N.attn`` — the softmax "anchor" layers (``SanaVideo2SoftmaxAttention``) and the gated linear-attention
layers (``SanaVideo2LinearAttention``), each kind with its own marker pair.

No fast path ships for them yet (planned: anchor attention on BF16 operands instead of the FP32 upcast, and the
linear attention's first GEMM on BF16 operands with FP32 accumulation). Until then every site is rejected at
``apply()`` with "no fast path yet" — said once there, and counted as a fallback when a call asks for ``high`` —
and every call runs the original processor: ``exact``/``lossless``/default are the unpatched model bit for bit.
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import torch

from ..gate import QualityGatedFusion
from ..sites.base import FastPath, Site
from ..tiers import Tier
from .base import ModelAdapter

SOFTMAX_FUSION = QualityGatedFusion(
    name="sana_video2_softmax_attention",
    marker_attr="_sgl_sana_video2_softmax_attention_site",
    enabled_attr="_sgl_sana_video2_softmax_attention_enabled",
    tier=Tier.HIGH,
)
LINEAR_FUSION = QualityGatedFusion(
    name="sana_video2_linear_attention",
    marker_attr="_sgl_sana_video2_linear_attention_site",
    enabled_attr="_sgl_sana_video2_linear_attention_enabled",
    tier=Tier.HIGH,
)

_SELF_ATTENTION = re.compile(r"blocks\.(\d+)\.attn")


class _NoFastPathYet(FastPath):
    """A site whose fast path is not implemented yet: rejected at mount with that reason."""

    planned: str = ""

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return f"no fast path yet ({self.planned} is planned)"

    def run(self, module, site, args, kwargs):  # never reached: the site is never mounted
        raise RuntimeError("no fast path yet")


class AnchorAttentionSite(_NoFastPathYet):
    fusion = SOFTMAX_FUSION
    description = "softmax anchor attention (head dim 256, FP32 upcast in the release)"
    planned = "anchor attention on BF16 operands"


class LinearAttentionSite(_NoFastPathYet):
    fusion = LINEAR_FUSION
    description = "gated linear attention (head dim 128)"
    planned = "the first linear-attention GEMM on BF16 operands with FP32 accumulation"


ANCHOR_SITE = AnchorAttentionSite()
LINEAR_SITE = LinearAttentionSite()


class SanaVideo2Adapter(ModelAdapter):
    family = "SANA-Video 2.0"
    model_classes = (("accelpatch.modeling.sana_video2", "SanaVideo2Transformer3DModel"),)
    backends = ()

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple]:
        from ..modeling.sana_video2 import SanaVideo2LinearAttention, SanaVideo2SoftmaxAttention

        for path, module in model.named_modules():
            match = _SELF_ATTENTION.fullmatch(path)
            if match is None:
                continue
            if isinstance(module, SanaVideo2SoftmaxAttention):
                yield path, module, ANCHOR_SITE, int(match.group(1))
            elif isinstance(module, SanaVideo2LinearAttention):
                yield path, module, LINEAR_SITE, int(match.group(1))
