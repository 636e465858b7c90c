"""Build the pipeline a recipe names, and the keyword arguments of its call.

``tiny:<model>`` builds an offline random pipeline from :mod:`accelpatch.testing` (release head dims where the fast
paths need them) with the recipe's call arguments over the tiny defaults. Anything else is a hub id or a local
folder loaded with diffusers (``DiffusionPipeline``, or ``ModularPipeline`` for MiniMax-H3) in the recipe's dtype,
on its device. Calls ask for tensor output so frames can be compared.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from accelpatch.core.errors import did_you_mean
from accelpatch.recipes import Recipe, RecipeError

__all__ = ["LoadedPipeline", "load_pipeline", "resolve_device", "TORCH_DTYPES"]

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LoadedPipeline:
    """A pipeline built from a recipe and the base keyword arguments of its call (no generator: runs add one)."""

    pipe: Any
    call_kwargs: dict[str, Any]
    device: torch.device
    description: str


def _runnable_device_types() -> list[str]:
    """The device types this torch can run a pipeline on here (cpu always; cuda, mps, xpu when available)."""
    types = ["cpu"]
    if torch.cuda.is_available():
        types.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        types.append("mps")
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        types.append("xpu")
    return types


def resolve_device(text: str) -> torch.device:
    """``"auto"`` → cuda when available, else cpu; anything else must be a device this torch can run on here.
    A bad one is refused in one line naming the valid choices (with a close match), not torch's list of every
    device type it knows."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    here = _runnable_device_types()
    forms = ["auto", *here] + (["cuda:N"] if "cuda" in here else [])
    valid = f"valid here: {', '.join(forms)}" + ("" if "cuda" in here else " (cuda and cuda:N need a CUDA GPU)")
    hint = did_you_mean(str(text).strip().lower(), forms)
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise RecipeError(f"device {text!r} is not a device name{hint}; {valid}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RecipeError(f"device {text!r}: CUDA is not available here; {valid}")
    if device.type not in here:
        raise RecipeError(f"device {text!r} cannot run a pipeline here{hint}; {valid}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RecipeError(f"device {text!r}: there are {torch.cuda.device_count()} CUDA device(s) here "
                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return device


def _accepted(fn: Callable, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``values`` into (arguments ``fn`` accepts, the rest)."""
    names = set(inspect.signature(fn).parameters)
    return ({k: v for k, v in values.items() if k in names}, {k: v for k, v in values.items() if k not in names})


def _tiny(recipe: Recipe, device: torch.device) -> LoadedPipeline:
    """The registered family's tiny pipeline (``accelpatch.testing``'s ``tiny_<key>_pipeline``) and its call
    arguments (``<key>_pipeline_call_kwargs`` with the recipe's call over them), as the family's recipe settings say."""
    from accelpatch import testing
    from accelpatch.models.families import by_cli

    family = by_cli(recipe.model[len("tiny:"):])
    settings, call = family.recipe, dict(recipe.call)
    build = getattr(testing, f"tiny_{family.key}_pipeline")
    call_kwargs = getattr(testing, f"{family.key}_pipeline_call_kwargs")
    if settings.fp32_cpu_only:
        if recipe.dtype != "fp32" or device.type != "cpu":
            raise RecipeError(f"{recipe.model} is built in fp32 on the CPU; set dtype: fp32 and device: cpu")
        built = {}
    else:
        built = {"dtype": TORCH_DTYPES[recipe.dtype], "device": device}
    if settings.transformer_config:
        built["transformer_config"] = getattr(testing, settings.transformer_config)
    pipe = build(**built)
    own, rest = _accepted(call_kwargs, call)
    if "pipeline" in inspect.signature(call_kwargs).parameters:  # call arguments that depend on the pipeline built
        own["pipeline"] = pipe
    kwargs = {**call_kwargs(**own), **rest, **dict(settings.output)}
    kwargs.pop("generator", None)
    return LoadedPipeline(pipe, kwargs, device, f"{recipe.model} (random weights, {recipe.dtype}, {device})")


def _pretrained(recipe: Recipe, device: torch.device) -> LoadedPipeline:
    import diffusers

    import accelpatch.models.sana_video2.modeling  # noqa: F401  (lets diffusers resolve SanaVideo2Pipeline folders)

    dtype = TORCH_DTYPES[recipe.dtype]
    modular = recipe.pipeline == "modular" or (
        recipe.pipeline == "auto" and (Path(recipe.model) / "modular_model_index.json").is_file())
    if modular:
        pipe = diffusers.ModularPipeline.from_pretrained(recipe.model)
        pipe.load_components(torch_dtype=dtype)
        pipe.to(device)
        kwargs = {**recipe.call, "output": "videos"}
    else:
        pipe = diffusers.DiffusionPipeline.from_pretrained(recipe.model, torch_dtype=dtype).to(device)
        kwargs = {**recipe.call, "output_type": "pt"}
    return LoadedPipeline(pipe, kwargs, device, f"{recipe.model} ({recipe.dtype}, {device})")


def load_pipeline(recipe: Recipe) -> LoadedPipeline:
    """The recipe's pipeline (unpatched) and its call arguments."""
    device = resolve_device(recipe.device)
    return _tiny(recipe, device) if recipe.is_tiny else _pretrained(recipe, device)
