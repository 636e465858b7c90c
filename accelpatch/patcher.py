"""``apply`` and ``remove``: find the model adapter, swap site classes, attach hooks, and undo all of it."""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .backends import resolve_backend
from .gate import logger
from .models import ADAPTERS, find_adapter
from .models.base import ModelAdapter
from .sites.base import SITE_ATTR, Site, gated_class, is_gated
from .tiers import Tier

STATE_ATTR = "_accelpatch_state"


@dataclass(eq=False)
class ModelPatch:
    """Everything ``apply`` did to one transformer, kept on it as ``_accelpatch_state`` until ``remove``."""

    model_class: str
    adapter: ModelAdapter
    backend: Any
    strict: bool
    default_tier: Tier
    sites: list[Site] = field(default_factory=list, repr=False)
    detach: list[Callable[[], None]] = field(default_factory=list)
    _warned: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def warn_once(self, kind: str, reason: str) -> None:
        """One warning per model, fast-path kind and reason; the counters keep the full tally."""
        key = (kind, reason)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        message = (f"accelpatch: {kind} fast path did not run on {self.model_class}: {reason}. "
                   "The reference path runs instead (see accelpatch.report(model); strict=True raises).")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.debug(message)

    def key(self) -> tuple:
        return (self.backend, self.strict)


def transformers_of(target: Any) -> list[torch.nn.Module]:
    """The transformer modules behind ``target``: a transformer itself, or a pipeline's ``transformer`` and
    ``transformer_2``."""
    if isinstance(target, torch.nn.Module):
        return [target]
    found = []
    for name in ("transformer", "transformer_2"):
        module = getattr(target, name, None)
        if isinstance(module, torch.nn.Module):
            found.append(module)
    if not found:
        raise TypeError(
            f"apply() expects a diffusers pipeline with a `transformer` (and optionally `transformer_2`) or a "
            f"transformer module; got {type(target).__name__}")
    return found


def apply(target: Any, *, backend: Any = None, strict: bool = False, **options: Any) -> Any:
    """Patch ``target`` in place (see :func:`accelpatch.apply`). Returns ``target``."""
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")
    backend_config = resolve_backend(backend, options)
    models = transformers_of(target)
    adapters = [find_adapter(model) for model in models]  # raises before anything is touched
    for adapter in adapters:
        adapter.validate_backend(backend_config)
    pipeline = None if isinstance(target, torch.nn.Module) else target
    strict = strict or bool(getattr(backend_config, "strict", False))
    for model, adapter in zip(models, adapters):
        existing = model.__dict__.get(STATE_ATTR)
        if existing is not None:
            if existing.key() == (backend_config, strict):
                continue  # applying twice is the same as applying once
            _remove_one(model)
        _apply_one(model, adapter, backend_config, strict, pipeline)
    return target


def _apply_one(model, adapter: ModelAdapter, backend_config, strict: bool, pipeline) -> None:
    patch = ModelPatch(model_class=type(model).__name__, adapter=adapter, backend=backend_config, strict=strict,
                       default_tier=adapter.default_tier(backend_config))
    model.__dict__[STATE_ATTR] = patch
    try:
        by_fusion: dict[str, list[Site]] = {}
        for path, module, fast_path, layer_index in adapter.iter_sites(model, backend_config):
            if is_gated(module):
                raise RuntimeError(f"{path} is already patched by accelpatch; call accelpatch.remove() first")
            site = Site(path=path, fast_path=fast_path, model=patch, original_class=type(module),
                        layer_index=layer_index)
            module.__class__ = gated_class(site.original_class, fast_path.fusion)
            module.__dict__[SITE_ATTR] = site
            fast_path.fusion.mark(module, site)
            _follow_instance_forward(module, site)
            patch.sites.append(site)
            by_fusion.setdefault(fast_path.fusion.name, []).append(site)
        if not patch.sites:
            warnings.warn(f"accelpatch: {adapter.family} has no fast path without a backend "
                          f"(available: {', '.join(adapter.backends)}); {patch.model_class} runs unchanged",
                          RuntimeWarning, stacklevel=3)
        _mount(model, by_fusion)
        patch.detach.extend(adapter.attach_hooks(model, patch, pipeline))
    except BaseException:
        _remove_one(model)
        raise


def _follow_instance_forward(module: torch.nn.Module, site: Site) -> None:
    """A hook installed before ``apply`` stores a bound forward on the instance and would bypass the gated class.
    accelerate's hook is re-pointed at the gated forward; any other instance forward rejects the site."""
    if "forward" not in module.__dict__:
        return
    if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__:
        site.saved_old_forward = module.__dict__["_old_forward"]
        module._old_forward = type(module).forward.__get__(module)
        return
    site.reject_reason = ("a hook replaced this module's forward before accelpatch.apply(); apply accelpatch "
                          "before enabling offloading or other hooks")


def _mount(model: torch.nn.Module, by_fusion: dict[str, list[Site]]) -> None:
    for sites in by_fusion.values():
        fusion = sites[0].fast_path.fusion
        for site in sites:
            if site.reject_reason is None:
                site.reject_reason = site.fast_path.mount_reject_reason(model.get_submodule(site.path), site)
        rejected = next((s for s in sites if s.reject_reason is not None), None)
        if rejected is not None:
            for site in sites:
                if site.reject_reason is None:
                    site.reject_reason = f"model rejected at {rejected.path}: {rejected.reject_reason}"
        by_module = {id(model.get_submodule(s.path)): s for s in sites}
        fusion.mount(model, reject_reason=lambda m: by_module[id(m)].reject_reason)


def remove(target: Any) -> Any:
    """Undo :func:`apply` on ``target`` (a no-op on a model that was never patched). Returns ``target``."""
    for model in transformers_of(target):
        _remove_one(model)
    return target


def _remove_one(model: torch.nn.Module) -> None:
    patch = model.__dict__.pop(STATE_ATTR, None)
    if patch is None:
        return
    while patch.detach:
        patch.detach.pop()()
    for site in reversed(patch.sites):
        module = model.get_submodule(site.path)
        site.fast_path.fusion.unmark(module)
        module.__dict__.pop(SITE_ATTR, None)
        module.__class__ = site.original_class
        saved = getattr(site, "saved_old_forward", None)
        if saved is not None:
            module._old_forward = saved


def patch_of(model: torch.nn.Module) -> Optional[ModelPatch]:
    return model.__dict__.get(STATE_ATTR)


def supported_model_classes() -> list[str]:
    return [name for adapter in ADAPTERS for name in adapter.class_names]
