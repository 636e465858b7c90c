"""What every traced stage of a memory plan does first: pick fake or real tensors, read the dtype, and build its
component as ``from_pretrained(torch_dtype=...)`` would leave it, its weights random.

Why one place: the VAE, the audio decode and the text-side stages trace the same way (build, cast, call once under
:class:`~accelpatch.memory.live_bytes.LiveBytes`); only the call differs. Imports torch on first use.
"""
from __future__ import annotations

import contextlib
from typing import Any, Mapping


def torch_dtype(dtype: Any):
    """``torch.bfloat16`` from "bfloat16", "torch.bfloat16" or the dtype itself."""
    import torch

    return getattr(torch, str(dtype).removeprefix("torch."))


def trace_mode(fake: bool):
    """The mode a stage is traced in: ``FakeTensorMode`` (shapes, no storage: the full-size plan) or, with
    ``fake=False``, none (the real run that checks the plan at a tiny size)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode() if fake else contextlib.nullcontext()


def build_component(cls, config: Mapping[str, Any], dtype: Any):
    """``cls(**config)`` in eval mode, cast as diffusers' ``from_pretrained(torch_dtype=dtype)`` casts (the modules
    it keeps in float32 stay float32). Not ``.to()``: a fake module's parameters cannot be swapped."""
    from accelpatch.testing._common import _cast_like_from_pretrained

    module = cls(**dict(config)).eval()
    _cast_like_from_pretrained(module, torch_dtype(dtype))
    return module
