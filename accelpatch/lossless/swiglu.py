"""diffusers' ``SwiGLU`` activation (``FeedForward(activation_fn="swiglu")``) with its gate fused: a generic
``lossless`` fast path any model with that module reuses.

Reference: ``SwiGLU.forward``: ``proj`` → ``chunk(2, dim=-1)`` → ``x * silu(gate)``. The restatement keeps the
projection (the module's own call) and calls the verified ``glu_gate`` op (bf16: an exact table of the device's own
SiLU). Other dtypes run diffusers' forward, counted.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.ops import GLU_GATE
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.tiers import Tier
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch

FUSION = QualityGatedFusion.named("fused_swiglu", Tier.LOSSLESS)


def swiglu_class() -> type:
    from diffusers.models.activations import SwiGLU

    return SwiGLU


class FusedSwiGLU(FusedOpsPath):
    fusion = FUSION
    description = "SwiGLU projection and gate x * silu(gate) fused (bit-exact, bf16)"
    fused_ops = (GLU_GATE,)
    restates = ("diffusers.models.activations:SwiGLU.forward",)
    policy_reasons = tuple(f"activations are {dtype}: the fused SiLU tables are bfloat16"
                           for dtype in (torch.float32, torch.float16))

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        mismatch = restated_class_mismatch(site, swiglu_class())
        if mismatch is not None:
            return mismatch
        if type(module.activation) is not torch.nn.SiLU:
            return f"its activation is {type(module.activation).__name__}, not the SiLU restated"
        return None

    def run(self, module: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        hidden_states = bind_call(args, kwargs, ("hidden_states",))["hidden_states"]
        if hidden_states.dtype != torch.bfloat16:
            return NotApplicable(f"activations are {hidden_states.dtype}: the fused SiLU tables are bfloat16")
        hidden_states, gate = module.proj(hidden_states).chunk(2, dim=-1)
        return GLU_GATE(site, hidden_states, gate)


FUSED_SWIGLU = FusedSwiGLU()
