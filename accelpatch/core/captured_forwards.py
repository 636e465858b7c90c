"""Bound forwards that hooks captured on a module instance: follow them at ``apply``, clean them at ``remove``.

accelerate (``add_hook_to_module``: ``_old_forward``), diffusers (``HookRegistry``: the first hook's
``forward``/``original_forward``) and plain ``m.forward = m.forward`` store the module's forward *bound at that
moment* on the instance, so a later ``__class__`` swap is bypassed. These are the *slots* handled here:

- at ``apply``, a slot holding the original class's bound forward is re-pointed at the gated forward (the hook now
  reaches the gate); the original value is remembered so ``remove`` can put it back;
- at ``remove``, every slot that holds the gated forward (re-pointed here, or captured by a hook added after
  ``apply``) gets the original class's bound forward again. Captures hidden in closures are out of reach; they keep
  working because the gated forward delegates to the original class's forward once the site is gone.

An instance ``forward`` that leads to no slot holding a bound forward of the module (a lambda, a partial over
another function) cannot be followed: :func:`follow` says why, and the site is rejected with that reason.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from accelpatch.core.gated_class import is_gated_forward, ungated_forward


@dataclass(eq=False)
class Slot:
    """One place that can hold a bound forward: a key of the module's ``__dict__`` or an attribute of an object."""

    holder: Any
    name: str

    def get(self) -> Any:
        if isinstance(self.holder, dict):
            return self.holder.get(self.name)
        return getattr(self.holder, self.name, None)

    def set(self, value: Any) -> None:
        if isinstance(self.holder, dict):
            self.holder[self.name] = value
        else:
            setattr(self.holder, self.name, value)


def slots(module: torch.nn.Module) -> Iterator[Slot]:
    """The slots of ``module`` that currently hold something."""
    state = module.__dict__
    for name in ("forward", "_old_forward"):  # plain rebinding / any hook's wrapper; accelerate's saved forward
        if name in state:
            yield Slot(state, name)
    registry = state.get("_diffusers_hook")
    for fn_ref in getattr(registry, "_fn_refs", ()) or ():
        for name in ("forward", "original_forward"):
            if getattr(fn_ref, name, None) is not None:
                yield Slot(fn_ref, name)


def _bound_to(value: Any, module: torch.nn.Module) -> bool:
    return inspect.ismethod(value) and value.__self__ is module


def follow(module: torch.nn.Module) -> tuple[list[tuple[Slot, Any]], Optional[str]]:
    """Re-point every slot holding the original class's bound forward at the (already swapped-in) gated forward.

    Returns ``(changed, reason)``: the slots changed with their previous values (for :func:`restore`), and why the
    instance's forward cannot be followed (None when it can, or when there is no instance forward at all)."""
    if "forward" not in module.__dict__:
        return [], None
    original = type(module).__dict__["_accelpatch_original_class"].forward
    changed: list[tuple[Slot, Any]] = []
    reaches_module = False
    for slot in slots(module):
        value = slot.get()
        if not _bound_to(value, module):
            continue
        reaches_module = True
        if value.__func__ is original:
            changed.append((slot, value))
            slot.set(type(module).forward.__get__(module))
    if reaches_module:
        return changed, None
    return [], (f"a hook replaced this module's forward with {value_name(module.__dict__['forward'])}, which "
                "accelpatch cannot follow to the module's own forward; apply accelpatch before adding that hook")


def restore(module: torch.nn.Module, changed: list[tuple[Slot, Any]]) -> None:
    """Undo :func:`follow`, and replace any other captured gated forward by the original class's bound forward.
    Runs after the module's class was restored."""
    for slot, previous in changed:
        if is_gated_forward(slot.get(), module):
            slot.set(previous)
    for slot in list(slots(module)):
        if is_gated_forward(slot.get(), module):
            slot.set(ungated_forward(module))


def value_name(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(getattr(value, "func", None), "__qualname__", None)
    return f"{type(value).__name__} {name}" if name else type(value).__name__
