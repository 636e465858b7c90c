"""Forward hooks on every patched transformer: what its sites need to know during one call.

Before each forward (a ``register_forward_pre_hook``): the step reading of :mod:`accelpatch.steps` (for adapters
with a step-based policy), the adapter's own captures (MiniMax-H3: the packed layout), and, when gradient
checkpointing is on, the context-preserving wrapper of :mod:`accelpatch.call_context` around the model's
checkpointing function. After each forward (``always_call``, so also when it raised) the values are reset.
"""
from __future__ import annotations

import collections
import contextvars
import inspect
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

import torch

from . import call_context, steps

if TYPE_CHECKING:  # pragma: no cover
    from .patcher import ModelPatch

_frames: contextvars.ContextVar[tuple] = contextvars.ContextVar("accelpatch_hook_frames", default=())


class StepSources:
    """Thread-safe tally of where each call's step came from (``report()`` shows it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()

    def __getstate__(self) -> dict:
        return {"counts": collections.Counter(self.counts)}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.counts.update(state["counts"])

    def add(self, source: str) -> None:
        with self._lock:
            self.counts[source] += 1

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()


class ModelForwardHooks:
    """The pre/post forward hooks ``apply`` puts on a transformer; ``remove()`` takes them off."""

    def __init__(self, model: torch.nn.Module, patch: "ModelPatch", pipeline: Optional[Any]) -> None:
        adapter, backend = patch.adapter, patch.backend
        self._signature = inspect.signature(type(model).forward)
        self._adapter = adapter
        self._backend = backend
        self._pipeline = weakref.ref(pipeline) if pipeline is not None else None
        uses_steps = adapter.uses_steps(backend, patch.options) or patch.cache is not None
        self._clock = steps.TimestepClock(adapter.noise_level) if uses_steps else None
        steps.register_thresholds(*adapter.step_thresholds(backend, patch.options))
        self._step_sources = patch.step_sources
        self._bind = self._clock is not None or adapter.captures(backend)
        self._checkpointing = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        self.handles = [model.register_forward_pre_hook(self.pre, with_kwargs=True),
                        model.register_forward_hook(self.post, always_call=True)]

    def __getstate__(self) -> dict:
        # A weak reference cannot be copied or pickled: a copy keeps its hooks, and its step clock falls back from
        # the pipeline's scheduler to the timestep argument (apply() the copy through its pipeline to get it back).
        return dict(self.__dict__, _pipeline=None)

    def _step(self, bound: dict) -> steps.StepReading:
        pipeline = self._pipeline() if self._pipeline is not None else None
        scheduler = getattr(pipeline, "scheduler", None)
        if scheduler is not None:
            return steps.StepReading(steps.scheduler_step(scheduler), steps.SCHEDULER)
        return self._clock.advance(steps.timestep_values(bound.get(self._adapter.timestep_argument)))

    def pre(self, module, args, kwargs):
        for m in self._checkpointing:
            call_context.preserve_context_in_checkpointing(m)
        if not self._bind or torch.compiler.is_compiling():
            # Inside a compiled region the step and the layout cannot be read (host values, ContextVar writes):
            # the sites see no step (only an explicit denoising_step()) and no layout, and say so when it matters.
            return None
        bound = self._signature.bind_partial(module, *args, **kwargs).arguments
        tokens = []
        if self._clock is not None:
            reading = self._step(bound)
            tokens.append((steps.MODEL_STEP, steps.MODEL_STEP.set(reading)))
            tokens.append((steps.MODEL_PHASE, steps.MODEL_PHASE.set(steps.phase_of(reading.step))))
            self._step_sources.add(steps.current_step().source)
        for var, value in self._adapter.capture(bound, self._backend):
            tokens.append((var, var.set(value)))
        _frames.set(_frames.get() + (tokens,))
        return None

    def post(self, module, args, output):
        if not self._bind or torch.compiler.is_compiling():
            return None
        frames = _frames.get()
        if not frames:
            return None
        _frames.set(frames[:-1])
        for var, token in reversed(frames[-1]):
            try:
                var.reset(token)
            except ValueError:  # set in another context: leave that context alone
                pass
        return None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for m in self._checkpointing:
            call_context.release_checkpointing(m)
