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

A policy's number of steps is a :class:`StepCount`: a count, or a fraction of *this call's* steps (``0.2`` or
``"20%"``: the first 20 % of 4 steps is 1 step, of 10 steps 2, of 50 steps 10, rounded up). A fraction needs the
call's number of steps, which the pipeline's scheduler gives (``num_inference_steps``) and
``denoising_step(i, total=N)`` states; where no source gives it, the policy cannot apply and says so.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import numbers
import re
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Optional, Union

from accelpatch.core import call_context

EXPLICIT = "denoising_step()"
SCHEDULER = "pipeline scheduler"
TIMESTEP = "timestep argument"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class StepReading:
    """A step and where it came from (``step`` is None when no source knew it), and the number of steps of the call
    it belongs to (``total``; None when the source does not tell)."""

    step: Optional[int]
    source: str
    total: Optional[int] = None


@dataclass(frozen=True)
class StepCount:
    """A number of denoising steps for a policy: ``count`` steps, or ``fraction`` (0 to 1) of this call's steps,
    rounded up; ``from_end``: counted from the last step back (a dense tail)."""

    count: Optional[int] = None
    fraction: Optional[float] = None
    from_end: bool = False

    @property
    def zero(self) -> bool:
        return not self.count and not self.fraction

    @property
    def needs_total(self) -> bool:
        """Whether this count means nothing without the call's number of steps."""
        return not self.zero and (self.fraction is not None or self.from_end)

    def of(self, total: Optional[int]) -> Optional[int]:
        """Steps out of ``total`` (None where a fraction meets an unknown total)."""
        if self.count is not None:
            return self.count if total is None else min(self.count, total)
        if total is None:
            return None
        return min(total, math.ceil(round(self.fraction * total, 9)))

    def threshold(self, total: Optional[int]) -> Optional[int]:
        """The step this count's policy compares calls with: steps before it (a head) or from it on (a tail)."""
        n = self.of(total)
        if n is None or (self.from_end and total is None):
            return None
        return total - n if self.from_end else n

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.fraction * 100:g}%"


StepCountLike = Union[StepCount, int, float, str]
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def step_count(value: StepCountLike, name: str = "steps") -> StepCount:
    """``value`` as a :class:`StepCount`: an int >= 0 (a count), a float from 0 to 1 (a fraction of the call's
    steps), or a percentage string ("20%"). ValueError naming ``name``, the value and the choices otherwise."""
    if isinstance(value, StepCount):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0:
        return StepCount(count=int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value <= 1:
        return StepCount(fraction=float(value))
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match is not None and float(match.group(1)) <= 100:
            return StepCount(fraction=float(match.group(1)) / 100)
        if value.strip().isdigit():
            return StepCount(count=int(value))
    raise ValueError(f"{name} must be a number of steps (an int >= 0), a fraction of this call's steps (a float from "
                     f"0 to 1, e.g. 0.2) or a percentage (e.g. '20%'), got {value!r}")


def normalize_step_count(value: StepCountLike, name: str = "steps") -> Union[int, float]:
    """``value`` checked and kept as a user writes it: an int (a count) or a float (a fraction; "20%" -> 0.2)."""
    count = step_count(value, name)
    return count.count if count.count is not None else count.fraction


def from_end(value: StepCountLike) -> StepCount:
    """``value`` counted from the last step back."""
    return replace(step_count(value), from_end=True)


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


def _register_thresholds(thresholds) -> None:
    """Make these step thresholds part of every phase computed from now on."""
    with _PHASES_LOCK:
        _THRESHOLDS.update(int(t) for t in thresholds if t is not None and t > 0)


def call_thresholds(counts: tuple, total: Optional[int]) -> None:
    """Register the thresholds the step counts ``counts`` stand for in a call of ``total`` steps (fractions and
    tails; fixed counts were registered by :func:`register_counts`)."""
    if total is not None:
        _register_thresholds(c.threshold(total) for c in counts if c.needs_total)


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
_explicit_total: contextvars.ContextVar[Optional[int]] = call_context.register(
    contextvars.ContextVar("accelpatch_explicit_total", default=None))
_explicit_phase: contextvars.ContextVar[Optional[StepPhase]] = call_context.register(
    contextvars.ContextVar("accelpatch_explicit_step_phase", default=None))
#: set by a patched model's pre-forward hook for the duration of each call (see accelpatch.core.model_hooks)
MODEL_STEP: contextvars.ContextVar[StepReading] = call_context.register(
    contextvars.ContextVar("accelpatch_model_step", default=_UNKNOWN))
MODEL_PHASE: contextvars.ContextVar[Optional[StepPhase]] = call_context.register(
    contextvars.ContextVar("accelpatch_model_step_phase", default=None))


#: the step-count policies of every patched model (registered at apply): an explicit step's phase covers them
_COUNTS: set = set()


@contextlib.contextmanager
def denoising_step(step: int, total: Optional[int] = None) -> Iterator[int]:
    """Declare that the enclosed transformer calls belong to denoising step ``step`` (0-based) of a call of
    ``total`` steps (None: not said; a policy given as a fraction of the steps then cannot apply)."""
    if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 0:
        raise ValueError(f"denoising_step expects an int >= 0, got {step!r}")
    if total is not None and (not isinstance(total, numbers.Integral) or isinstance(total, bool) or total <= step):
        raise ValueError(f"denoising_step's total must be an int above the step ({step}), or None; got {total!r}")
    token = _explicit.set(int(step))
    total_token = _explicit_total.set(None if total is None else int(total))
    call_thresholds(tuple(_COUNTS), total)
    phase_token = _explicit_phase.set(phase_of(int(step)))
    try:
        yield int(step)
    finally:
        _explicit_phase.reset(phase_token)
        _explicit_total.reset(total_token)
        _explicit.reset(token)


def register_counts(*counts: StepCountLike) -> tuple[StepCount, ...]:
    """Register policies' step counts: a fixed count's threshold now, those that need the call's number of steps per
    call (:func:`call_thresholds`; an explicit step's phase covers them too). Returns them as :class:`StepCount`."""
    counts = tuple(step_count(c) for c in counts)
    _register_thresholds(c.threshold(None) for c in counts if not c.needs_total)
    with _PHASES_LOCK:
        _COUNTS.update(c for c in counts if c.needs_total)
    return counts


_read_explicit = call_context.ContextReader(_explicit)
_read_explicit_total = call_context.ContextReader(_explicit_total)
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


def step_policy_reason(first: StepCountLike, step_reason: str, unknown_reason: str, *, last: StepCountLike = 0,
                       last_reason: str = "", total_reason: str = "") -> Optional[str]:
    """The one "keep some steps exact" policy every step-based fast path reads: ``step_reason`` in the ``first``
    steps of the call, ``last_reason`` in its ``last`` steps, ``unknown_reason`` when no step is known and
    ``total_reason`` when a fraction or a tail meets a call whose number of steps no source gives (the policy cannot
    apply); None when the step allows the fast path."""
    first, last = step_count(first), from_end(last)
    if first.zero and last.zero:
        return None
    total = current_step().total if (first.needs_total or last.needs_total) else None
    if (first.needs_total or last.needs_total) and total is None:
        return total_reason or unknown_reason
    head = first.threshold(total)
    if head:
        before = step_before(head)
        if before is None:
            return unknown_reason
        if before:
            return step_reason
    if not last.zero:
        before = step_before(last.threshold(total))
        if before is None:
            return unknown_reason
        if not before:
            return last_reason
    return None


def current_step() -> StepReading:
    """The step in force for the calling context, its source and its call's number of steps (step None: unknown)."""
    step = _read_explicit()
    if step is not None:
        return StepReading(step, EXPLICIT, _read_explicit_total())
    return _read_model_step()


def current_denoising_step() -> int:
    """The step in force for the calling context (0 when no source knows it)."""
    step = current_step().step
    return 0 if step is None else step


def scheduler_step(scheduler) -> int:
    """A diffusers scheduler's 0-based step index; None (before the first ``step()``) means 0."""
    index = getattr(scheduler, "step_index", None)
    return 0 if index is None else int(index)


def scheduler_total(scheduler) -> Optional[int]:
    """The number of denoising steps a diffusers scheduler was set up for, in the units of its ``step_index`` (one
    per ``step()``): the length of its ``timesteps`` (a second-order scheduler steps twice per inference step), else
    its ``num_inference_steps``; None when it tells neither."""
    try:
        total = len(scheduler.timesteps)
    except (AttributeError, TypeError):
        total = None
    if total:
        return total
    total = getattr(scheduler, "num_inference_steps", None)
    return int(total) if isinstance(total, numbers.Integral) and not isinstance(total, bool) and total > 0 else None


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
