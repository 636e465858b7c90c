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
  exception or an interrupted call: another pipeline call, known by its scheduler's new ``timesteps``, or a call at
  step 0 starts a new generation) and threads never share a state;
* the reuse decision is gated: it can only reuse under the ``high`` tier, and never in the first
  ``cache_warmup_steps`` steps the model runs in the call, the last ``cache_final_steps`` steps (when the pipeline's
  scheduler tells how many there are) or after ``cache_max_reuse`` consecutive reuses; each decision is counted for
  ``report()``.

Wan 2.2's two experts: ``transformer`` (high noise) runs the call's steps before the pipeline's boundary,
``transformer_2`` (low noise) those after it, each with its own StepCache. Both read the call's step numbers (0..N-1)
from the pipeline's scheduler, so ``cache_final_steps`` guards the call's last steps (run by ``transformer_2``) and a
fraction is of the call's steps. The warm-up is per expert: each expert's first ``cache_warmup_steps`` steps of its
share of the call compute (8 steps split 4 + 4, warm-up 2: steps 0-1 and 4-5; a single transformer's share starts
at step 0, as before); ``report()`` says "warm-up step of this expert". MagCache's ratios and retention are read at
the call's step, not at the expert's count of its own calls. When one expert runs a step, the other expert's share of
the call is over: its states (the cached residuals) are freed then, in the calling context, rather than at its next
call; the final step frees the expert that ran it.

At ``exact``/``lossless`` every block runs, and the output is bit-identical to the unpatched model (the hooks only
read). The data-dependent decision is a graph break under ``torch.compile`` (diffusers wraps it in
``torch.compiler.disable``): with a cache, ``fullgraph=True`` does not hold.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import weakref
from typing import Any, Optional

import torch

from accelpatch.core import steps
from accelpatch.core.block_registry import Registrations
from accelpatch.core.gate import SiteCounters
from accelpatch.core.model_state import patch_of
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.parallel.sequence import all_agree, deciding_ranks
from accelpatch.step_cache.config import MAG_SPLIT, StepCacheConfig
from accelpatch.step_cache.conflicts import foreign_cache, refuse_cache_stack
from accelpatch.step_cache.diffusers_hooks import (SINGLE_STREAM, _gated_mag_head_class, _GatedDecision, _hooked_forward,
                                                   _register_block, _RemainingBlocksState, _run_hooked, relative_change)
from accelpatch.step_cache.states import (MAX_LIVE_GENERATIONS, ContextLocalStateManager, _CallKey, _generations,
                                          _starts_generation, call_ref)

__all__ = ["StepCache"]


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
        """Before each transformer call: a call of another pipeline call (its scheduler's timesteps changed), at step
        0 (or with no step known) after any other step, or after this model's share of its call ended starts a new
        generation with clean state; calls at the same step are CFG branches 0, 1, ... A call of one expert of a
        two-expert pipeline (Wan 2.2) ends the other expert's share of the call: its states are freed."""
        if self.__dict__.pop("_rewire", False):  # a copy: refuse blocks whose forward is still the original's
            self._own_block_forwards(strict=True)
            self._leader = self._leader_hook()
        self.check_alone()
        reading = steps.current_step()
        step, call = reading.step, self._pipeline_call(reading)
        key = self._key.get()
        if key is not None and key.open:  # the context's last call raised or was interrupted midway
            self.states.drop(key.generation)
            key = None
        if _starts_generation(key, step, call):
            if key is not None:
                self.states.drop(key.generation)
            self.states.keep_newest(MAX_LIVE_GENERATIONS - 1)
            key = _CallKey(generation=next(_generations), step=step, branch=0, first_step=step, call=call_ref(call))
        else:
            first = key.first_step if key.first_step is not None else step
            key = _CallKey(key.generation, step, key.branch + 1 if step == key.step else 0, first_step=first,
                           call=key.call)
        self._key.set(key)
        self._end_other_experts(step, call)
        if self.config.final_steps and self._scheduler_total() is None:
            self.counters.count_note("final-step guard off: no pipeline scheduler (apply() the pipeline to enable it)")
        if self.config.method == "mag":
            state = self.states.get_state()
            if step and state.step_index == 0 and state.previous_residual is None:
                # diffusers counts a state's calls from 0; its ratios and retention are the call's steps: an expert
                # whose share starts later (Wan 2.2's low-noise one) reads them from its first step on
                state.step_index = step
            split = MAG_SPLIT if deciding_ranks(self._model) is not None else None
            self._blocked.set(split or self._blocked_reason(state, "previous_residual"))
        return None

    def _exit_call(self, module, args, output):
        """After each transformer call: count a MagCache call; after the final step, free the call's states."""
        if self.config.method == "mag":
            self._count_mag_call()
        key, total = self._key.get(), self._scheduler_total()
        if key is not None:
            key.open = False
        if key is not None and key.step is not None and total is not None and key.step >= total - 1:
            # the final step: this branch's state and the earlier ones' go; a later CFG branch of this step still
            # finds its own (and computes: the final-step guard), then frees it and whatever is left of the call
            self.states.drop(key.generation, up_to_branch=key.branch)
            key.done = True
        return None

    # Wan 2.2's two experts: each has its own StepCache; the pipeline runs the high-noise one on the steps before
    # the boundary, the low-noise one after it -------------------------------------------------------------------

    def _pipeline_call(self, reading: steps.StepReading) -> Any:
        """The token of the pipeline call this model call belongs to: its scheduler's ``timesteps`` (every call's
        ``set_timesteps`` makes new ones, shared by both experts); None when the step does not come from it."""
        if reading.source != steps.SCHEDULER or self._pipeline is None:
            return None
        return getattr(getattr(self._pipeline(), "scheduler", None), "timesteps", None)

    def _experts(self) -> list["StepCache"]:
        """The step caches of the other transformers of this cache's pipeline (Wan 2.2: the other expert's)."""
        pipeline = self._pipeline() if self._pipeline is not None else None
        found = []
        for name in ("transformer", "transformer_2"):
            model = getattr(pipeline, name, None) if pipeline is not None else None
            patch = patch_of(model) if isinstance(model, torch.nn.Module) and model is not self._model else None
            if patch is not None:
                found.extend(a for a in patch.attached.values() if isinstance(a, StepCache) and a is not self)
        return found

    def _end_other_experts(self, step: Optional[int], call: Any) -> None:
        """This model runs ``step`` of the pipeline call ``call``: in the calling context, every other expert of the
        pipeline that last ran another step (or another call) is done with its share of the call. Its states (cached
        residuals) are freed now, not when its next call starts: Wan 2.2's high-noise expert never runs the call's
        final step. Freeing only ever makes a step compute (an expert called again in the same call starts a new
        generation: first step and warm-up)."""
        for other in self._experts():
            key = other._key.get()
            if key is None or key.done:
                continue
            other_call = call is not None and not key.of_call(call)
            if other_call or (step is not None and key.step is not None and step != key.step):
                other.states.drop(key.generation)
                key.done = True

    def _count_mag_call(self) -> None:
        """Whether this MagCache call reused, and why it computed."""
        state = self.states.get_state()
        reason = None
        if state.should_compute:
            reason = self._blocked.get() or ("MagCache computed (accumulated error above its threshold, retention "
                                             "steps or its max_skip_steps)")
        self._record(state, reused=not state.should_compute, reason=reason)

    def _scheduler_total(self) -> Optional[int]:
        """The number of steps of the pipeline call (its scheduler's; None without a pipeline)."""
        pipeline = self._pipeline() if self._pipeline is not None else None
        scheduler = getattr(pipeline, "scheduler", None)
        return None if scheduler is None else steps.scheduler_total(scheduler)

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
            return "first step of this expert in the call" if self._experts() else "first step of the call"
        reading = steps.current_step()
        step = reading.step
        if step is None:
            return "no known step (warm-up and final-step guards cannot apply)"
        total = reading.total if reading.total is not None else self._scheduler_total()
        warmup, tail = steps.step_count(self.config.warmup_steps), steps.step_count(self.config.final_steps)
        first = warmup.of(total)
        if first is None:
            return f"no known number of steps (cache_warmup_steps={warmup} is a fraction of them)"
        key = self._key.get()
        start = key.first_step if key is not None and key.first_step is not None else 0
        if step < start + first:  # warm-up counts from this model's first step in the call (an expert's share)
            if self._experts():
                return f"warm-up step of this expert (its first cache_warmup_steps={warmup} steps of the call)"
            if start:
                return f"warm-up step (this model's first cache_warmup_steps={warmup} steps of the call)"
            return f"warm-up step (step < cache_warmup_steps={warmup})"
        if total is not None and not tail.zero and step >= total - tail.of(total):
            return f"final step (last cache_final_steps={tail})"
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
        self.states.clear()

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
