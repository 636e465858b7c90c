"""Block Attention Residuals, SANA-Video 2.0's residual stream over depth: each sub-layer's input is a learned
softmax mix of the sources so far (:class:`BlockAttentionResidual`), which one forward keeps in
:class:`ResidualSources`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BlockAttentionResidual", "ResidualSources"]


def _plain_linear(layer: nn.Module) -> bool:
    """Whether calling ``layer`` is exactly ``F.linear`` over its plain tensor weight: torch's own ``nn.Linear``,
    weight and bias plain tensors (not a quantized tensor subclass), no hooks and no instance ``forward``."""
    return (type(layer) is nn.Linear and type(layer.weight) in (torch.Tensor, nn.Parameter)
            and (layer.bias is None or type(layer.bias) in (torch.Tensor, nn.Parameter))
            and not (layer._forward_pre_hooks or layer._forward_hooks or "forward" in layer.__dict__))


class BlockAttentionResidual(nn.Module):
    """Attention Residuals over depth: each sub-layer's input is a softmax mix, per token, of the sources so far
    (the embedded input, each finished group's summed deltas, the current group's partial sum), keyed by a
    parameter-free RMSNorm (eps 1e-6, activation dtype) and scored by a learned vector (``attn_proj``, ``mlp_proj``,
    ``final_proj``; zero-initialised, so an untrained mix is the plain mean). One source passes through."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.attn_proj = nn.Linear(hidden_size, 1, bias=False)
        self.mlp_proj = nn.Linear(hidden_size, 1, bias=False)
        self.final_proj = nn.Linear(hidden_size, 1, bias=False)
        for proj in (self.attn_proj, self.mlp_proj, self.final_proj):
            nn.init.zeros_(proj.weight)

    @staticmethod
    def key(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)

    @staticmethod
    def mix(projection: nn.Linear, values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Mix ``values`` [n, B, N, C] with their ``keys``; n = 1 passes the only source through."""
        if values.shape[0] == 1:
            return values[0]
        return torch.einsum("nbt,nbtd->btd", F.softmax(BlockAttentionResidual.logits(projection, keys), dim=0),
                            values)

    @staticmethod
    def logits(projection: nn.Linear, keys: torch.Tensor) -> torch.Tensor:
        """The score ``w · key`` [n, B, N] of each source and token. A plain ``nn.Linear`` (a plain tensor weight, no
        hooks) is read as one einsum over its weight row, the model's numbers since its first release; any other
        layer is called, as diffusers calls its layers: a quantized weight (torchao's tensor subclasses, GGUF) runs
        its own kernels, a layer class of its own (optimum-quanto, PEFT) its own forward, and hooks (offloading,
        layerwise casting) get to move or cast the weight first."""
        if _plain_linear(projection):
            return torch.einsum("d,nbtd->nbt", projection.weight[0], keys)
        return projection(keys).squeeze(-1)


class ResidualSources:
    """The residual sources of one forward. Without autograd they live in preallocated buffers (the release's
    inference layout); with it they are stacked per mix, since writing into a buffer would invalidate tensors
    autograd saved. Both give the same numbers."""

    def __init__(self, x: torch.Tensor, capacity: int) -> None:
        self._buffered = not torch.is_grad_enabled()
        if self._buffered:
            self.values = x.new_empty((capacity,) + x.shape)
            self.keys = torch.empty_like(self.values)
        else:
            self.values, self.keys = [], []
        self.count = 0
        self.append(x)

    def append(self, x: torch.Tensor) -> None:
        if self._buffered:
            self.values[self.count] = x
            self.keys[self.count] = BlockAttentionResidual.key(x)
        else:
            self.values.append(x)
            self.keys.append(BlockAttentionResidual.key(x))
        self.count += 1

    def mix(self, projection: nn.Linear, partial: Optional[torch.Tensor]) -> torch.Tensor:
        n = self.count + (partial is not None)
        if self._buffered:
            if partial is not None:
                self.values[self.count] = partial
                self.keys[self.count] = BlockAttentionResidual.key(partial)
            return BlockAttentionResidual.mix(projection, self.values[:n], self.keys[:n])
        values, keys = list(self.values), list(self.keys)
        if partial is not None:
            values.append(partial)
            keys.append(BlockAttentionResidual.key(partial))
        return BlockAttentionResidual.mix(projection, torch.stack(values), torch.stack(keys))

