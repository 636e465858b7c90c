"""The step cache's state per calling context: each generation and CFG branch of each thread or task has its own
(diffusers keeps one per process), freed when its call ends; and the cache's counts for ``report()``."""
from __future__ import annotations

import contextvars
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from accelpatch.core.gate import SiteCounters

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
    #: the first known step of the generation: where this model's share of the pipeline call starts (0 for a model
    #: that runs every step; Wan 2.2's low-noise expert starts at the boundary step); warm-up counts from it
    first_step: Optional[int] = None
    #: the pipeline call the generation belongs to: a weak reference to its scheduler's ``timesteps`` (each call's
    #: ``set_timesteps`` makes new ones); None when the step does not come from a pipeline's scheduler
    call: Optional[weakref.ref] = None
    #: True once this model's share of the call is over (its final step ran, or another expert of the same pipeline
    #: took over) and its states were freed: the model's next call at another step starts a new generation
    done: bool = False

    def of_call(self, call: Any) -> bool:
        """Whether this key belongs to the pipeline call ``call`` (its scheduler's timesteps; see :func:`call_ref`)."""
        return call is not None and self.call is not None and self.call() is call


def call_ref(call: Any) -> Optional[weakref.ref]:
    """A weak reference to a pipeline call's token (None: no token, or one that takes no weak reference)."""
    try:
        return None if call is None else weakref.ref(call)
    except TypeError:
        return None


def _starts_generation(key: Optional[_CallKey], step: Optional[int], call: Any = None) -> bool:
    """Whether a call at ``step`` of the pipeline call ``call`` (its token, None: unknown) starts a new generation
    after the context's last call (``key``): the first call, an unknown step, another pipeline call, a step other than
    the last once this model's share of its call is over, step 0 after a call at another (or an unknown) step, or a
    step lower than the last."""
    if key is None or step is None:
        return True
    if call is not None and not key.of_call(call):
        return True
    if key.done:
        return step != key.step  # at the same step: a later CFG branch of the step that ended the share
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

    def drop(self, generation: int, up_to_branch: Optional[int] = None) -> None:
        """Forget every state of ``generation`` (its call is over or was abandoned); with ``up_to_branch``, only its
        CFG branches up to that one (a later branch may still run the same step)."""
        with self._lock:
            for key in [k for k in self._states
                        if k[0] == generation and (up_to_branch is None or k[1] <= up_to_branch)]:
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
        """diffusers' reset, which its pipelines run at the end of every call (``maybe_free_model_hooks`` ->
        ``reset_stateful_hooks``): forget the calling context's generation only, never another thread's or task's
        half-done one (a call in another context keeps its states; ours are freed by the call's own end and bounded
        by :data:`MAX_LIVE_GENERATIONS`). Outside any call, nothing is the caller's to forget."""
        key = self._key.get() if self._key is not None else None
        if key is not None:
            self.drop(key.generation)

    def clear(self) -> None:
        """Forget every context's states (``remove()``: the cache leaves the model)."""
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
