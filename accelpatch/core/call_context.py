"""What a patched model's sites may read during one call, captured so that a recomputation can see it again.

Sites decide per call from context-local state: the tier (:mod:`accelpatch.core.tiers`), the denoising step
(:mod:`accelpatch.core.steps`) and per-model captures such as MiniMax-H3's packed layout. Each of those lives in a
:class:`contextvars.ContextVar` registered here. Gradient checkpointing re-runs a block during ``backward()``, after
the forward's context is gone (and, on CUDA, in another thread): :class:`ContextPreservingCheckpoint` wraps a
model's ``_gradient_checkpointing_func`` so that every run of a checkpointed block, the recomputation included,
sees the snapshot taken when the block first ran. Calls made while recomputing are not counted again.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, TypeVar

_VARS: list[contextvars.ContextVar] = []
_recomputing: contextvars.ContextVar[bool] = contextvars.ContextVar("accelpatch_recomputing", default=False)


class ContextReader:
    """``var.get()`` in a form ``torch.compile`` traces without a graph break (Dynamo cannot call ``ContextVar.get``).

    The reader holds a slot-less probe object whose ``value`` is a property with the ContextVar's own (C) ``get``
    as its getter: Dynamo treats such a property as a C descriptor, reads it while tracing and guards on the object
    it got, and every entry into the compiled code reads it again in the caller's thread or task, so each context
    runs the graph traced for its own value. ``get`` receives the probe as its default argument, so the probe itself
    means "not set": the reader then returns ``default``."""

    __slots__ = ("_probe", "_default")

    def __init__(self, var: contextvars.ContextVar, default: Any = None) -> None:
        probe_class = type(f"_{var.name}_probe", (), {"__slots__": (), "value": property(var.get)})
        self._probe = probe_class()
        self._default = default

    def __call__(self) -> Any:
        value = self._probe.value
        return self._default if value is self._probe else value


_read_recomputing = ContextReader(_recomputing, False)

V = TypeVar("V", bound=contextvars.ContextVar)


def register(var: V) -> V:
    """Make ``var`` part of the snapshot a recomputation replays. Returns ``var``."""
    if var not in _VARS:
        _VARS.append(var)
    return var


Snapshot = tuple  # ((ContextVar, value), ...)


def snapshot() -> Snapshot:
    """The current values of every registered variable."""
    return tuple((var, var.get()) for var in _VARS)


@contextlib.contextmanager
def replay(saved: Snapshot, *, recomputing: bool = False) -> Iterator[None]:
    """Run the enclosed code with the variables as they were in ``saved``; restore them afterwards."""
    tokens = [(var, var.set(value)) for var, value in saved]
    tokens.append((_recomputing, _recomputing.set(recomputing)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def recomputing() -> bool:
    """True while a checkpointed block is being recomputed for ``backward()`` (counters skip those calls)."""
    return _read_recomputing()


class _ReplayingBlock:
    """Stands in for a checkpointed block: each run replays the snapshot taken when the block was handed to the
    checkpoint function; runs after the first are recomputations. Other attributes are the block's."""

    def __init__(self, block: Any, saved: Snapshot) -> None:
        self._block = block
        self._saved = saved
        self._runs = 0

    def _run(self, function: Callable, args: tuple, kwargs: dict) -> Any:
        self._runs += 1
        with replay(self._saved, recomputing=self._runs > 1):
            return function(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(self._block, args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(self._block.forward, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._block, name)


class ContextPreservingCheckpoint:
    """A model's gradient-checkpointing function, wrapped so that recomputation sees the forward's context."""

    def __init__(self, inner: Callable) -> None:
        self.inner = inner

    def __call__(self, block: Any, *args: Any, **kwargs: Any) -> Any:
        return self.inner(_ReplayingBlock(block, snapshot()), *args, **kwargs)

    def __repr__(self) -> str:
        return f"ContextPreservingCheckpoint({self.inner!r})"


CHECKPOINT_FUNC_ATTR = "_gradient_checkpointing_func"


def preserve_context_in_checkpointing(module: Any) -> None:
    """Wrap ``module``'s checkpointing function if gradient checkpointing is on and it is not wrapped yet (diffusers'
    ``enable_gradient_checkpointing`` may have replaced it since the last call)."""
    inner = module.__dict__.get(CHECKPOINT_FUNC_ATTR)
    if inner is not None and not isinstance(inner, ContextPreservingCheckpoint) and \
            getattr(module, "gradient_checkpointing", False):
        module.__dict__[CHECKPOINT_FUNC_ATTR] = ContextPreservingCheckpoint(inner)


def release_checkpointing(module: Any) -> None:
    """Undo :func:`preserve_context_in_checkpointing`."""
    wrapper = module.__dict__.get(CHECKPOINT_FUNC_ATTR)
    if isinstance(wrapper, ContextPreservingCheckpoint):
        module.__dict__[CHECKPOINT_FUNC_ATTR] = wrapper.inner
