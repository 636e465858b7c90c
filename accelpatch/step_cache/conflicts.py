"""Another step cache on the same model (cache-dit's, diffusers' own ``enable_cache`` or block hooks): found and
refused with what it is and how to take it off, at ``apply(cache=...)`` and at calls after it."""
from __future__ import annotations

from typing import Any, Optional

import torch

from accelpatch.core.errors import CacheConflictError
from accelpatch.step_cache.config import StepCacheConfig

#: diffusers' block-cache hooks (FirstBlockCache, MagCache) by registry name, and the config class each belongs to
_DIFFUSERS_BLOCK_CACHE_HOOKS = {"fbc_leader_block_hook": "FirstBlockCacheConfig", "fbc_block_hook":
                                "FirstBlockCacheConfig", "mag_cache_leader_block_hook": "MagCacheConfig",
                                "mag_cache_block_hook": "MagCacheConfig"}


def foreign_cache(model: torch.nn.Module, blocks=(), ours: Optional[Any] = None) -> Optional[str]:
    """What step cache other than accelpatch's own (``ours``) ``model`` carries, and how to take it off; None when
    it carries none. Seen: cache-dit's (``cache_dit.enable_cache`` marks the transformer), diffusers' own through
    ``enable_cache`` (any of its caches: the model's ``_cache_config``) or put on ``blocks`` directly
    (``apply_first_block_cache``, ``apply_mag_cache``)."""
    if model.__dict__.get("_is_cached") is True and "_context_manager" in model.__dict__:
        return "cache-dit's cache (cache_dit.enable_cache): drop it with cache_dit.disable_cache(pipe)"
    config = model.__dict__.get("_cache_config")
    if config is not None and not isinstance(config, StepCacheConfig):
        name = type(config).__name__
        instead = (f"; to have accelpatch run it, tier-gated and per call, pass that {name} as apply(..., cache=...) "
                   "instead" if name in ("FirstBlockCacheConfig", "MagCacheConfig") else "")
        return f"diffusers' {name} (enable_cache): drop it with transformer.disable_cache(){instead}"
    if ours is not None:
        return None  # its blocks carry our own hooks, checked by StepCache.check_alone
    for index, block in enumerate(blocks):
        registry = block.__dict__.get("_diffusers_hook")
        for name in getattr(registry, "hooks", {}):
            if name in _DIFFUSERS_BLOCK_CACHE_HOOKS:
                config = _DIFFUSERS_BLOCK_CACHE_HOOKS[name]
                return (f"diffusers' {config.removesuffix('Config')} hooks on block {index} ({name}): take them off "
                        f"(HookRegistry.remove_hook), or pass its {config} as apply(..., cache=...) to have "
                        "accelpatch run it, tier-gated and per call")
    return None


def refuse_foreign_cache(model: torch.nn.Module, blocks=(), ours: Optional[Any] = None) -> None:
    """Raise :class:`CacheConflictError` when ``model`` carries another step cache than accelpatch's (``ours``)."""
    found = foreign_cache(model, blocks, ours)
    if found is not None:
        refuse_cache_stack(model, found, after_apply=ours is not None)


def refuse_cache_stack(model: torch.nn.Module, found: str, *, after_apply: bool) -> None:
    """Raise :class:`CacheConflictError` for another step cache ``found`` (what it is, how to drop it) on ``model``,
    met at ``apply(cache=...)`` or, ``after_apply``, at a call of a model that got it afterwards."""
    what = (f"this {type(model).__name__} got another step cache after accelpatch.apply(cache=...)" if after_apply
            else f"accelpatch.apply(cache=...): this {type(model).__name__} already carries another step cache")
    raise CacheConflictError(
        f"{what}, {found}. Two step caches on one model skip the same blocks by their own decisions and break each "
        "other's state: keep one. To keep the other cache, apply accelpatch without cache= (its lossless paths run "
        "under any cache); to keep accelpatch's, drop the other as said.")
