"""A weight wrapper like torchao's, GGUF's and quanto's tensors: a subclass whose storage is not its values, so
``data_ptr()`` is 0 and a native kernel reading that address reads address 0. Every op either unwraps it (a working
quantized-looking weight) or, ``opaque``, refuses (nothing but its own operations can read it)."""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map


class Wrapped(torch.Tensor):
    @staticmethod
    def __new__(cls, inner: torch.Tensor, opaque: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, strides=inner.stride())

    def __init__(self, inner: torch.Tensor, opaque: bool = False):
        self.inner, self.opaque = inner, opaque

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        wrapped = next(a for a in args if isinstance(a, Wrapped))
        if wrapped.opaque:
            raise NotImplementedError(f"{cls.__name__} does not implement {func}")
        if func is torch.ops.aten.detach.default:  # a Parameter of it stays a wrapper
            return Wrapped(args[0].inner.detach())

        def unwrap(a):
            return a.inner if isinstance(a, Wrapped) else a
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
