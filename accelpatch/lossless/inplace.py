"""When a fused op may write its result over its input (``FusedOp(..., inplace=True)``, issue #44): the input is a
module's output that the restated forward alone holds, unless a forward hook saw it. A hook on the module, or a global
one, may have kept that output (an activation capture, a cache): then the out-of-place op runs."""
from __future__ import annotations

import torch


def output_may_be_kept(module: torch.nn.Module) -> bool:
    """Whether a forward hook sees ``module``'s output: its own, or a global one (torch's module tracker, which reads
    module names only, aside)."""
    return bool(module._forward_hooks) or global_hooks()


def global_hooks(*, pre: bool = False) -> bool:
    """Whether a global forward hook (or, with ``pre``, a global forward pre-hook too) is registered, torch's module
    tracker aside (it reads module names only)."""
    from torch.nn.modules import module as torch_module
    from torch.utils.module_tracker import ModuleTracker

    registries = (torch_module._global_forward_hooks,) + ((torch_module._global_forward_pre_hooks,) if pre else ())
    return any(not isinstance(getattr(hook, "__self__", None), ModuleTracker)
               for hooks in registries for hook in hooks.values())


def kept_reason(name: str, op: str) -> str:
    """The counted reason when ``op`` stays out of place because ``name``'s output may be kept."""
    return (f"a forward hook (on its {name}, or a global one) could keep that module's output, which the in-place "
            f"{op} would overwrite")
