"""Real values for the few small tensors a fake-tensor trace must read.

Why: under ``FakeTensorMode`` nothing has a value, so a forward that branches on a tensor (``if torch.all(x == 0)``)
or indexes with a boolean mask (``text[text_mask]``) cannot be traced: HunyuanVideo 1.5 reorders its text tokens by
their masks that way. :class:`ValueShadows` keeps a real copy (a "shadow") of each small tensor whose values are known
(the step's inputs, small factory results such as ``torch.ones``, and whatever an operator makes of tensors that
all have shadows) and answers such operations from the shadows. Large tensors (weights, activations) stay fake:
a shadow is kept only up to :data:`LIMIT` elements, so the trace still allocates nothing large.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
                                           unset_fake_temporarily)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

#: the most elements a shadow holds (4 MiB of float32)
LIMIT = 2 ** 20

_aten = torch.ops.aten
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_NO_VALUES = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
              _aten.new_empty.default, _aten.new_empty_strided.default}


class ValueShadows(TorchDispatchMode):
    """Enter inside ``fake_mode`` (``with fake_mode, ValueShadows(fake_mode) as shadows:``) and give it the
    inputs' real values with :meth:`know`; an operation that needs values then gets them from the shadows (or
    raises as before when one of its tensors has none)."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.shadows = WeakIdKeyDictionary()

    def know(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Record ``real`` as the values of ``fake`` (when it is small enough to keep)."""
        if real.numel() <= LIMIT:
            self.shadows[fake] = real

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEXING:
            args = (args[0], self._long_indices(args[1]), *args[2:])
        leaves, spec = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        known = all(t in self.shadows for t in tensors) and func not in _NO_VALUES and (
            tensors or torch.Tag.nondeterministic_seeded not in func.tags)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not known:
                raise
            real = self._real(func, leaves, spec)
            return tree_map(self._fake_of, real)
        if known and all(t.numel() <= LIMIT for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
            self._pair(out, self._real(func, leaves, spec))
        elif func._schema.is_mutable:  # written with values we do not know: forget what we knew
            for t in tensors:
                self.shadows.pop(t, None)
        return out

    def _real(self, func, leaves: list, spec) -> Any:
        real_args, real_kwargs = tree_unflatten(
            [self.shadows[t] if isinstance(t, torch.Tensor) else t for t in leaves], spec)
        with unset_fake_temporarily():
            return func(*real_args, **real_kwargs)

    def _fake_of(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        fake = self.fake_mode.from_tensor(value)
        self.know(fake, value)
        return fake

    def _pair(self, out: Any, real: Any) -> None:
        for fake, value in zip(tree_flatten(out)[0], tree_flatten(real)[0]):
            if isinstance(fake, torch.Tensor) and isinstance(value, torch.Tensor):
                self.know(fake, value)

    def _long_indices(self, indices: list) -> list:
        """Boolean index masks with known values as the long indices they select (``x[mask]`` then has a shape
        without values)."""
        result = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) and index in self.shadows:
                with unset_fake_temporarily():
                    positions = torch.nonzero(self.shadows[index]).unbind(1)
                result.extend(self._fake_of(p) for p in positions)
            else:
                result.append(index)
        return result
