"""The ``high``-tier step cache (``apply(model, cache="first_block" | "mag")``): diffusers' FirstBlockCache and
MagCache hooks, per call and per thread, gated by tier and step: :mod:`.cache` (the cache on one model), :mod:`.config`
(what ``cache=`` resolves to), :mod:`.states` (state per calling context), :mod:`.diffusers_hooks` (what goes into
diffusers' hooks), :mod:`.conflicts` (another cache on the model), :mod:`.feature` (its registration with the core)."""
from accelpatch.step_cache.cache import StepCache
from accelpatch.step_cache.config import CACHE_METHODS, StepCacheConfig, resolve_cache
from accelpatch.step_cache.states import cache_totals

__all__ = ["CACHE_METHODS", "StepCache", "StepCacheConfig", "cache_totals", "resolve_cache"]
