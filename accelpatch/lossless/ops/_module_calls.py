"""When a module's call can go through a fused op that restates it: torch's own class, plain weights, no hooks
(:func:`why_module_runs`, read by :func:`~accelpatch.lossless.ops.linear` and
:func:`~accelpatch.lossless.ops.conv1x1`)."""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.outcomes import not_applicable
from accelpatch.lossless.verify import MODULE_RUNS


def _unhooked(module: torch.nn.Module) -> bool:
    """No hooks on ``module`` or on every module, and no instance forward (accelerate's offloading hooks set one):
    its call is its class's forward."""
    hooks = torch.nn.modules.module
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or "forward" in module.__dict__ or hooks._global_forward_hooks
                or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                or hooks._global_backward_pre_hooks)


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def why_module_runs(module: torch.nn.Module, base: type) -> Optional[str]:
    """Why ``module``'s call is not ``base``'s plain forward on plain weights (None when it is), naming its class:
    a subclass or wrapper (PEFT's LoRA layers, quanto's QLinear, diffusers' GGUF layers) runs a forward the op does
    not restate; a weight that is a tensor subclass (torchao) holds values only its own operations read; hooks or
    an instance forward (accelerate's offloading, a user's hook) must run."""
    if type(module) is not base:
        return not_applicable(f"{_qualified(type(module))} runs itself (not torch's {base.__name__}: a wrapper or "
                              "subclass, such as a LoRA or quantized layer, whose forward the op does not restate)")
    for name in ("weight", "bias"):
        tensor = getattr(module, name, None)
        if tensor is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return not_applicable(f"{base.__name__} with a {_qualified(type(tensor))} {name} runs itself (a tensor "
                                  "subclass: quantized or wrapped values that only its own operations read)")
    if not _unhooked(module):
        return MODULE_RUNS
    return None
