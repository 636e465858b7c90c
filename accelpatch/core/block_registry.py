"""diffusers' ``TransformerBlockRegistry`` entries for accelpatch's gated block classes, held while a model is patched.

diffusers' block hooks (FirstBlockCache, MagCache, layer skip) look a block's metadata up by the block's exact
class. A block accelpatch patched has a gated subclass as its class, which the registry does not know: so
``transformer.enable_cache(FirstBlockCacheConfig(...))`` refused a patched Wan ("GatedWanTransformerBlock not
registered") that it accepts unpatched. Here each gated class whose original class is registered gets a copy of the
original's entry, and the classes accelpatch registers for its own step cache (SANA-Video's, MiniMax-H3's blocks)
get theirs, for as long as a patched model holds them: each model's :class:`Registrations` holds its classes, and
``remove()`` releases them. An entry goes when its last holder lets go, and only if it is still accelpatch's (an
entry diffusers or the user put there is never touched).
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

import torch

#: class -> [the entry accelpatch registered, how many holders]
_HELD: dict[type, list] = {}
_LOCK = threading.RLock()


def _registry():
    from diffusers.hooks._helpers import TransformerBlockRegistry

    TransformerBlockRegistry._register()  # diffusers' own entries first, so that they are never mistaken for ours
    return TransformerBlockRegistry


def entry(block_class: type) -> Any:
    """The registry's entry for ``block_class`` (None when it has none)."""
    return _registry()._registry.get(block_class)


def is_ours(block_class: type) -> bool:
    """Whether ``block_class``'s entry is one accelpatch registered."""
    with _LOCK:
        held = _HELD.get(block_class)
        return held is not None and entry(block_class) is held[0]


def original_of(block_class: type) -> type:
    """The class a gated class was made from (``block_class`` itself when it is not gated)."""
    return block_class.__dict__.get("_accelpatch_original_class", block_class)


class Registrations:
    """The registry entries one patched model holds, until ``release()`` (``remove()``) or until ``owner`` is
    garbage-collected unremoved. Copies and unpickled patches hold them again (in another process the registry
    starts without them), until they are released."""

    def __init__(self, owner: Any = None) -> None:
        self._held: list[type] = []
        self._finalizer = weakref.finalize(owner, self.release) if owner is not None else None

    def register(self, block_class: type, metadata: Any, *, replace: bool = False) -> None:
        """Hold ``block_class``'s entry: ``metadata`` becomes it when the class has none (or, with ``replace``,
        when it has accelpatch's); an entry someone else made is left as it is and not held."""
        registry = _registry()
        with _LOCK:
            current = registry._registry.get(block_class)
            held = _HELD.get(block_class)
            ours = held is not None and current is held[0]
            if current is not None and not ours:
                return
            if current is None or replace:
                registry.register(block_class, metadata)
                if ours:
                    held[0] = metadata
                else:
                    held = _HELD[block_class] = [metadata, 0]
            held[1] += 1
            self._held.append(block_class)

    def mirror(self, gated_class: type) -> None:
        """Hold an entry for ``gated_class`` copied from its original class's, when that class has one (diffusers'
        hooks read argument positions from ``_cls.forward``: a gated forward carries the original's signature)."""
        original = original_of(gated_class)
        metadata = entry(original) if original is not gated_class else None
        if metadata is None:
            return
        current = entry(gated_class)
        copy = dataclasses.replace(metadata, _cls=None, _cached_parameter_indices=None)
        self.register(gated_class, copy, replace=current is not None and _differs(current, metadata))

    def mirror_modules(self, model: torch.nn.Module) -> None:
        """:meth:`mirror` every gated class among ``model``'s modules."""
        for cls in {type(m) for m in model.modules() if "_accelpatch_original_class" in type(m).__dict__}:
            self.mirror(cls)

    def release(self) -> None:
        """Let go of every entry this model holds; an entry nobody holds any more leaves the registry."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if not self._held:
            return
        registry = _registry()
        with _LOCK:
            while self._held:
                block_class = self._held.pop()
                held = _HELD.get(block_class)
                if held is None:
                    continue
                held[1] -= 1
                if held[1] <= 0:
                    del _HELD[block_class]
                    if registry._registry.get(block_class) is held[0]:
                        del registry._registry[block_class]

    def __getstate__(self) -> dict:
        return {"held": [(cls, entry(cls)) for cls in self._held]}

    def __setstate__(self, state: dict) -> None:
        self._held, self._finalizer = [], None
        for block_class, metadata in state["held"]:
            if metadata is not None:
                self.register(block_class, metadata)


def _differs(mirror: Any, original: Any) -> bool:
    """Whether a gated class's entry no longer says what its original's says (the original was re-registered)."""
    fields = ("return_hidden_states_index", "return_encoder_hidden_states_index", "hidden_states_argument_name",
              "encoder_hidden_states_argument_name")
    return type(mirror) is not type(original) or any(getattr(mirror, f) != getattr(original, f) for f in fields)
