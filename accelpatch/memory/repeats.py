"""Trace a repeated submodule call once: what lets a fake trace of a tiled or chunked VAE decode finish in seconds.

Why: a VAE that decodes in tiles and temporal chunks (MiniMax-H3's, diffusers' tiling of HunyuanVideo 1.5's) calls
its decoder tens to hundreds of times on inputs of the same layout; traced op by op that is about a million operators
and minutes on a CPU, where every call after the first adds nothing the plan needs but the bytes it leaves behind.
:class:`RepeatedCalls` traces a named submodule's first call of each input layout for real (on fake tensors) and
records how far above its starting point the live bytes went and what it returned; a later call with the same layout
adds that excursion to :class:`~accelpatch.memory.live_bytes.LiveBytes`' peak and returns fresh outputs of the
recorded layouts, without running the submodule. State kept in list arguments the caller owns counts as part of the
layout and of the result: Wan's decoder runs frame by frame and writes its feature cache (and the cache's index) into
two lists, so the entries' layouts are in the key and a replay writes fresh entries of the recorded layouts where the
traced call wrote its own. A call that leaves anything else alive (a cache of its own), frees something other than
the list entries it replaced, or returns or caches a view of its input is not repeatable, and is traced every time.
Python state a call changes without tensors (a counter) is not seen: a family names a submodule here only where a
test shows its decode planned the same traced once as traced every time. Only under a fake mode: a real run is
never shortened.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_unflatten

from accelpatch.memory.live_bytes import LiveBytes

_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _layout(value: Any) -> Any:
    """What a call's argument contributes to its key: a tensor's layout (never its values), a simple value itself;
    None for anything else (such a call is not repeatable)."""
    if isinstance(value, torch.Tensor):
        # not its storage offset: where a view starts changes no operator's allocation (Wan's decoder is called on
        # one frame of the latents after another)
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, str(value.device), value.requires_grad)
    return ("value", value) if isinstance(value, _SIMPLE) else None


def _key(name: str, args: tuple, kwargs: dict) -> tuple:
    """A call's key: the name, the arguments' structure and layouts."""
    leaves, spec = tree_flatten((args, kwargs))
    return name, str(spec), tuple(_layout(leaf) for leaf in leaves)


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
        key = _key(name, args, kwargs)
        if detect_fake_mode() is None or name in self.not_repeatable or None in key[2]:
            self.traced[name] += 1
            return original(*args, **kwargs)
        record = self._records.get(key)
        if record is not None:
            return self._replay(name, record, args, kwargs)
        return self._trace(name, key, original, args, kwargs)

    def _trace(self, name: str, key: tuple, original, args: tuple, kwargs: dict) -> Any:
        live = self.live
        live.release_freed()
        start, before, before_op, before_module = live.current, live.peak, live.peak_op, live.peak_module
        alive, serial = set(live._live), live.made
        lists = _lists(args, kwargs)
        entries = {place: [_identity(v) for v in values] for place, values in lists.items()}
        live.peak = start
        out = original(*args, **kwargs)
        live.release_freed()
        inside, inside_op, inside_module = live.peak, live.peak_op, live.peak_module
        if before >= inside:
            live.peak, live.peak_op, live.peak_module = before, before_op, before_module
        self.traced[name] += 1
        made = live.made_since(serial)
        out_leaves, out_spec = tree_flatten(out)
        outputs = _made_layouts(out_leaves, made)
        writes = {place: _written(values, entries[place], made) for place, values in lists.items()}
        old = {ref for refs in entries.values() for ref in refs if isinstance(ref, int)}
        if outputs is None or None in writes.values():
            self.not_repeatable.add(name)  # it returned or cached a view of an input, or something it did not make
            return out
        kept = {StorageWeakRef(leaf.untyped_storage()).cdata
                for leaf in [*out_leaves, *tree_flatten([lists[p] for p in writes])[0]] if isinstance(leaf, torch.Tensor)}
        if made - kept or (alive - set(live._live)) - old:
            self.not_repeatable.add(name)  # it left something alive elsewhere (its own cache), or freed it
            return out
        writes = {place: changes for place, changes in writes.items() if changes}
        self._records[key] = (inside - start, out_spec, outputs, writes, inside_op, inside_module)
        return out

    def _replay(self, name: str, record: tuple, args: tuple, kwargs: dict) -> Any:
        excursion, spec, layouts, writes, op, module = record
        live = self.live
        live.release_freed()
        self.repeated[name] += 1
        start, before = live.current, (live.peak, live.peak_op, live.peak_module)
        lists = _lists(args, kwargs)
        for place, changes in writes.items():  # entry by entry: each replaced one is freed as the module frees it
            target = lists[place]
            for index, layout in changes:
                if index >= len(target):
                    target.append(None)
                target[index] = _fresh(layout)
        outs = [_fresh(layout) for layout in layouts]
        live.release_freed()
        live.peak, live.peak_op, live.peak_module = before  # what the replay allocated stands for the call's
        if start + excursion > live.peak:
            live.peak = start + excursion
            live.peak_op = f"{op} (in a repeated call of {name}, traced once)"
            live.peak_module = module
        return tree_unflatten(outs, spec)


def _lists(args: tuple, kwargs: dict) -> dict[Any, list]:
    """The call's list arguments by place (position or keyword): the state a module may keep between calls in
    lists its caller owns (Wan's decoder writes its feature cache and the cache's index into two)."""
    places = {**dict(enumerate(args)), **kwargs}
    return {place: value for place, value in places.items() if type(value) is list}


def _identity(value: Any) -> Any:
    """A list entry before the call: its storage's key if a tensor (no reference kept), else the value."""
    return StorageWeakRef(value.untyped_storage()).cdata if isinstance(value, torch.Tensor) else ("value", value)


def _layout_of(tensor: torch.Tensor) -> tuple:
    return (tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device)


def _made_layouts(leaves: list, made: set) -> Optional[list]:
    """The output leaves' layouts (a value as itself), or None when one is not a tensor the call made or a plain
    value (a view of an input, of something made before the call, or an object). By serial, not by storage key:
    a key freed during the call (a replaced cache entry) can come back as a new storage's."""
    layouts = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            ref = StorageWeakRef(leaf.untyped_storage()).cdata
            if ref not in made:
                return None
            layouts.append(_layout_of(leaf))
        elif isinstance(leaf, _SIMPLE):
            layouts.append(("value", leaf))
        else:
            return None
    return layouts


def _written(values: list, before: list, made: set) -> Optional[list]:
    """What the call did to one list argument: [(index, the new entry's layout or ("value", v))] for each entry
    it changed; None when it shortened the list or put there a tensor it did not make."""
    if len(values) < len(before):
        return None
    changes = []
    for index, value in enumerate(values):
        now = _identity(value)
        if index < len(before) and now == before[index] and not isinstance(now, int):
            continue  # the same plain value
        if isinstance(now, int):
            if index < len(before) and now == before[index] and now not in made:
                continue  # the same tensor, untouched
            if now not in made:
                return None
            changes.append((index, _layout_of(value)))
        else:
            changes.append((index, now))
    return changes


def _fresh(layout: tuple) -> Any:
    """A new tensor of a recorded layout, or the recorded plain value."""
    if layout[0] == "value":
        return layout[1]
    return torch.empty_strided(layout[0], layout[1], dtype=layout[2], device=layout[3])


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
