"""diffusers' ``GELU`` activation module (``FeedForward(activation_fn="gelu"/"gelu-approximate")``: Wan's,
HunyuanVideo 1.5's and LTX-2's feed-forwards) with its GELU written over the projection's output: a generic
``lossless`` fast path any model with that module reuses (issue #44: the feed-forward's hidden state is where
Wan 2.1's and LTX-2's steps peak, held twice by the out-of-place GELU).

Reference: ``GELU.forward``: ``proj`` → ``gelu`` (``F.gelu(x, approximate=...)``; its branch for MPS before torch 2.0
is not taken here). The restatement keeps the projection (the module's own call) and calls the verified
``gelu_inplace`` op on its output, which nothing else holds: unless a forward hook could have kept it (one on
``proj``, or a global one), in which case the module's own forward runs, counted.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier
from accelpatch.lossless.inplace import kept_reason, output_may_be_kept
from accelpatch.lossless.ops import GELU_INPLACE

FUSION = QualityGatedFusion.named("fused_gelu", Tier.LOSSLESS)
HOOKED = kept_reason("proj", "GELU")
MPS = "an MPS tensor (diffusers' GELU takes another branch there)"


def gelu_class() -> type:
    from diffusers.models.activations import GELU

    return GELU


class InPlaceGELU(FusedOpsPath):
    fusion = FUSION
    description = "feed-forward GELU written over its projection's output (bit-exact; one hidden-sized tensor less)"
    fused_ops = (GELU_INPLACE,)
    restates = ("diffusers.models.activations:GELU.forward", "diffusers.models.activations:GELU.gelu")
    policy_reasons = (HOOKED, MPS)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, gelu_class())

    def run(self, module: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        hidden_states = bind_call(args, kwargs, ("hidden_states",))["hidden_states"]
        if hidden_states.device.type == "mps":
            return NotApplicable(MPS)
        if output_may_be_kept(module.proj):
            return NotApplicable(HOOKED)
        return GELU_INPLACE(site, module.proj(hidden_states), module.approximate)


IN_PLACE_GELU = InPlaceGELU()

