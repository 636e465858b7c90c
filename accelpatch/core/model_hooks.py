"""Forward hooks on every patched transformer: what its sites need to know during one call.

Before each forward (a ``register_forward_pre_hook``): the step reading of :mod:`accelpatch.core.steps` (for adapters
with a step-based policy), the adapter's own captures (MiniMax-H3: the packed layout), and, when gradient
checkpointing is on, the context-preserving wrapper of :mod:`accelpatch.core.call_context` around the model's
checkpointing function. After each forward (``always_call``, so also when it raised) the values are reset.

torch runs ``always_call`` hooks for an ``Exception`` only: a ``KeyboardInterrupt`` (a user stopping a generation)
skips the reset and leaves the call's frame open in the caller's context, where it would outlive the call (in
Jupyter, the cell). A model's frame still open when the same model is called again belongs to a call that never
finished: the next call unwinds it first, eager or compiled (see :meth:`ModelForwardHooks.pre`).
"""
from __future__ import annotations

import collections
import contextvars
import inspect
import threading
import weakref
from typing import Any, Optional

import torch

from accelpatch.core import call_context, steps
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.core.torch_compat import is_exporting


#: the open calls' frames, innermost last: (owner id, [(var, token), ...]) each
_frames: contextvars.ContextVar[tuple] = contextvars.ContextVar("accelpatch_hook_frames", default=())


def _close(frame: tuple) -> None:
    for var, token in reversed(frame[1]):
        try:
            var.reset(token)
        except ValueError:  # set in another context: leave that context alone
            pass


def unwind_stale_frames(owner: int) -> int:
    """Close the frame of ``owner`` left open by an interrupted call, and every frame opened after it (innermost
    first, so each variable gets back the value it had before that call). Returns how many frames were closed."""
    frames = _frames.get()
    index = next((i for i, frame in enumerate(frames) if frame[0] == owner), None)
    if index is None:
        return 0
    for frame in reversed(frames[index:]):
        _close(frame)
    _frames.set(frames[:index])
    return len(frames) - index


def _unwind_while_tracing(ctx) -> None:
    """Run by Dynamo at trace time (``comptime``) in the caller's thread and context: close the model's stale frames,
    so that the rest of the call is traced against clean values. No graph break, also under ``fullgraph=True``. Every
    value a site reads is guarded, so a stale value met by a graph already compiled fails its guards, and the call is
    traced again, through here."""
    unwind_stale_frames(ctx.get_local("owner").as_python_constant())


#: mutated by the op below, so that compiled code keeps a call to it (an op with no effect would be dropped)
_UNWIND_MARK = torch.zeros((), dtype=torch.int64)


@torch.library.custom_op("accelpatch::unwind_stale_calls", mutates_args=("mark",))
def _unwind_at_run_time(mark: torch.Tensor, owner: int) -> None:
    """At every run of compiled code, in the caller's thread and context: close the model's stale frames. Needed
    where the pre-hook is compiled as its own frame (``torch.compile(model)``), whose graph is never traced again."""
    unwind_stale_frames(owner)


class StepSources:
    """Thread-safe tally of where each call's step came from, and of the steps of the latest pipeline call that a
    step-based policy kept on the reference, with why, in that call's own step numbers (``report()`` shows both)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        #: the latest call's number of steps (None: unknown) and {step: {reason: site calls}}
        self.total: Optional[int] = None
        self.dense: dict[int, collections.Counter] = {}
        self._last_step = -1

    def __getstate__(self) -> dict:
        return {"counts": collections.Counter(self.counts)}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.counts.update(state["counts"])

    def add(self, source: str) -> None:
        with self._lock:
            self.counts[source] += 1

    def note_dense(self, reason: str) -> None:
        """A site call that a step policy kept on the reference (eager code only: a compiled graph knows no step)."""
        if torch.compiler.is_compiling():
            return
        reading = steps.current_step()
        if reading.step is None:
            return
        with self._lock:
            if reading.step < self._last_step or reading.total != self.total:  # a new pipeline call
                self.dense, self.total = {}, reading.total
            self._last_step = reading.step
            self.dense.setdefault(reading.step, collections.Counter())[reason] += 1

    def latest_call(self) -> Optional[dict]:
        """``{"total": N or None, "steps": {step: {reason: n}}}`` of the latest call with a policy step, or None."""
        with self._lock:
            if not self.dense:
                return None
            return {"total": self.total, "steps": {k: dict(v) for k, v in sorted(self.dense.items())}}

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.dense, self.total, self._last_step = {}, None, -1


class ModelForwardHooks:
    """The pre/post forward hooks ``apply`` puts on a transformer; ``remove()`` takes them off."""

    def __init__(self, model: torch.nn.Module, patch: Any, pipeline: Optional[Any]) -> None:
        """``patch``: the model's accelpatch.core.patcher.ModelPatch (not imported: the patcher sits above the hooks)."""
        adapter, backend = patch.adapter, patch.backend
        self._signature = inspect.signature(type(model).forward)
        self._adapter = adapter
        self._backend = backend
        self._pipeline = weakref.ref(pipeline) if pipeline is not None else None
        uses_steps = adapter.uses_steps(backend, patch.options) or patch.features_use_steps()
        self._clock = steps.TimestepClock(adapter.timesteps.noise_level) if uses_steps else None
        self._counts = steps.register_counts(*adapter.step_thresholds(backend, patch.options))
        self._step_sources = patch.step_sources
        self._capture = adapter.capture_for(backend)
        self._bind = self._clock is not None or self._capture is not None
        self._checkpointing = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        self._patch = patch
        #: whether tier high can do anything on this model (read at the first call: the sites exist by then)
        self._high_path: Optional[bool] = None
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
            return steps.StepReading(steps.scheduler_step(scheduler), steps.SCHEDULER, steps.scheduler_total(scheduler))
        return self._clock.advance(steps.timestep_values(bound.get(self._adapter.timesteps.argument)))

    def _check_high(self) -> None:
        """A call under tier high on a model with no high fast path runs the lossless path: say so (once)."""
        if self._high_path is None:
            self._high_path = self._patch.has_high_path
        if not self._high_path and effective_tier(self._patch.default_tier) is Tier.HIGH:
            self._patch.say_high_does_nothing()

    def pre(self, module, args, kwargs):
        if not torch.compiler.is_compiling():
            self._check_high()
        for state in self._patch.attached.values():  # e.g. a split model: its ranks must agree before any collective
            before = getattr(state, "before_forward", None)
            if before is not None:
                before(module, args)
        for m in self._checkpointing:
            call_context.preserve_context_in_checkpointing(m)
        if not self._bind:
            return None
        if torch.compiler.is_compiling():
            # Inside a compiled region the step and the layout cannot be read (host values, ContextVar writes):
            # the sites see no step (only an explicit denoising_step()) and no layout, and say so when it matters.
            # A frame of this model still open here can only be an interrupted call's: close it while tracing (the
            # rest of this trace then reads clean values) and at every run (for frames compiled apart from this one).
            # An exported program runs outside accelpatch: nothing to close there.
            if not is_exporting():
                from torch._dynamo.comptime import comptime

                owner = id(module)
                comptime(_unwind_while_tracing)
                _unwind_at_run_time(_UNWIND_MARK, owner)
            return None
        unwind_stale_frames(id(module))
        bound = self._signature.bind_partial(module, *args, **kwargs).arguments
        tokens = []
        if self._clock is not None:
            reading = self._step(bound)
            tokens.append((steps.MODEL_STEP, steps.MODEL_STEP.set(reading)))
            steps.call_thresholds(self._counts, steps.current_step().total)  # fractions and tails of this call
            tokens.append((steps.MODEL_PHASE, steps.MODEL_PHASE.set(steps.phase_of(reading.step))))
            self._step_sources.add(steps.current_step().source)
        if self._capture is not None:
            for var, value in self._capture(bound):
                tokens.append((var, var.set(value)))
        _frames.set(_frames.get() + ((id(module), tokens),))
        return None

    def post(self, module, args, output):
        if not self._bind or torch.compiler.is_compiling():
            return None
        frames = _frames.get()
        if not frames:
            return None
        _frames.set(frames[:-1])
        _close(frames[-1])
        return None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for m in self._checkpointing:
            call_context.release_checkpointing(m)
