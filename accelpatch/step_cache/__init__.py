"""The ``high``-tier step cache (``apply(model, cache="first_block" | "mag")``): diffusers' FirstBlockCache and
MagCache hooks, per call and per thread, gated by tier and step (:mod:`.cache`)."""
from accelpatch.step_cache.cache import CACHE_METHODS, StepCache, StepCacheConfig, cache_totals, resolve_cache

__all__ = ["CACHE_METHODS", "StepCache", "StepCacheConfig", "cache_totals", "resolve_cache"]
