"""accelpatch: quality-gated fast paths for diffusers video pipelines, applied in place and removable.

    import accelpatch
    accelpatch.apply(pipe)                      # swap attention modules for quality-gated subclasses
    with accelpatch.quality("high"):            # opt in to approximate fast paths for this call only
        video = pipe(prompt).frames
    print(accelpatch.report(pipe))              # which fast paths ran, which fell back and why
    accelpatch.apply(pipe, backend="sol_attn")  # MiniMax-H3: block-sparse Sol-Attn with dense guards
    accelpatch.remove(pipe)                     # back to the untouched model, bit for bit
    pipe.transformer.set_attention_backend("sol_attn")  # diffusers' own switch, no apply(): sparse under "high"

Tiers nest ``exact`` ⊂ ``lossless`` (default) ⊂ ``high``; ``exact`` and ``lossless`` are bit-identical to the
unpatched model.
"""
from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any, Iterator

from accelpatch._lazy import lazy_attributes
from accelpatch.sol_attn.config import SolAttnConfig
from accelpatch.core.errors import AccelpatchError, FastPathUnavailableError
from accelpatch.core.steps import denoising_step
from accelpatch.core.tiers import quality

__version__ = "0.1.0"

#: the public surface: patch, choose the tier, see what ran, check and time it (issue #33); everything else lives in
#: its subpackage: accelpatch.core, accelpatch.lossless, accelpatch.sol_attn, accelpatch.step_cache, accelpatch.parallel,
#: accelpatch.models, accelpatch.eval
__all__ = [
    "apply", "patched", "remove", "report", "quality", "current_quality", "denoising_step", "supported_models",
    "SolAttnConfig", "Recipe", "load_recipe", "validate", "bench", "tune", "doctor", "memory_plan",
    "AccelpatchError", "FastPathUnavailableError", "__version__",
]

#: public names imported on first use: the instruments import torch-heavy modules only when used
_LAZY = {
    "validate": "accelpatch.eval.validate",
    "bench": "accelpatch.eval.bench",
    "tune": "accelpatch.eval.tune",
    "load_recipe": "accelpatch.recipes",
    "Recipe": "accelpatch.recipes",
    "doctor": "accelpatch.tools.doctor",
    "memory_plan": "accelpatch.memory.plan",
}

#: subpackages reachable as attributes after ``import accelpatch`` (imported on first access)
_SUBPACKAGES = ("core", "lossless", "sol_attn", "step_cache", "parallel", "models", "eval", "testing", "tools",
                "memory")

# ``sol_attn`` joins diffusers' attention backends only when asked (register_attention_backend(), apply(...,
# backend="sol_attn")): importing accelpatch imports neither diffusers nor torch and changes nothing of theirs.
from accelpatch.sol_attn import registration as _attention_registry  # noqa: E402

# The core hosts the features and the model families: they register themselves when these modules are imported, on
# the first apply() or report() (the core imports none of them; see accelpatch.core.features).
from accelpatch.core import features as _features  # noqa: E402

_features.host("accelpatch.lossless.feature", "accelpatch.step_cache.feature", "accelpatch.parallel.feature",
               "accelpatch.sol_attn.feature", "accelpatch.low_memory.feature")
_features.host_adapters("accelpatch.models.registry:ADAPTERS")


__getattr__ = lazy_attributes(__name__, _LAZY, subpackages=_SUBPACKAGES)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


def apply(target: Any, *, backend: Any = None, strict: bool = False, tier: Any = None, cache: Any = None,
          recipe: Any = None, cpu_kernels: bool = True, **options: Any):
    """Patch a diffusers pipeline (its ``transformer`` and ``transformer_2``) or a transformer module in place.

    Each supported attention module becomes a gated subclass of its own class (same parameters, same path).
    ``backend`` selects an attention backend (see ``supported_models()``); ``strict=True`` raises
    :class:`FastPathUnavailableError` where a requested fast path cannot run instead of falling back. ``tier``
    sets the model's default tier for calls outside any :func:`quality` block (None: ``lossless``, or ``high``
    with an approximate backend). ``cache`` adds a ``high``-tier step cache (``"first_block"`` or a diffusers
    ``FirstBlockCacheConfig``; guards ``cache_warmup_steps``, ``cache_max_reuse``, ``cache_final_steps``). ``recipe`` (a recipe name, a YAML path or a :class:`Recipe`) supplies tier,
    backend and options; keyword arguments given here override the recipe's. A fast path that cannot run on this
    model at all warns once here, with the reason. Applying twice with the same arguments is the same as applying
    once. ``cpu_kernels=False`` keeps this model's fused ops off the compiled CPU kernels (they run diffusers' own
    chains, counted; ``ACCELPATCH_CPU_KERNELS=0`` does it for the process, before anything is built).
    ``memory="low"`` runs the feed-forwards, query/key norms and the blocks' row-wise parts in chunks of
    ``memory_chunk_tokens`` tokens (default 8192), each checked bit for bit against the whole computation on first
    sight (unchecked at tier ``high``): less memory per step, the same output (docs/memory.md). Returns the
    :func:`report` of the patched models (a table in a notebook).
    """
    from accelpatch.core.patcher import apply as _apply

    if recipe is not None:
        from accelpatch.recipes import load_recipe

        spec = load_recipe(recipe).apply_arguments()
        recipe_backend, recipe_tier, recipe_cache = spec.pop("backend"), spec.pop("tier"), spec.pop("cache", None)
        backend = recipe_backend if backend is None else backend
        tier = recipe_tier if tier is None else tier
        cache = recipe_cache if cache is None else cache
        options = {**spec, **options}
    report = _apply(target, backend=backend, strict=strict, tier=tier, cache=cache, cpu_kernels=cpu_kernels,
                    **options)
    if backend is not None:  # Sol-Attn asked for: diffusers' own switch set_attention_backend("sol_attn") works too
        from accelpatch.sol_attn.registration import register_quietly

        register_quietly()
    try:
        ref = weakref.ref(target)
    except TypeError:
        ref = lambda: target  # noqa: E731 - not weakly referenceable: hold it
    return report.undone_by(lambda: remove(ref()) if ref() is not None else None)


def current_quality(target: Any = None) -> str:
    """The tier in force in the calling context, as its name.

    Without ``target``: the tier set by the enclosing :func:`quality` block, or ``"lossless"`` (the default) outside
    any block. With a pipeline or transformer: the tier *that model* runs under here, which differs where a
    model's default is not lossless (MiniMax-H3 patched with ``backend="sol_attn"`` runs at ``"high"`` unless a
    :func:`quality` block says otherwise). A model accelpatch has not patched runs untouched diffusers: ``"exact"``.
    For a pipeline with several transformers, the least exact of their tiers.
    """
    from accelpatch.core import tiers

    if target is None:
        return tiers.current_quality()
    from accelpatch.core.patcher import patch_of, transformers_of

    found = [tiers.effective_tier(patch.default_tier) if patch is not None else tiers.Tier.EXACT
             for patch in map(patch_of, transformers_of(target, verb="current_quality"))]
    return str(max(found))


@contextlib.contextmanager
def patched(target: Any, **kwargs: Any) -> Iterator[Any]:
    """``with accelpatch.patched(pipe, ...) as report:`` patches like :func:`apply` (same arguments) for the block
    only: on leaving it, also through an exception, the models are as they were before (unpatched, or patched as
    they were, by the same arguments)."""
    from accelpatch.core.patcher import patch_of, transformers_of

    before = [(model, patch_of(model).reapply_arguments()) for model in transformers_of(target, verb="patched")
              if patch_of(model) is not None]
    report = apply(target, **kwargs)
    try:
        yield report
    finally:
        remove(target)
        if before and len(before) == len(transformers_of(target)) and all(a == before[0][1] for _, a in before):
            apply(target, **before[0][1])  # through the pipeline again: its scheduler is the step clock
        else:
            for model, arguments in before:
                apply(model, **arguments)


def remove(target: Any) -> None:
    """Restore the original classes and attributes; afterwards the model equals the never-patched one, also where a
    hook added after :func:`apply` still holds the patched forward."""
    from accelpatch.core.patcher import remove as _remove

    _remove(target)


def report(target: Any, *, reset: bool = False):
    """Sites (path, kind, tier, mounted or rejected with reason) and per-site call counters of a patched
    pipeline or transformer; for a model set to ``set_attention_backend("sol_attn")`` (patched or not), also the
    backend's counts (``report.attention_backend``: process-wide, see :func:`attention_backend_report`).
    ``reset=True`` zeroes the counters after reading them."""
    from accelpatch.core.patcher import transformers_of
    from accelpatch.core.reporting import build_report

    models = transformers_of(target, verb="report")
    report = build_report(models, reset=reset)
    if _attention_registry.is_registered():
        from accelpatch.sol_attn.diffusers_backend import uses_sol_attn
        from accelpatch.sol_attn.registration import attention_backend_report

        if uses_sol_attn(models):  # counted process-wide: diffusers passes the backend no module
            report = dataclasses.replace(report, attention_backend=attention_backend_report(reset=reset))
    return report


def supported_models() -> dict[str, tuple[str, ...]]:
    """Supported transformer classes and the backends each accepts."""
    from accelpatch.models.registry import ADAPTERS

    return {name: adapter.backends for adapter in ADAPTERS for name in adapter.class_names}
