"""The step clock: which denoising step a transformer call belongs to, as seen by step-based policies.

A patched model's forward pre-hook reads the step for each call, from the first source that knows it:

1. ``with accelpatch.denoising_step(i):`` around the call (the user says so);
2. the pipeline's scheduler, when ``apply()`` was given the pipeline: ``scheduler.step_index`` (None before the
   first ``scheduler.step()``, i.e. step 0; ``set_timesteps`` resets it, so every pipeline call starts at 0);
3. the ``timestep`` the transformer receives (:class:`TimestepClock`), which works for a transformer patched alone
   inside any pipeline: a new step when the timestep changes, a new generation (step 0) when the noise level goes
   back up; calls with the same timestep (classifier-free guidance as two calls) are the same step.

When none of them knows, the step is *unknown*: :func:`current_step` says so, step-based policies cannot apply
(they warn once and say so in ``report()``), and :func:`current_denoising_step` reports 0.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from . import call_context

EXPLICIT = "denoising_step()"
SCHEDULER = "pipeline scheduler"
TIMESTEP = "timestep argument"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class StepReading:
    """A step and where it came from (``step`` is None when no source knew it)."""

    step: Optional[int]
    source: str


_UNKNOWN = StepReading(None, UNKNOWN)

_explicit: contextvars.ContextVar[Optional[int]] = call_context.register(
    contextvars.ContextVar("accelpatch_explicit_step", default=None))
#: set by a patched model's pre-forward hook for the duration of each call (see accelpatch.model_hooks)
MODEL_STEP: contextvars.ContextVar[StepReading] = call_context.register(
    contextvars.ContextVar("accelpatch_model_step", default=_UNKNOWN))


@contextlib.contextmanager
def denoising_step(step: int) -> Iterator[int]:
    """Declare that the enclosed transformer calls belong to denoising step ``step`` (0-based)."""
    if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 0:
        raise ValueError(f"denoising_step expects an int >= 0, got {step!r}")
    token = _explicit.set(int(step))
    try:
        yield int(step)
    finally:
        _explicit.reset(token)


def current_step() -> StepReading:
    """The step in force for the calling context and its source (step None: unknown)."""
    step = _explicit.get()
    if step is not None:
        return StepReading(step, EXPLICIT)
    return MODEL_STEP.get()


def current_denoising_step() -> int:
    """The step in force for the calling context (0 when no source knows it)."""
    step = current_step().step
    return 0 if step is None else step


def scheduler_step(scheduler) -> int:
    """A diffusers scheduler's 0-based step index; None (before the first ``step()``) means 0."""
    index = getattr(scheduler, "step_index", None)
    return 0 if index is None else int(index)


def timestep_values(timestep: Any) -> Optional[tuple[float, ...]]:
    """The values of a ``timestep`` argument (tensor or number) as floats; None when they cannot be read (absent,
    or a tensor without data such as one on the meta device)."""
    if timestep is None or isinstance(timestep, bool):
        return None
    if isinstance(timestep, numbers.Real):
        return (float(timestep),)
    try:
        values = timestep.detach().flatten().tolist()
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return None
    return tuple(float(v) for v in values) or None


_clock_states: contextvars.ContextVar[dict] = contextvars.ContextVar("accelpatch_timestep_clocks", default={})
_clock_ids = itertools.count()


class TimestepClock:
    """Counts denoising steps from the timesteps one model receives, separately in each thread and asyncio task.

    ``noise_level(values)`` maps a call's timestep values to how noisy the call's input is (larger = noisier); it
    is the model's convention (SANA-Video: ``max(t)`` on 0-1000; MiniMax-H3: ``1 - min(t)``, where 1 means clean).
    """

    def __init__(self, noise_level: Callable[[tuple[float, ...]], float]) -> None:
        self._noise_level = noise_level
        self._id = next(_clock_ids)

    def __getstate__(self) -> dict:
        return {"_noise_level": self._noise_level}

    def __setstate__(self, state: dict) -> None:
        self._noise_level = state["_noise_level"]
        self._id = next(_clock_ids)  # a copy counts on its own

    def advance(self, values: Optional[tuple[float, ...]]) -> StepReading:
        """The step of a call with these timestep values (None: unknown), updating the clock."""
        if values is None:
            return _UNKNOWN
        states = _clock_states.get()
        level = self._noise_level(values)
        previous = states.get(self._id)
        if previous is None:
            step = 0
        else:
            last_values, last_step, last_level = previous
            if values == last_values:
                step = last_step
            elif level > last_level:
                step = 0  # noisier than the last call: a new generation
            else:
                step = last_step + 1
        _clock_states.set({**states, self._id: (values, step, level)})  # copy on write: tasks never share state
        return StepReading(step, TIMESTEP)
