"""The step clock: which denoising step a call belongs to, as seen by attention fast paths.

Through a pipeline, a pre-forward hook on the transformer reads the scheduler's ``step_index`` (None before the
first ``scheduler.step()``, i.e. step 0; ``set_timesteps`` resets it, so every pipeline call starts at 0). For
direct transformer calls, set it yourself::

    with accelpatch.denoising_step(i):
        model(**inputs)

An explicit ``denoising_step`` wins over the pipeline's clock. With neither, the step is 0.
"""
from __future__ import annotations

import contextlib
import contextvars
import numbers
from typing import Iterator, Optional

_explicit: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("accelpatch_explicit_step", default=None)
_from_pipeline: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("accelpatch_pipeline_step",
                                                                                default=None)


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


def current_denoising_step() -> int:
    """The step in force for the calling context (0 when nothing says otherwise)."""
    step = _explicit.get()
    if step is None:
        step = _from_pipeline.get()
    return 0 if step is None else step


def scheduler_step(scheduler) -> int:
    """A diffusers scheduler's 0-based step index; None (before the first ``step()``) means 0."""
    index = getattr(scheduler, "step_index", None)
    return 0 if index is None else int(index)


def enter_pipeline_step(step: int) -> contextvars.Token:
    return _from_pipeline.set(step)


def exit_pipeline_step(token: contextvars.Token) -> None:
    try:
        _from_pipeline.reset(token)
    except ValueError:  # reset from another context: leave the value there alone
        pass
