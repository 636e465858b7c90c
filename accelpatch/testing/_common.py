"""Helpers shared by the per-model factories in :mod:`accelpatch.testing`.

Reading a config from a model or a dict, building a model under a fixed seed, casting it the
way ``from_pretrained(torch_dtype=...)`` would, and picking default dtype/device for input
builders. Imports only torch; diffusers stays lazy in the model files.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch


def _config_of(transformer_or_config: Any) -> Mapping[str, Any]:
    """The config mapping of a diffusers model, or the mapping itself."""
    if transformer_or_config is None:
        raise TypeError("expected a diffusers model or a config dict, got None")
    config = getattr(transformer_or_config, "config", transformer_or_config)
    if not isinstance(config, Mapping):
        raise TypeError(f"expected a diffusers model or a config dict, got {type(transformer_or_config).__name__}")
    return config


def _cast_like_from_pretrained(model, dtype: torch.dtype, keep=None) -> None:
    """Cast floating parameters and buffers to ``dtype``, except those that diffusers'
    ``_keep_in_fp32_modules`` keeps in float32 on a ``from_pretrained(torch_dtype=...)`` load
    (matched as substrings of the tensor name, as diffusers does; ``keep``: these names instead). Avoids
    ``ModelMixin.to``'s dtype warning."""
    keep = tuple((getattr(model, "_keep_in_fp32_modules", None) or ()) if keep is None else keep)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not tensor.is_floating_point():
            continue
        target = torch.float32 if any(k in name for k in keep) else dtype
        if tensor.dtype != target:
            tensor.data = tensor.data.to(target)


def _finish_tiny_pipeline(pipe, text_encoder, vae, *, dtype: torch.dtype, device):
    """A tiny pipeline as ``from_pretrained(torch_dtype=dtype).to(device)`` would leave it: the text encoder and the
    VAE in ``dtype`` (the VAE's float32 modules kept), moved to ``device``, the progress bar off."""
    if dtype != torch.float32:
        text_encoder.to(dtype)
        _cast_like_from_pretrained(vae, dtype)
    if torch.device(device) != torch.device("cpu"):
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _build_seeded(cls, config: Mapping[str, Any], *, seed: int, dtype: torch.dtype, device) -> Any:
    torch.manual_seed(seed)
    model = cls(**dict(config))
    if dtype != torch.float32:
        _cast_like_from_pretrained(model, dtype)
    return model.to(device).eval()


def _param_dtype(module) -> torch.dtype:
    """The dtype most parameters have (mixed-precision models keep a few modules in float32)."""
    counts: dict[torch.dtype, int] = {}
    for p in module.parameters():
        counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.get)



def _input_dtype_and_device(transformer_or_config: Any, dtype, device):
    """Defaults for input builders: the model's majority dtype and its device (float32/CPU for a config)."""
    is_model = hasattr(transformer_or_config, "parameters")
    if dtype is None:
        dtype = _param_dtype(transformer_or_config) if is_model else torch.float32
    if device is None:
        device = next(transformer_or_config.parameters()).device if is_model else "cpu"
    return dtype, device


def _trained(family: str, builder: str, *, dtype: torch.dtype, device, **random_options):
    """The shipped trained tiny pipeline of ``family`` (``builder(trained=True)``), refusing the ``builder``'s
    options that build random components (those given a value other than None/False), by name."""
    chosen = [name for name, value in random_options.items() if value not in (None, False)]
    if chosen:
        raise ValueError(f"{builder}(trained=True) loads the shipped weights; {', '.join(chosen)} "
                         f"build random components: pass them with trained=False")
    from accelpatch.tiny_models.shipped import trained_pipeline

    return trained_pipeline(family, dtype=dtype, device=device)
