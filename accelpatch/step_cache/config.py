"""What ``apply(..., cache=...)`` and the ``cache_*`` options resolve to (:class:`StepCacheConfig`), checked before any
model is touched."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from accelpatch.core.errors import did_you_mean
from accelpatch.core.steps import normalize_step_count

#: short names accepted by ``apply(..., cache=...)``
CACHE_METHODS = ("first_block", "mag")
#: MagCache decides inside diffusers' hook, from this rank's tensors alone: it computes every step on a split model
MAG_SPLIT = "model split over ranks: MagCache's decision is local to each rank"


@dataclass(frozen=True)
class StepCacheConfig:
    """What ``apply(..., cache=...)`` resolved to: the method and its threshold, and the guards. ``mag`` keeps
    diffusers' ``MagCacheConfig`` (its calibrated ratios, retention and skip limits apply too)."""

    method: str = "first_block"
    threshold: float = 0.05
    #: counts, or fractions of the call's steps (accelpatch.core.steps.StepCount)
    warmup_steps: Union[int, float] = 2
    max_reuse: int = 2
    final_steps: Union[int, float] = 1
    #: MagCache only: diffusers' config (compared through ``ratios``, as tensors do not compare to a bool)
    diffusers_config: Any = field(default=None, compare=False, repr=False)
    ratios: tuple = ()

    def describe(self) -> str:
        return (f"{self.method}(threshold={self.threshold}, warmup_steps={self.warmup_steps}, "
                f"max_reuse={self.max_reuse}, final_steps={self.final_steps})")


#: cache options of apply() → StepCacheConfig field (the threshold, and the guards)
GUARD_OPTIONS = {"cache_threshold": "threshold", "cache_warmup_steps": "warmup_steps",
                 "cache_max_reuse": "max_reuse", "cache_final_steps": "final_steps"}
#: the cache options' names, as accelpatch.core.apply_options lists them
CACHE_OPTIONS = tuple(GUARD_OPTIONS)


def resolve_cache(cache: Any, options: dict) -> tuple[Optional[StepCacheConfig], dict]:
    """``cache`` (None, a short name, a diffusers ``FirstBlockCacheConfig`` or ``MagCacheConfig``) and the ``cache_*``
    options of ``options`` → (config or None, the options left). Raises ValueError naming the bad value and the
    choices."""
    guards = {GUARD_OPTIONS[k]: options[k] for k in GUARD_OPTIONS if k in options}
    rest = {k: v for k, v in options.items() if k not in GUARD_OPTIONS}
    if cache is None:
        if guards:
            raise ValueError(f"{sorted(k for k in options if k in GUARD_OPTIONS)} need a cache: "
                             f"apply(..., cache={CACHE_METHODS[0]!r}, ...)")
        return None, rest
    from diffusers import FirstBlockCacheConfig, MagCacheConfig

    name = cache.strip().lower().replace("-", "_") if isinstance(cache, str) else None
    if isinstance(cache, StepCacheConfig):
        config = cache
    elif isinstance(cache, FirstBlockCacheConfig):
        config = StepCacheConfig(method="first_block", threshold=float(cache.threshold))
    elif isinstance(cache, MagCacheConfig):
        ratios = () if cache.mag_ratios is None else tuple(float(r) for r in torch.as_tensor(cache.mag_ratios))
        config = StepCacheConfig(method="mag", threshold=float(cache.threshold), max_reuse=int(cache.max_skip_steps),
                                 diffusers_config=cache, ratios=ratios + (cache.calibrate,))
    elif name == "first_block":
        config = StepCacheConfig(method=name)
    elif name == "mag":
        raise ValueError("cache='mag' needs magnitude ratios calibrated for your checkpoint and scheduler: run once "
                         "with cache=diffusers.MagCacheConfig(calibrate=True, num_inference_steps=N) (diffusers prints "
                         "the ratios), then pass MagCacheConfig(mag_ratios=[...], num_inference_steps=N)")
    else:
        hint = did_you_mean(name, CACHE_METHODS) if name is not None else ""
        raise ValueError(f"unknown cache {cache!r}{hint}; give one of {', '.join(map(repr, CACHE_METHODS))}, a "
                         "diffusers FirstBlockCacheConfig(threshold=...) or MagCacheConfig(mag_ratios=..., ...)")
    for name, value in guards.items():
        if name == "threshold":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"cache_threshold must be a number >= 0, got {value!r}")
            guards[name] = float(value)
        elif name in ("warmup_steps", "final_steps"):  # a count, or a fraction of the call's steps
            guards[name] = normalize_step_count(value, f"cache_{name}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"cache_{name} must be an integer >= 0, got {value!r}")
    if guards:
        if config.diffusers_config is not None and "threshold" in guards:
            mag = dataclasses.replace(config.diffusers_config, threshold=guards["threshold"])
            guards["diffusers_config"] = mag
        config = StepCacheConfig(**{**config.__dict__, **guards})
    if not config.threshold >= 0:
        raise ValueError(f"the cache threshold must be >= 0, got {config.threshold!r}")
    return config, rest
