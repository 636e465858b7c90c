"""Quality tiers and the context-local tier in force.

Tiers nest: ``exact`` ⊂ ``lossless`` ⊂ ``high``. ``exact`` and ``lossless`` outputs are bit-identical to the
unpatched model; ``high`` admits approximate fast paths. The tier lives in a :class:`contextvars.ContextVar`, so
nested blocks restore the outer tier, exceptions restore it, and threads or asyncio tasks sharing one patched
pipeline each see their own tier.
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
from typing import Iterable, Iterator, Optional, Union

from accelpatch.core import call_context


class Tier(enum.IntEnum):
    """A quality tier; a larger value admits more (and less exact) fast paths."""

    EXACT = 0
    LOSSLESS = 1
    HIGH = 2

    def __str__(self) -> str:
        return self.name.lower()

    def admits(self, required: "Tier") -> bool:
        """True when a fast path that needs ``required`` may run under this tier."""
        return self >= required


DEFAULT_TIER = Tier.LOSSLESS
TIER_NAMES = tuple(str(t) for t in Tier)

_requested: contextvars.ContextVar[Optional[Tier]] = call_context.register(
    contextvars.ContextVar("accelpatch_quality", default=None))

TierLike = Union[str, Tier]


def parse_tier(value: TierLike) -> Tier:
    """Turn ``"exact"``/``"lossless"``/``"high"`` (any case) or a :class:`Tier` into a :class:`Tier`."""
    if isinstance(value, Tier):
        return value
    if isinstance(value, str):
        try:
            return Tier[value.strip().upper()]
        except KeyError:
            pass
    raise ValueError(f"unknown quality tier {value!r}; valid tiers are {', '.join(TIER_NAMES)} (exact ⊂ lossless ⊂ high)")


@contextlib.contextmanager
def quality(tier: TierLike) -> Iterator[Tier]:
    """Run the enclosed calls under ``tier``; the previous tier is restored on exit, also on exceptions.

    >>> with accelpatch.quality("high"):
    ...     video = pipe(prompt).frames
    """
    token = _requested.set(parse_tier(tier))
    try:
        yield _requested.get()
    finally:
        _requested.reset(token)


def requested_tier() -> Optional[Tier]:
    """The tier set by an enclosing :func:`quality` block in this context, or None outside any block."""
    return _requested.get()


def current_quality() -> str:
    """The tier set by the enclosing :func:`quality` block, as its name, or ``"lossless"`` (the default) outside
    any block. (``accelpatch.current_quality(pipe)`` answers for one model: see the public surface.)"""
    tier = _requested.get()
    return str(DEFAULT_TIER if tier is None else tier)


#: the tier read without a graph break under torch.compile: one graph per tier used, each thread/task its own
_read_requested = call_context.ContextReader(_requested)


def effective_tier(model_default: Tier = DEFAULT_TIER) -> Tier:
    """The tier a patched model runs under: the caller's :func:`quality` block, else the model's own default."""
    tier = _read_requested()
    return model_default if tier is None else tier


def offers_high(site_tiers: Iterable[TierLike], has_step_cache: bool) -> bool:
    """Whether ``quality("high")`` can run anything approximate on a model: one of its sites is a ``high`` fast path,
    or it has a step cache (the one rule, read by the patch at ``apply`` and by its report)."""
    return has_step_cache or any(parse_tier(tier) is Tier.HIGH for tier in site_tiers)
