"""What the step cache puts into diffusers' hook machinery: block classes registered for its cache hooks (with their
stream layout), the gated decision that stands in for FirstBlockCache's, and MagCache's gated head hook. Classes
made on first use pickle by name through this module's ``__getattr__``."""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from accelpatch.core import block_registry
from accelpatch.core.block_registry import Registrations

#: the block layout every single-stream family has: the hidden states alone (index 0), no second stream
SINGLE_STREAM = (0, None, "encoder_hidden_states")


@functools.lru_cache(maxsize=None)
def _stream_metadata_class():
    """diffusers' ``TransformerBlockMetadata`` whose argument reads follow its declared argument names: diffusers'
    FirstBlockCache and MagCache hooks ask for ``"encoder_hidden_states"`` by that fixed name, which on LTX-2's
    blocks is the text, not the second stream (``audio_hidden_states``). Made on first use; pickles by name."""
    from diffusers.hooks._helpers import TransformerBlockMetadata

    class StreamMetadata(TransformerBlockMetadata):
        def _get_parameter_from_args_kwargs(self, identifier: str, args=(), kwargs=None):
            names = {"hidden_states": self.hidden_states_argument_name,
                     "encoder_hidden_states": self.encoder_hidden_states_argument_name}
            return super()._get_parameter_from_args_kwargs(names.get(identifier, identifier), args, kwargs)

    StreamMetadata.__module__ = __name__
    StreamMetadata.__qualname__ = StreamMetadata.__name__ = "StreamMetadata"
    return StreamMetadata


def _register_block(block_class: type, registrations: Registrations, streams: tuple = SINGLE_STREAM) -> None:
    """Register the blocks' class with diffusers' block registry for as long as the model is patched (its cache
    hooks look blocks up by class, and read parameters by name from the class's forward): the original class, and
    the gated class ``block_class`` may be (a copy of the original's entry, see :mod:`accelpatch.core.block_registry`).
    ``streams`` = (output index of the hidden states, output index of the second stream or None, the forward
    argument the second stream enters by), as the family's adapter declares it. A class diffusers registers itself
    must agree (else ValueError naming both): its entry then serves as is."""
    from diffusers.hooks._helpers import TransformerBlockMetadata

    original = block_registry.original_of(block_class)
    hidden, second, argument = streams
    renamed = second is not None and argument != "encoder_hidden_states"
    existing = block_registry.entry(original)
    replace = False
    if existing is not None:
        found = (existing.return_hidden_states_index, existing.return_encoder_hidden_states_index,
                 existing.encoder_hidden_states_argument_name if existing.return_encoder_hidden_states_index
                 is not None else argument)
        agrees = found == streams and (not renamed or isinstance(existing, _stream_metadata_class()))
        if not block_registry.is_ours(original):
            if not agrees:
                raise ValueError(f"diffusers registers {original.__name__} for its cache hooks with (hidden states at "
                                 f"output {found[0]}, second stream at {found[1]}, argument {found[2]!r}); accelpatch "
                                 f"expects ({hidden}, {second}, {argument!r}): a diffusers version this adapter does "
                                 "not know")
        replace = not agrees
    metadata_class = _stream_metadata_class() if renamed else TransformerBlockMetadata
    metadata = metadata_class(return_hidden_states_index=hidden, return_encoder_hidden_states_index=second,
                              encoder_hidden_states_argument_name=argument if second is not None
                              else "encoder_hidden_states")
    registrations.register(original, metadata, replace=replace)
    if original is not block_class:
        registrations.mirror(block_class)


class _RemainingBlocksState:
    """The model-level cache state of one generation and branch (a model that exposes its own hook point)."""

    def __init__(self) -> None:
        self.head_block_residual: Optional[torch.Tensor] = None
        self.tail_residual: Optional[torch.Tensor] = None

    def reset(self) -> None:
        self.head_block_residual = self.tail_residual = None


def relative_change(residual: torch.Tensor, previous: torch.Tensor) -> float:
    """FirstBlockCache's measure: mean |residual - previous| over mean |previous|."""
    return float((residual - previous).abs().mean() / previous.abs().mean())


def _hooked_forward(block: torch.nn.Module):
    """The forward diffusers' registry (or :meth:`StepCache._own_block_forwards`) installed on ``block``: the one the
    registry's last hook wraps."""
    registry = block.__dict__.get("_diffusers_hook")
    return getattr(registry, "_accelpatch_installed_forward", None) if registry is not None else None


def _run_hooked(function_reference, module, *args, **kwargs):
    """A module forward through one diffusers hook (what diffusers' registry builds, without its closure)."""
    args, kwargs = function_reference.pre_forward(module, *args, **kwargs)
    output = function_reference.forward(*args, **kwargs)
    return function_reference.post_forward(module, output)


class _GatedDecision:
    """Stands in for FirstBlockCache's ``_should_compute_remaining_blocks`` on the head hook (picklable)."""

    def __init__(self, cache: Any, hook) -> None:
        self.cache, self.hook = cache, hook

    def __call__(self, residual: torch.Tensor) -> bool:
        return self.cache.decide(self.hook, residual)


@functools.lru_cache(maxsize=None)
def _gated_mag_head_class():
    """diffusers' MagCache head hook whose ``config`` is, per calling context, the real one or a never-skip copy.
    Made on first use (diffusers loads lazily); pickles by name through the module's ``__getattr__``."""
    from diffusers.hooks.mag_cache import MagCacheHeadHook

    class GatedMagCacheHeadHook(MagCacheHeadHook):
        @property
        def config(self):
            return self._never_skip if self._cache._blocked.get() is not None else self._config

        @config.setter
        def config(self, value):
            self._config = value

    GatedMagCacheHeadHook.__module__ = __name__
    GatedMagCacheHeadHook.__qualname__ = "GatedMagCacheHeadHook"
    return GatedMagCacheHeadHook


def __getattr__(name: str) -> Any:
    if name == "GatedMagCacheHeadHook":
        return _gated_mag_head_class()
    if name == "StreamMetadata":
        return _stream_metadata_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
