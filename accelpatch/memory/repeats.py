"""Trace a repeated submodule call once: what lets a fake trace of a tiled or chunked VAE decode finish in seconds.

Why: a VAE that decodes in tiles and temporal chunks (MiniMax-H3's, diffusers' tiling of HunyuanVideo 1.5's) calls
its decoder tens to hundreds of times on inputs of the same layout; traced op by op that is about a million operators
and minutes on a CPU, where every call after the first adds nothing the plan needs but the bytes it leaves behind.
:class:`RepeatedCalls` traces a named submodule's first call of each input layout for real (on fake tensors) and
records how far above its starting point the live bytes went and what it returned; a later call with the same layout
adds that excursion to :class:`~accelpatch.memory.live_bytes.LiveBytes`' peak and returns fresh outputs of the
recorded layouts, without running the submodule. A call that leaves anything alive besides its outputs (a feature
cache, Wan's decoder) or returns a view of its input is not repeatable, and is traced every time. Only under a fake
mode: a real run is never shortened.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_unflatten

from accelpatch.memory.live_bytes import LiveBytes

_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _layout(value: Any) -> Any:
    """What a call's argument contributes to its key: a tensor's layout (never its values), a simple value itself;
    None for anything else (such a call is not repeatable)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, str(value.device),
                value.requires_grad)
    return ("value", value) if isinstance(value, _SIMPLE) else None


def _key(name: str, args: tuple, kwargs: dict) -> tuple[tuple, set]:
    """(a call's key: the name, the arguments' structure and layouts; the storages of its tensor arguments)."""
    leaves, spec = tree_flatten((args, kwargs))
    held = {StorageWeakRef(t.untyped_storage()).cdata for t in leaves if isinstance(t, torch.Tensor)}
    return (name, str(spec), tuple(_layout(leaf) for leaf in leaves)), held


class RepeatedCalls:
    """``with RepeatedCalls(live, {"decoder": vae.decoder}) as calls: vae.decode(latents)``: each named module's
    calls are traced once per input layout (see the module docstring); ``calls.traced`` and ``calls.repeated``
    count them per name, ``calls.not_repeatable`` names the modules found to keep state."""

    def __init__(self, live: LiveBytes, modules: dict[str, torch.nn.Module]) -> None:
        self.live = live
        self.modules = modules
        self.traced = {name: 0 for name in modules}
        self.repeated = {name: 0 for name in modules}
        self.not_repeatable: set[str] = set()
        self._records: dict[tuple, tuple[int, Any, list, str, str]] = {}

    def __enter__(self) -> "RepeatedCalls":
        self._stack = contextlib.ExitStack()
        for name, module in self.modules.items():
            self._stack.enter_context(self._wrapped(name, module))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    @contextlib.contextmanager
    def _wrapped(self, name: str, module: torch.nn.Module) -> Iterator[None]:
        had = "forward" in vars(module)
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, original, args, kwargs)

        module.forward = forward
        try:
            yield
        finally:
            if had:
                module.forward = original
            else:
                del module.forward

    def _call(self, name: str, original, args: tuple, kwargs: dict) -> Any:
        from torch._guards import detect_fake_mode

        # no reference to the arguments is kept while the module runs: a cache entry it replaces must be freed
        key, held = _key(name, args, kwargs)
        if detect_fake_mode() is None or name in self.not_repeatable or None in key[2]:
            self.traced[name] += 1
            return original(*args, **kwargs)
        record = self._records.get(key)
        if record is not None:
            return self._replay(name, record)
        return self._trace(name, key, held, original, args, kwargs)

    def _trace(self, name: str, key: tuple, held: set, original, args: tuple, kwargs: dict) -> Any:
        live = self.live
        live.release_freed()
        start, before, before_op, before_module = live.current, live.peak, live.peak_op, live.peak_module
        live.peak = start
        out = original(*args, **kwargs)
        live.release_freed()
        inside, inside_op, inside_module = live.peak, live.peak_op, live.peak_module
        if before >= inside:
            live.peak, live.peak_op, live.peak_module = before, before_op, before_module
        self.traced[name] += 1
        out_leaves, out_spec = tree_flatten(out)
        made: dict[int, int] = {}
        for leaf in out_leaves:
            if isinstance(leaf, torch.Tensor):
                ref, nbytes = StorageWeakRef(leaf.untyped_storage()).cdata, live.made_here(leaf)
                if ref in held or not nbytes:
                    self.not_repeatable.add(name)  # a view of an input, or of something made before the call
                    return out
                made[ref] = nbytes
            elif not isinstance(leaf, _SIMPLE):
                self.not_repeatable.add(name)
                return out
        if live.current - start != sum(made.values()):
            self.not_repeatable.add(name)  # it left something alive besides its outputs (a cache)
            return out
        layouts = [(tuple(t.shape), t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else ("value", t)
                   for t in out_leaves]
        self._records[key] = (inside - start, out_spec, layouts, inside_op, inside_module)
        return out

    def _replay(self, name: str, record: tuple) -> Any:
        excursion, spec, layouts, op, module = record
        live = self.live
        live.release_freed()
        self.repeated[name] += 1
        if live.current + excursion > live.peak:
            live.peak = live.current + excursion
            live.peak_op = f"{op} (in a repeated call of {name}, traced once)"
            live.peak_module = module
        outs = [torch.empty_strided(layout[0], layout[1], dtype=layout[2], device=layout[3])
                if layout[0] != "value" else layout[1] for layout in layouts]
        return tree_unflatten(outs, spec)


def submodules(model: torch.nn.Module, names: Iterable[str]) -> dict[str, torch.nn.Module]:
    """``{name: model.get_submodule(name)}`` for each of ``names`` (an error names a missing one and the model's
    children)."""
    found = {}
    for name in names:
        try:
            found[name] = model.get_submodule(name)
        except AttributeError:
            children = ", ".join(child for child, _ in model.named_children())
            raise AttributeError(f"{type(model).__name__} has no submodule {name!r} (its children: {children})") \
                from None
    return found
