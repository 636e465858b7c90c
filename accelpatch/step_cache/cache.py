"""A ``high``-tier step cache on diffusers' own FirstBlockCache and MagCache hooks, per call and per thread, gated.

diffusers' FirstBlockCache runs the first transformer block at every step and, when its residual moved less than a
threshold since the last fully computed step, reuses the remaining blocks' cached residual instead of running them.
As shipped it does not run on SANA-Video or MiniMax-H3 (their block classes are not registered, their pipelines open
no cache context), keeps one state per process, and knows nothing of tiers. Here:

* the block classes are registered with diffusers' ``TransformerBlockRegistry`` and diffusers' own
  ``apply_first_block_cache`` puts its hooks on the blocks; a block that returns two streams (HunyuanVideo 1.5's
  video and text, LTX-2's video and audio) is registered with the output layout and second-stream argument its
  adapter declares (its ``CacheSupport``: ``block_outputs``, ``second_stream``);
* the hooks' state lives in a :class:`ContextLocalStateManager`: keyed by the generation and the classifier-free
  guidance branch of the calling thread or asyncio task, so every pipeline call starts clean (also after an
  exception or an interrupted call: a call at step 0 starts a new generation) and threads never share a state;
* the reuse decision is gated: it can only reuse under the ``high`` tier, and never in the first
  ``cache_warmup_steps`` steps, the last ``cache_final_steps`` steps (when the pipeline's scheduler tells how many
  there are) or after ``cache_max_reuse`` consecutive reuses; each decision is counted for ``report()``.

At ``exact``/``lossless`` every block runs, and the output is bit-identical to the unpatched model (the hooks only
read). The data-dependent decision is a graph break under ``torch.compile`` (diffusers wraps it in
``torch.compiler.disable``): with a cache, ``fullgraph=True`` does not hold.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from accelpatch.core import block_registry, steps
from accelpatch.core.block_registry import Registrations
from accelpatch.core.errors import CacheConflictError, did_you_mean
from accelpatch.core.gate import SiteCounters
from accelpatch.parallel.sequence import all_agree, deciding_ranks
from accelpatch.core.tiers import Tier, effective_tier

__all__ = ["StepCacheConfig", "resolve_cache", "StepCache", "CACHE_METHODS"]

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
    warmup_steps: int = 2
    max_reuse: int = 2
    final_steps: int = 1
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


# --- other step caches on the same model -----------------------------------------------------------------------

#: diffusers' block-cache hooks (FirstBlockCache, MagCache) by registry name, and the config class each belongs to
_DIFFUSERS_BLOCK_CACHE_HOOKS = {"fbc_leader_block_hook": "FirstBlockCacheConfig", "fbc_block_hook":
                                "FirstBlockCacheConfig", "mag_cache_leader_block_hook": "MagCacheConfig",
                                "mag_cache_block_hook": "MagCacheConfig"}


def foreign_cache(model: torch.nn.Module, blocks=(), ours: Optional["StepCache"] = None) -> Optional[str]:
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


def refuse_foreign_cache(model: torch.nn.Module, blocks=(), ours: Optional["StepCache"] = None) -> None:
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


# --- per-context state -----------------------------------------------------------------------------------------

_generations = itertools.count(1)
#: at most this many calls' cache states are held at once (per model); older ones are freed
MAX_LIVE_GENERATIONS = 8


@dataclass
class _CallKey:
    """Which cache state the calling context uses: its generation, the step of its last call and the CFG branch."""

    generation: int
    step: Optional[int]
    branch: int
    #: True from the call's start until its end: still True at the next call when the last one raised or was
    #: interrupted (the exit hook never ran), whose states may be half-written
    open: bool = True


def _starts_generation(key: Optional[_CallKey], step: Optional[int]) -> bool:
    """Whether a call at ``step`` starts a new generation after the context's last call (``key``): the first call,
    an unknown step, step 0 after a call at another (or an unknown) step, or a step lower than the last."""
    if key is None or step is None:
        return True
    if key.step is None:
        return step == 0
    return step < key.step


class ContextLocalStateManager:
    """diffusers' ``StateManager`` interface (``get_state``, ``set_context``, ``reset``) with the state chosen by
    the calling thread's or task's current generation and CFG branch instead of one process-wide context."""

    def __init__(self, state_cls: type, key: contextvars.ContextVar) -> None:
        self._state_cls = state_cls
        self._key = key
        self._states: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()
        #: diffusers' hooks set a context of their own when this is None: ours is the calling context
        self._context = "accelpatch: the calling thread's or task's generation"

    def get_state(self):
        key = self._key.get()
        if key is None:
            raise RuntimeError("accelpatch step cache: no generation is set for this call (the model's pre-forward "
                               "hook did not run)")
        with self._lock:
            state = self._states.get((key.generation, key.branch))
            if state is None:
                state = self._states[(key.generation, key.branch)] = self._state_cls()
                state.reused_in_a_row = 0
            return state

    def set_context(self, context) -> None:  # diffusers' cache_context: our states follow the call instead
        return None

    def drop(self, generation: int) -> None:
        """Forget every state of ``generation`` (its call is over or was abandoned)."""
        with self._lock:
            for key in [k for k in self._states if k[0] == generation]:
                del self._states[key]

    def keep_newest(self, generations: int) -> None:
        """Forget the states of all but the ``generations`` most recent generations (a bound on what calls that
        ended without a known final step, or threads that never came back, can hold)."""
        with self._lock:
            live = sorted({k[0] for k in self._states})
            for key in [k for k in self._states if k[0] in live[:-generations]]:
                del self._states[key]

    @property
    def live_generations(self) -> int:
        with self._lock:
            return len({k[0] for k in self._states})

    def reset(self, *args, **kwargs) -> None:
        with self._lock:
            self._states.clear()

    def __getstate__(self) -> dict:
        return {"_state_cls": self._state_cls, "_key": None, "_states": {}, "_context": self._context}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def cache_totals(counters: SiteCounters, reset: bool = False) -> dict:
    """A step cache's counts, kept in the one counter type every site uses (:class:`~accelpatch.core.gate.SiteCounters`):
    a reused step is the cache's fast call, a computed step a reference call counted with why it could not reuse,
    and a guard that could not apply a note."""
    totals = counters.totals()
    if reset:
        counters.reset()
    reasons = {reason: n for reason, n in totals["reference"].items() if n}
    return {"computed": sum(reasons.values()), "reused": totals["fast"], "reasons": reasons,
            "notes": {note: n for note, n in totals["notes"].items() if n}}


# --- attaching ------------------------------------------------------------------------------------------------

#: the block layout every single-stream family has: the hidden states alone (index 0), no second stream
SINGLE_STREAM = (0, None, "encoder_hidden_states")


@functools.lru_cache(maxsize=None)
def _stream_metadata_class():
    """diffusers' ``TransformerBlockMetadata`` whose argument reads follow its declared argument names: diffusers'
    FirstBlockCache and MagCache hooks ask for ``"encoder_hidden_states"`` by that fixed name, which on LTX-2's
    blocks is the text, not the second stream (``audio_hidden_states``). Made on first use; pickles by name."""
    from diffusers.hooks._helpers import TransformerBlockMetadata

    class StreamMetadata(TransformerBlockMetadata):
        def _get_parameter_from_args_kwargs(self, identifier: str, args=(), kwargs=None):
            names = {"hidden_states": self.hidden_states_argument_name,
                     "encoder_hidden_states": self.encoder_hidden_states_argument_name}
            return super()._get_parameter_from_args_kwargs(names.get(identifier, identifier), args, kwargs)

    StreamMetadata.__module__ = __name__
    StreamMetadata.__qualname__ = StreamMetadata.__name__ = "StreamMetadata"
    return StreamMetadata


def _register_block(block_class: type, registrations: Registrations, streams: tuple = SINGLE_STREAM) -> None:
    """Register the blocks' class with diffusers' block registry for as long as the model is patched (its cache
    hooks look blocks up by class, and read parameters by name from the class's forward): the original class, and
    the gated class ``block_class`` may be (a copy of the original's entry, see :mod:`accelpatch.core.block_registry`).
    ``streams`` = (output index of the hidden states, output index of the second stream or None, the forward
    argument the second stream enters by), as the family's adapter declares it. A class diffusers registers itself
    must agree (else ValueError naming both): its entry then serves as is."""
    from diffusers.hooks._helpers import TransformerBlockMetadata

    original = block_registry.original_of(block_class)
    hidden, second, argument = streams
    renamed = second is not None and argument != "encoder_hidden_states"
    existing = block_registry.entry(original)
    replace = False
    if existing is not None:
        found = (existing.return_hidden_states_index, existing.return_encoder_hidden_states_index,
                 existing.encoder_hidden_states_argument_name if existing.return_encoder_hidden_states_index
                 is not None else argument)
        agrees = found == streams and (not renamed or isinstance(existing, _stream_metadata_class()))
        if not block_registry.is_ours(original):
            if not agrees:
                raise ValueError(f"diffusers registers {original.__name__} for its cache hooks with (hidden states at "
                                 f"output {found[0]}, second stream at {found[1]}, argument {found[2]!r}); accelpatch "
                                 f"expects ({hidden}, {second}, {argument!r}): a diffusers version this adapter does "
                                 "not know")
        replace = not agrees
    metadata_class = _stream_metadata_class() if renamed else TransformerBlockMetadata
    metadata = metadata_class(return_hidden_states_index=hidden, return_encoder_hidden_states_index=second,
                              encoder_hidden_states_argument_name=argument if second is not None
                              else "encoder_hidden_states")
    registrations.register(original, metadata, replace=replace)
    if original is not block_class:
        registrations.mirror(block_class)


class _RemainingBlocksState:
    """The model-level cache state of one generation and branch (a model that exposes its own hook point)."""

    def __init__(self) -> None:
        self.head_block_residual: Optional[torch.Tensor] = None
        self.tail_residual: Optional[torch.Tensor] = None

    def reset(self) -> None:
        self.head_block_residual = self.tail_residual = None


def relative_change(residual: torch.Tensor, previous: torch.Tensor) -> float:
    """FirstBlockCache's measure: mean |residual - previous| over mean |previous|."""
    return float((residual - previous).abs().mean() / previous.abs().mean())


def _hooked_forward(block: torch.nn.Module):
    """The forward diffusers' registry (or :meth:`StepCache._own_block_forwards`) installed on ``block``: the one the
    registry's last hook wraps."""
    registry = block.__dict__.get("_diffusers_hook")
    return getattr(registry, "_accelpatch_installed_forward", None) if registry is not None else None


def _run_hooked(function_reference, module, *args, **kwargs):
    """A module forward through one diffusers hook (what diffusers' registry builds, without its closure)."""
    args, kwargs = function_reference.pre_forward(module, *args, **kwargs)
    output = function_reference.forward(*args, **kwargs)
    return function_reference.post_forward(module, output)


class _GatedDecision:
    """Stands in for FirstBlockCache's ``_should_compute_remaining_blocks`` on the head hook (picklable)."""

    def __init__(self, cache: "StepCache", hook) -> None:
        self.cache, self.hook = cache, hook

    def __call__(self, residual: torch.Tensor) -> bool:
        return self.cache.decide(self.hook, residual)


@functools.lru_cache(maxsize=None)
def _gated_mag_head_class():
    """diffusers' MagCache head hook whose ``config`` is, per calling context, the real one or a never-skip copy.
    Made on first use (diffusers loads lazily); pickles by name through the module's ``__getattr__``."""
    from diffusers.hooks.mag_cache import MagCacheHeadHook

    class GatedMagCacheHeadHook(MagCacheHeadHook):
        @property
        def config(self):
            return self._never_skip if self._cache._blocked.get() is not None else self._config

        @config.setter
        def config(self, value):
            self._config = value

    GatedMagCacheHeadHook.__module__ = __name__
    GatedMagCacheHeadHook.__qualname__ = "GatedMagCacheHeadHook"
    return GatedMagCacheHeadHook


def __getattr__(name: str) -> Any:
    if name == "GatedMagCacheHeadHook":
        return _gated_mag_head_class()
    if name == "StreamMetadata":
        return _stream_metadata_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class StepCache:
    """diffusers' FirstBlockCache or MagCache on one transformer's blocks, made per-call, per-thread, tier-gated."""

    def __init__(self, model: torch.nn.Module, config: StepCacheConfig, default_tier: Tier,
                 pipeline: Optional[Any], blocks_attribute: Optional[str],
                 block_streams: tuple = SINGLE_STREAM) -> None:
        """``blocks_attribute`` names the ModuleList of residual blocks diffusers' hooks go on; None: the model
        offers its own hook point (``_remaining_blocks_cache``: ``reuse(first_block_delta)``, ``store(tail)``).
        ``block_streams``: where those blocks' streams sit (see :func:`_register_block`)."""
        self.config = config
        self.counters = SiteCounters()
        self._default_tier = default_tier
        self._pipeline = weakref.ref(pipeline) if pipeline is not None else None  # for its scheduler's timesteps
        self._key: contextvars.ContextVar = contextvars.ContextVar(f"accelpatch_step_cache_{id(self)}", default=None)
        #: MagCache: why this call may not reuse (None: MagCache decides), set before the blocks run
        self._blocked: contextvars.ContextVar = contextvars.ContextVar(f"accelpatch_mag_{id(self)}", default=None)
        self._model = model
        self._registrations = Registrations(model)  # the registry entries its blocks need, released by remove()
        self._blocks = list(getattr(model, blocks_attribute)) if blocks_attribute else []
        self._root_had_registry = "_diffusers_hook" in model.__dict__
        if not self._blocks:
            if config.method != "first_block":
                raise ValueError(f"cache method {config.method!r} needs residual blocks; {type(model).__name__} "
                                 "supports cache='first_block' only")
            self.states = ContextLocalStateManager(_RemainingBlocksState, self._key)
            model.__dict__["_remaining_blocks_cache"] = self
        elif config.method == "mag":
            _register_block(type(self._blocks[0]), self._registrations, block_streams)
            self._attach_mag(model)
        else:
            _register_block(type(self._blocks[0]), self._registrations, block_streams)
            self._attach_first_block(model)
        self._own_block_forwards(strict=False)
        #: (name, hook) of the decision hook on the first block: another cache put there later replaces it
        self._leader = self._leader_hook()
        #: diffusers' CacheMixin: while this cache is on, the model says so (model.is_cache_enabled), and diffusers'
        #: enable_cache() refuses to stack one of its own caches on it; remove() puts back what was there
        self._cache_config_slot = None
        if hasattr(type(model), "_cache_config") and getattr(model, "_cache_config", None) is None:
            self._cache_config_slot = ("_cache_config" in model.__dict__,)
            model._cache_config = config
        self._handles = [model.register_forward_pre_hook(self._enter_call, with_kwargs=True),
                         model.register_forward_hook(self._exit_call)]

    def _leader_hook(self) -> Optional[tuple]:
        registry = self._blocks[0].__dict__.get("_diffusers_hook") if self._blocks else None
        for name in ("fbc_leader_block_hook", "mag_cache_leader_block_hook"):
            if registry is not None and name in registry.hooks:
                return name, registry.hooks[name]
        return None

    def check_alone(self) -> None:
        """Raise :class:`CacheConflictError` when another step cache was put on the model after ``apply()``:
        cache-dit's, diffusers' through ``enable_cache``, or diffusers' hooks replacing ours on the first block."""
        found = foreign_cache(self._model, ours=self)
        if found is None and self._leader is not None:
            registry = self._blocks[0].__dict__.get("_diffusers_hook")
            name, hook = self._leader
            if registry is None or registry.hooks.get(name) is not hook:
                found = (f"diffusers' cache hooks put on block 0 after apply() in place of accelpatch's ({name}): "
                         "take them off (HookRegistry.remove_hook)")
        if found is not None:
            refuse_cache_stack(self._model, found, after_apply=True)

    def _attach_first_block(self, model: torch.nn.Module) -> None:
        from diffusers.hooks.first_block_cache import (FBCHeadBlockHook, FBCSharedBlockState, FirstBlockCacheConfig,
                                                       apply_first_block_cache)

        apply_first_block_cache(model, FirstBlockCacheConfig(threshold=self.config.threshold))
        self.states = ContextLocalStateManager(FBCSharedBlockState, self._key)
        for hook in self._hooks():
            if isinstance(hook, FBCHeadBlockHook):
                hook._should_compute_remaining_blocks = _GatedDecision(self, hook)

    def _attach_mag(self, model: torch.nn.Module) -> None:
        from diffusers.hooks.mag_cache import MagCacheHeadHook, MagCacheState, apply_mag_cache

        apply_mag_cache(model, self.config.diffusers_config)
        self.states = ContextLocalStateManager(MagCacheState, self._key)
        gated = _gated_mag_head_class()
        for hook in self._hooks():
            if isinstance(hook, MagCacheHeadHook):
                real = hook.__dict__.pop("config")
                hook.__class__ = gated
                hook._config = real
                hook._never_skip = dataclasses.replace(real, threshold=-1.0)  # accumulated error >= 0: computes
                hook._cache = self

    # the model-level hook point (a model whose blocks are not residual blocks) ----------------------------------

    def reuse(self, first_block_delta: torch.Tensor) -> Optional[torch.Tensor]:
        """Called by the model after its first block: the cached contribution of the remaining blocks when this
        step may reuse it, else None (and the model runs them, then calls :meth:`store`)."""
        state = self.states.get_state()
        if self._may_reuse(state, lambda: relative_change(first_block_delta, state.head_block_residual)
                           <= self.config.threshold):
            return state.tail_residual
        state.head_block_residual = first_block_delta
        return None

    def store(self, tail_residual: torch.Tensor) -> None:
        self.states.get_state().tail_residual = tail_residual

    def _hooks(self):
        """diffusers' cache hooks on the blocks, each now reading this cache's context-local states."""
        for block in self._blocks:
            for hook in block._diffusers_hook.hooks.values():
                if hasattr(hook, "state_manager"):
                    hook.state_manager = self.states
                yield hook

    # the generation and branch of each call ------------------------------------------------------------------

    def _enter_call(self, module, args, kwargs):
        """Before each transformer call: a call at step 0 (or with no step known after a step > 0) after any other
        step starts a new generation with clean state; calls at the same step are CFG branches 0, 1, ..."""
        if self.__dict__.pop("_rewire", False):  # a copy: refuse blocks whose forward is still the original's
            self._own_block_forwards(strict=True)
            self._leader = self._leader_hook()
        self.check_alone()
        step = steps.current_step().step
        key = self._key.get()
        if key is not None and key.open:  # the context's last call raised or was interrupted midway
            self.states.drop(key.generation)
            key = None
        if _starts_generation(key, step):
            if key is not None:
                self.states.drop(key.generation)
            self.states.keep_newest(MAX_LIVE_GENERATIONS - 1)
            key = _CallKey(generation=next(_generations), step=step, branch=0)
        elif step == key.step:
            key = _CallKey(key.generation, step, key.branch + 1)
        else:
            key = _CallKey(key.generation, step, 0)
        self._key.set(key)
        if self.config.final_steps and self._final_step_index() is None:
            self.counters.count_note("final-step guard off: no pipeline scheduler (apply() the pipeline to enable it)")
        if self.config.method == "mag":
            split = MAG_SPLIT if deciding_ranks(self._model) is not None else None
            self._blocked.set(split or self._blocked_reason(self.states.get_state(), "previous_residual"))
        return None

    def _exit_call(self, module, args, output):
        """After each transformer call: count a MagCache call; after the final step, free the call's states."""
        if self.config.method == "mag":
            self._count_mag_call()
        key, final = self._key.get(), self._final_step_index()
        if key is not None:
            key.open = False
        if key is not None and key.step is not None and final is not None and key.step >= final:
            self.states.drop(key.generation)  # a later CFG branch of this step starts a fresh state: it computes
        return None

    def _count_mag_call(self) -> None:
        """Whether this MagCache call reused, and why it computed."""
        state = self.states.get_state()
        reason = None
        if state.should_compute:
            reason = self._blocked.get() or ("MagCache computed (accumulated error above its threshold, retention "
                                             "steps or its max_skip_steps)")
        self._record(state, reused=not state.should_compute, reason=reason)

    def _final_step_index(self) -> Optional[int]:
        pipeline = self._pipeline() if self._pipeline is not None else None
        scheduler = getattr(pipeline, "scheduler", None)
        timesteps = getattr(scheduler, "timesteps", None)
        try:
            return len(timesteps) - 1 if timesteps is not None else None
        except TypeError:
            return None

    def decide(self, hook, residual: torch.Tensor) -> bool:
        """FirstBlockCache's head-block decision, gated: True runs the remaining blocks."""
        return not self._may_reuse(self.states.get_state(),  # diffusers' own test says whether it changed enough
                                   lambda: not type(hook)._should_compute_remaining_blocks(hook, residual))

    def _may_reuse(self, state, unchanged) -> bool:
        """The gated decision of FirstBlockCache (diffusers' hooks or the model's own hook point): reuse only when no
        guard forbids it and ``unchanged()`` (the threshold test) holds; counts the decision and its reason."""
        reason = self._blocked_reason(state, "head_block_residual")
        if reason is None and not unchanged():
            reason = "residual changed more than the threshold"
        ranks = deciding_ranks(self._model)  # a model split over ranks: they reuse together or not at all
        if ranks is not None and not all_agree(reason is None, ranks) and reason is None:
            reason = "another rank computes this step (the ranks the model is split over decide together)"
        self._record(state, reused=reason is None, reason=reason)
        return reason is None

    def _record(self, state, reused: bool, reason: Optional[str]) -> None:
        """Count one call's decision, and the reuses in a row the reuse limit reads."""
        state.reused_in_a_row = state.reused_in_a_row + 1 if reused else 0
        if reused:
            self.counters.count_fast()
        else:
            self.counters.count_reference(reason)

    def _blocked_reason(self, state, history: str) -> Optional[str]:
        """Why this call may not reuse (None: the cache's own test decides); ``history`` names the state field that
        is None until a step of this call has been computed."""
        if not effective_tier(self._default_tier).admits(Tier.HIGH):
            return "tier does not admit high"
        if torch.is_grad_enabled() and any(p.requires_grad for p in self._model.parameters()):
            # a cached residual belongs to an earlier call's autograd graph: backward through it fails (or, once
            # that graph is freed, would skip the reused blocks' gradients)
            return "gradients are recorded (training): reuse would carry an earlier call's graph"
        if getattr(state, history) is None:
            return "first step of the call"
        step = steps.current_step().step
        if step is None:
            return "no known step (warm-up and final-step guards cannot apply)"
        if step < self.config.warmup_steps:
            return f"warm-up step (step < cache_warmup_steps={self.config.warmup_steps})"
        final = self._final_step_index()
        if final is not None and step > final - self.config.final_steps:
            return f"final step (last cache_final_steps={self.config.final_steps})"
        if state.reused_in_a_row >= self.config.max_reuse:
            return f"reuse limit (cache_max_reuse={self.config.max_reuse} in a row)"
        return None

    def remove(self) -> None:
        """Take diffusers' hooks off the blocks and leave them as they were (no registry, class forward); a hook
        added on a block after ``apply`` (accelerate's, or a plain rebinding of ``forward``) stays, now around the
        block's own forward. The root's registry goes too when the cache created it (MagCache does)."""
        from diffusers.hooks.first_block_cache import _FBC_BLOCK_HOOK, _FBC_LEADER_BLOCK_HOOK
        from diffusers.hooks.mag_cache import _MAG_CACHE_BLOCK_HOOK, _MAG_CACHE_LEADER_BLOCK_HOOK

        for handle in self._handles:
            handle.remove()
        self._model.__dict__.pop("_remaining_blocks_cache", None)
        for block in self._blocks:
            registry = getattr(block, "_diffusers_hook", None)
            if registry is None:
                continue
            hooked = _hooked_forward(block)
            outer = block.__dict__.get("forward")
            for name in (_FBC_LEADER_BLOCK_HOOK, _FBC_BLOCK_HOOK, _MAG_CACHE_LEADER_BLOCK_HOOK, _MAG_CACHE_BLOCK_HOOK):
                registry.remove_hook(name, recurse=False)
            if not registry.hooks:
                del block._diffusers_hook
            inner = block.__dict__.get("forward")
            if getattr(inner, "__func__", None) is type(block).forward:
                block.__dict__.pop("forward")
                inner = None
            if outer is not None and outer is not hooked:  # a wrapper added after apply(): keep it, re-pointed
                block.forward = outer
                for name in ("_old_forward",):
                    if block.__dict__.get(name) is hooked:
                        block.__dict__[name] = inner if inner is not None else type(block).forward.__get__(block)
        if not self._root_had_registry:
            registry = self._model.__dict__.get("_diffusers_hook")
            if registry is not None and not registry.hooks:
                del self._model._diffusers_hook
        if self._cache_config_slot is not None and self._model.__dict__.get("_cache_config") is self.config:
            if self._cache_config_slot[0]:
                self._model._cache_config = None
            else:
                del self._model._cache_config
        self._registrations.release()
        self.states.reset()

    def _own_block_forwards(self, strict: bool) -> None:
        """Give each block whose only diffusers hook is ours a forward that pickles and deep-copies: diffusers builds
        the hooked forward as a closure over the hook (it does not pickle, and a deep copy would keep calling the
        original's hook) and wraps the hook's forward with the attributes of torch's compiler-disable wrapper (which
        do not pickle). The call chain stays diffusers': pre_forward, the hook's new_forward, post_forward. A block
        carrying other diffusers hooks keeps diffusers' wiring; ``strict`` (in a copy) refuses it instead."""
        for block in self._blocks:
            registry = block._diffusers_hook
            if len(registry._fn_refs) != 1:
                if strict:
                    raise RuntimeError(f"a copied block carries {len(registry._fn_refs)} diffusers hooks; accelpatch "
                                       "can rewire only its own: apply the step cache again on the copy")
                continue
            function_reference = registry._fn_refs[0]
            hook = registry.hooks[registry._hook_order[0]]
            function_reference.forward = functools.partial(hook.new_forward, block)
            block.forward = functools.update_wrapper(functools.partial(_run_hooked, function_reference, block),
                                                     type(block).forward)
        for block in self._blocks:  # what remove() takes off again (a wrapper added later stays)
            block._diffusers_hook._accelpatch_installed_forward = block.__dict__.get("forward")

    # pickling and copies: context variables cannot be pickled; a copy gets fresh ones (and no states) -----------

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_key", "_blocked")}
        state["_pipeline"] = None  # a weak reference: a copy's final-step guard needs apply() on its pipeline
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._rewire = True  # blocks carrying other diffusers hooks still call the original's: checked on first call
        self._key = contextvars.ContextVar(f"accelpatch_step_cache_{id(self)}", default=None)
        self._blocked = contextvars.ContextVar(f"accelpatch_mag_{id(self)}", default=None)
        self.states._key = self._key