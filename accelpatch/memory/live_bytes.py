"""The peak of live tensor bytes of a block of torch code, on real tensors or fake ones.

Why: memory decides whether a video renders at all, and under ``FakeTensorMode`` a model runs at its released size
with shapes and no storage, so the same counter that measures a tiny real run plans a full-size one on a CPU
(``../shared/reference/memory.md``). It counts what the block *creates*: each new storage an operator returns
(not a view of, or an in-place write into, one of its inputs) from the op that returns it until it is freed. Weights
and inputs that existed before the block are not counted (the planner adds them), nor meta tensors (shapes worked out
on the meta device, here or by a fake trace, hold no memory). Kernels' internal workspace and
an allocator's caching and fragmentation are not seen: the figure is the live tensors' bytes.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


_EXPIRED = torch.UntypedStorage._expired  # StorageWeakRef.expired() without its wrappers


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: model(**inputs)``: ``live.peak`` is the most bytes of tensors created in the
    block that were alive at once (checked after every operator), ``live.current`` those still alive now,
    ``live.peak_op`` the operator at which the peak was reached. Storages are keyed by identity, so a view or an
    in-place result is not counted twice; a storage is released when torch frees it (a weak reference)."""

    def __init__(self, modules: bool = False) -> None:
        super().__init__()
        self.peak = self.current = self.ops = 0
        self.peak_op = ""
        #: with ``modules=True``: the innermost module running when the peak was reached ("blocks.3.ffn.net.0")
        self.peak_module = ""
        #: each live storage created in the block: its weak reference, its bytes and its serial (the count of
        #: storages created before it, :attr:`made`)
        self._live: dict[int, tuple[StorageWeakRef, int, int]] = {}
        self.made = 0
        self._tracker = None
        if modules:
            from torch.utils.module_tracker import ModuleTracker

            self._tracker = ModuleTracker()

    def __enter__(self):
        if self._tracker is not None:
            self._tracker.__enter__()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.release_freed()
        held = {StorageWeakRef(t.untyped_storage()).cdata for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue  # a meta tensor (a layout worked out, even under a fake mode) holds no memory anywhere
            storage = t.untyped_storage()
            ref = StorageWeakRef(storage)
            if ref.cdata in held or ref.cdata in self._live:
                continue  # a view of, or written into, something already there
            nbytes = storage.nbytes()
            self._live[ref.cdata] = (ref, nbytes, self.made)
            self.made += 1
            self.current += nbytes
        if self.current > self.peak:
            self.peak, self.peak_op = self.current, str(func)
            if self._tracker is not None:
                self.peak_module = max(self._tracker.parents, key=len, default="")
        return out

    def release_freed(self) -> None:
        """Bring ``current`` up to date with the storages torch has freed since the last operator (torch's own
        expiry check on each key: it runs after every operator, and StorageWeakRef.expired's two Python calls were
        a tenth of a plan's time)."""
        expired = _EXPIRED
        for key in [key for key in self._live if expired(key)]:
            self.current -= self._live.pop(key)[1]

    def made_since(self, serial: int) -> set[int]:
        """The keys of the live storages created after the first ``serial`` ones (``made`` read earlier)."""
        return {key for key, (_, _, made) in self._live.items() if made >= serial}

    def __exit__(self, *exc: Any):
        result = super().__exit__(*exc)
        if self._tracker is not None:
            self._tracker.__exit__(*exc)
        self.release_freed()
        return result


@contextlib.contextmanager
def linear_calls(live: LiveBytes, model: torch.nn.Module):
    """``with linear_calls(live, model) as calls:``: each call of one of ``model``'s ``nn.Linear`` layers inside
    appends (the layer's name, its weight's shape, the bytes ``live`` counts as created and alive when the call
    starts, its output's bytes): where a layer that allocates more than its output while it runs (a GGUF layer
    dequantising its weight) would raise the peak."""
    calls: list = []
    starts: dict = {}

    def enter(name, module, args):
        live.release_freed()
        starts[name] = live.current

    def leave(name, module, args, out):
        calls.append((name, tuple(module.weight.shape), starts.pop(name), out.numel() * out.element_size()))

    handles = [h for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               for h in (m.register_forward_pre_hook(functools.partial(enter, name)),
                         m.register_forward_hook(functools.partial(leave, name)))]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def storage_bytes(tensors) -> int:
    """The bytes of the storages behind ``tensors``, each storage once (views and tied weights count once); on the
    meta device or under a fake mode too, where nothing is allocated."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen.setdefault(StorageWeakRef(storage).cdata, storage.nbytes())
    return sum(seen.values())


def module_bytes(module: torch.nn.Module) -> int:
    """The bytes of ``module``'s parameters and buffers (:func:`storage_bytes`)."""
    return storage_bytes([*module.parameters(), *module.buffers()])
