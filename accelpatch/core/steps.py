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

Policies ask :func:`step_before` ("is this call before step N?"), which reads an interned :class:`StepPhase`
rather than the step itself: code compiled with ``torch.compile`` guards on what it reads, and a step read as an
int would recompile at every denoising step; a phase has as many values as there are thresholds, plus one.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import numbers
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from accelpatch.core import call_context

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

@dataclass(frozen=True, eq=False)
class StepPhase:
    """Where a step stands against ``domain``, the step thresholds of the policies in this process: ``before`` maps
    each of them to whether the step is below it. Interned (:func:`phase_of`): one object per distinct answer.

    A policy reads one threshold's entry, so compiled code guards on that entry alone (and on the domain): steps
    on the same side of *its* threshold share a graph, whatever other policies in the process registered."""

    known: bool
    before: dict
    domain: frozenset


_THRESHOLDS: set[int] = set()
_PHASES: dict[tuple, StepPhase] = {}
_PHASES_LOCK = threading.Lock()


def register_thresholds(*thresholds: int) -> None:
    """Make policies' step thresholds part of every phase computed from now on."""
    with _PHASES_LOCK:
        _THRESHOLDS.update(int(t) for t in thresholds if t > 0)


def phase_of(step: Optional[int]) -> StepPhase:
    """The interned phase of ``step`` (None: unknown) against the registered thresholds."""
    domain = frozenset(_THRESHOLDS)
    below = frozenset() if step is None else frozenset(t for t in domain if step < t)
    key = (step is not None, below, domain)
    phase = _PHASES.get(key)
    if phase is None:
        with _PHASES_LOCK:
            before = {t: t in below for t in sorted(domain)}
            phase = _PHASES.setdefault(key, StepPhase(step is not None, before, domain))
    return phase


_explicit: contextvars.ContextVar[Optional[int]] = call_context.register(
    contextvars.ContextVar("accelpatch_explicit_step", default=None))
_explicit_phase: contextvars.ContextVar[Optional[StepPhase]] = call_context.register(
    contextvars.ContextVar("accelpatch_explicit_step_phase", default=None))
#: set by a patched model's pre-forward hook for the duration of each call (see accelpatch.core.model_hooks)
MODEL_STEP: contextvars.ContextVar[StepReading] = call_context.register(
    contextvars.ContextVar("accelpatch_model_step", default=_UNKNOWN))
MODEL_PHASE: contextvars.ContextVar[Optional[StepPhase]] = call_context.register(
    contextvars.ContextVar("accelpatch_model_step_phase", default=None))


@contextlib.contextmanager
def denoising_step(step: int) -> Iterator[int]:
    """Declare that the enclosed transformer calls belong to denoising step ``step`` (0-based)."""
    if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 0:
        raise ValueError(f"denoising_step expects an int >= 0, got {step!r}")
    token = _explicit.set(int(step))
    phase_token = _explicit_phase.set(phase_of(int(step)))
    try:
        yield int(step)
    finally:
        _explicit_phase.reset(phase_token)
        _explicit.reset(token)


_read_explicit = call_context.ContextReader(_explicit)
_read_explicit_phase = call_context.ContextReader(_explicit_phase)
_read_model_step = call_context.ContextReader(MODEL_STEP, _UNKNOWN)
_read_model_phase = call_context.ContextReader(MODEL_PHASE)


def step_before(threshold: int) -> Optional[bool]:
    """Whether the calling context's step is < ``threshold`` (None when no step is known). Compile-friendly: reads
    the interned phase; only a threshold registered after the phase was made falls back to the step itself."""
    phase = _read_explicit_phase()
    if phase is None:
        phase = _read_model_phase()
    if phase is None or threshold not in phase.domain:
        step = current_step().step
        return None if step is None else step < threshold
    if not phase.known:
        return None
    return phase.before[threshold]


def first_steps_reason(first_steps: int, step_reason: str, unknown_reason: str) -> Optional[str]:
    """The one "keep the first steps exact" policy every fast path with such an option reads: ``step_reason`` while
    the calling context's step is < ``first_steps``, ``unknown_reason`` when no step is known (the policy cannot
    apply), None when the step allows the fast path (or ``first_steps`` <= 0)."""
    if first_steps <= 0:
        return None
    before = step_before(first_steps)
    if before is None:
        return unknown_reason
    return step_reason if before else None


def current_step() -> StepReading:
    """The step in force for the calling context and its source (step None: unknown)."""
    step = _read_explicit()
    if step is not None:
        return StepReading(step, EXPLICIT)
    return _read_model_step()


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
