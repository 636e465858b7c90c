"""The step cache as a feature of the core (:mod:`accelpatch.core.features`): ``apply(..., cache=...)`` and its
``cache_*`` options, the checks before any model is touched, the cache attached to each patched model, and its line
of the report."""
from __future__ import annotations

from typing import Any, Optional

from accelpatch.core.features import Feature, register
from accelpatch.step_cache.cache import StepCache
from accelpatch.step_cache.config import CACHE_OPTIONS, resolve_cache
from accelpatch.step_cache.conflicts import refuse_foreign_cache
from accelpatch.step_cache.states import cache_totals


class StepCacheFeature(Feature):
    name = "step_cache"
    order = 10  # before parallelism: diffusers' split hooks go on after the cache's block hooks
    argument = "cache"
    owner = "step cache"
    use = "with cache='first_block' or a diffusers config"
    report_field = "cache"

    def option_names(self) -> tuple[str, ...]:
        return CACHE_OPTIONS

    def resolve(self, value: Any, options: dict) -> Any:
        return resolve_cache(value, options)[0]

    def validate(self, model, adapter, config, existing, requested) -> None:
        if config is None:
            return
        adapter.validate_cache(config)
        blocks = getattr(model, adapter.cache.blocks, ()) if adapter.cache.blocks else ()
        refuse_foreign_cache(model, blocks, ours=step_cache_of(existing))

    def attach(self, model, patch, config, pipeline) -> Optional[StepCache]:
        if config is None:
            return None
        cache = patch.adapter.cache  # the model's hooks are on by now: the cache's pre-hook reads the step they set
        return StepCache(model, config, patch.default_tier, pipeline, cache.blocks,
                         block_streams=(*cache.block_outputs, cache.second_stream))

    def offers_high(self, config) -> bool:
        return config is not None

    def uses_steps(self, config) -> bool:
        return config is not None

    def report(self, model, patch, reset: bool) -> Optional[dict]:
        cache = step_cache_of(patch)
        if cache is None:
            return None
        return {"method": patch.configs[self.name].describe(), **cache_totals(cache.counters, reset=reset)}

    def report_line(self, section: dict) -> Optional[str]:
        computed, reused = section["computed"], section["reused"]
        line = f"step cache {section['method']}: {computed} calls computed every block, {reused} reused the cache"
        if computed and not reused:
            reasons = ", ".join(f"{r} ×{n}" for r, n in sorted(section["reasons"].items(), key=lambda x: -x[1]))
            line += f" — it never reused anything ({reasons})"
        for note, count in section.get("notes", {}).items():
            line += f"; {note} ×{count}"
        return line


def step_cache_of(patch: Any) -> Optional[StepCache]:
    """The step cache attached to a model's patch (None: no patch, or no cache)."""
    return None if patch is None else patch.attached.get(StepCacheFeature.name)


FEATURE = register(StepCacheFeature())
