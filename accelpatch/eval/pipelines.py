"""Build the pipeline a recipe names, and the keyword arguments of its call.

``tiny:<model>`` builds an offline random pipeline from :mod:`accelpatch.testing` (release head dims where the fast
paths need them) with the recipe's call arguments over the tiny defaults; ``trained:<model>`` loads the shipped
trained tiny pipeline (:mod:`accelpatch.tiny_models.shipped`) with its training-size call settings under the
recipe's call arguments (``prompt``, ``num_inference_steps``, ``guidance_scale``, ...). Anything else is a hub id
or a local folder loaded with diffusers (``DiffusionPipeline``, or ``ModularPipeline`` for MiniMax-H3) in the
recipe's dtype, on its device. Calls ask for tensor output so frames can be compared.

For both kinds, the recipe's ``lora`` list is loaded (``load_lora_weights`` per entry, one ``set_adapters`` with
their scales) and its ``scheduler`` replaces the pipeline's (``Cls.from_config(pipe.scheduler.config,
**overrides)``, each override checked to be a key of the class's config). Call arguments the pipeline takes
(``sigmas``, ``timesteps``) pass through; ``guidance_scale`` for a pipeline that takes none but has a ``guider``
(HunyuanVideo 1.5) sets the guider's; a string ``image`` for a pretrained pipeline that takes an image is loaded
with ``diffusers.utils.load_image`` (a path or URL).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from accelpatch.core.errors import did_you_mean
from accelpatch.recipes import Recipe, RecipeError, scheduler_class, scheduler_overrides

__all__ = ["LoadedPipeline", "load_pipeline", "resolve_device", "TORCH_DTYPES", "apply_scheduler", "load_loras"]

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


def apply_scheduler(pipe: Any, spec: Optional[dict]) -> None:
    """Replace ``pipe``'s scheduler as a recipe's ``scheduler`` mapping says: ``class`` (default: the pipeline's own
    scheduler class) built ``from_config`` of the current scheduler's config with the other keys as overrides.
    A key the class's config does not have is refused (:func:`accelpatch.recipes.scheduler_overrides`)."""
    if not spec:
        return
    current = getattr(pipe, "scheduler", None)
    if current is None or not hasattr(current, "config"):
        raise RecipeError(f"scheduler: {type(pipe).__name__} has no scheduler to replace")
    cls = scheduler_class(spec["class"]) if spec.get("class") else type(current)
    scheduler = cls.from_config(current.config, **scheduler_overrides(spec, cls))
    if hasattr(pipe, "update_components") and not hasattr(pipe, "register_modules"):  # a modular pipeline
        pipe.update_components(scheduler=scheduler)
    else:
        pipe.scheduler = scheduler


def load_loras(pipe: Any, loras) -> None:
    """Load a recipe's ``lora`` entries into ``pipe`` as diffusers documents it: ``load_lora_weights`` per entry
    (``load_into_transformer_2=True`` for ``component: transformer_2``), then ``set_adapters`` over all of them
    with their scales."""
    if not loras:
        return
    if not hasattr(pipe, "load_lora_weights"):
        raise RecipeError(f"lora: {type(pipe).__name__} cannot load LoRAs (no load_lora_weights)")
    names, scales = [], []
    for index, spec in enumerate(loras):
        name = spec.adapter_name or f"lora_{index}"
        kwargs: dict[str, Any] = {"adapter_name": name}
        if spec.weight_name:
            kwargs["weight_name"] = spec.weight_name
        if spec.component == "transformer_2":
            if getattr(pipe, "transformer_2", None) is None:
                raise RecipeError(f"lora[{index}].component: transformer_2, but {type(pipe).__name__} has no "
                                  "transformer_2 (Wan 2.2's two experts have one; Wan 2.1 does not)")
            kwargs["load_into_transformer_2"] = True
        pipe.load_lora_weights(spec.weights, **kwargs)
        names.append(name)
        scales.append(float(spec.scale))
    pipe.set_adapters(names, adapter_weights=scales)


def _call_signature(pipe: Any) -> set[str]:
    try:
        return set(inspect.signature(pipe.__call__).parameters)
    except (TypeError, ValueError):
        return set()


def _guidance_to_guider(pipe: Any, kwargs: dict[str, Any]) -> None:
    """A ``guidance_scale`` the pipeline's call does not take, on a pipeline with a ``guider`` component (diffusers'
    guiders: HunyuanVideo 1.5), sets the guider's guidance scale instead (1.0 disables classifier-free guidance)."""
    guider = getattr(pipe, "guider", None)
    if "guidance_scale" not in kwargs or "guidance_scale" in _call_signature(pipe) or guider is None \
            or not hasattr(guider, "new") or "guidance_scale" not in getattr(guider, "config", {}):
        return
    pipe.guider = guider.new(guidance_scale=float(kwargs.pop("guidance_scale")))


def _load_image_arguments(pipe: Any, kwargs: dict[str, Any]) -> None:
    """A string ``image`` (a path or URL) for a pipeline whose call takes an image: loaded with diffusers."""
    if isinstance(kwargs.get("image"), str) and "image" in _call_signature(pipe):
        from diffusers.utils import load_image

        kwargs["image"] = load_image(kwargs["image"])


def _prepare(pipe: Any, recipe: Recipe, kwargs: dict[str, Any]) -> None:
    """The recipe's LoRAs, scheduler and guider routing, applied to a built pipeline (before any patching)."""
    load_loras(pipe, recipe.lora)
    apply_scheduler(pipe, recipe.scheduler)
    _guidance_to_guider(pipe, kwargs)


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
    _prepare(pipe, recipe, kwargs)
    return LoadedPipeline(pipe, kwargs, device, f"{recipe.model} (random weights, {recipe.dtype}, {device})")


def _trained(recipe: Recipe, device: torch.device) -> LoadedPipeline:
    """The shipped trained tiny pipeline the recipe names and its call arguments: the family's training-size
    settings (:func:`accelpatch.tiny_models.shipped.trained_call_kwargs`) with the recipe's call over them."""
    from accelpatch.tiny_models.shipped import trained_call_kwargs, trained_pipeline

    family = recipe.model[len("trained:"):]
    try:
        pipe = trained_pipeline(family, dtype=TORCH_DTYPES[recipe.dtype], device=device)
    except ValueError as exc:  # not shipped in this installation
        raise RecipeError(str(exc)) from None
    kwargs = {**trained_call_kwargs(family, recipe.call.get("prompt", "a red square moves right")), **recipe.call}
    kwargs.pop("generator", None)
    _prepare(pipe, recipe, kwargs)
    return LoadedPipeline(pipe, kwargs, device, f"{recipe.model} (trained tiny weights, {recipe.dtype}, {device})")


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
    _prepare(pipe, recipe, kwargs)
    _load_image_arguments(pipe, kwargs)
    return LoadedPipeline(pipe, kwargs, device, f"{recipe.model} ({recipe.dtype}, {device})")


def load_pipeline(recipe: Recipe) -> LoadedPipeline:
    """The recipe's pipeline (unpatched) and its call arguments."""
    device = resolve_device(recipe.device)
    if recipe.model.startswith("trained:"):
        return _trained(recipe, device)
    return _tiny(recipe, device) if recipe.is_random else _pretrained(recipe, device)
