"""The fused ops' kernels and reference chains reached by op name, for the kernel tests that sweep ops by name.

The package joins nothing by name (each op's file registers its kernels on its FusedOp); names map to ops only in
the registry pickles use, ``verify.ops()``, which is what these read: ``CPU.modulate(x, scale, shift)`` is the
registered CPU kernel of MODULATE, ``CPU.unsupported("modulate", ...)`` its reason, ``REFERENCE.modulate`` its chain
(and ``REFERENCE.rotate_half`` and the other one-tensor parts, from ``kernels/reference.py``)."""
from __future__ import annotations

import accelpatch.lossless.ops  # noqa: F401 - registers the package's ops
from accelpatch.lossless.kernels import reference as _parts
from accelpatch.lossless.verify import ops


class _Kernels:
    def __init__(self, device_type: str) -> None:
        self._device_type = device_type

    def unsupported(self, name: str, *args):
        return ops()[name].unsupported(self._device_type, *args)

    def __getattr__(self, name: str):
        op = ops().get(name)
        if op is None or self._device_type not in op.kernels:
            raise AttributeError(f"no op {name!r} with a {self._device_type} kernel")
        return op.kernels[self._device_type].run


class _References:
    def __getattr__(self, name: str):
        op = ops().get(name)
        return op.reference if op is not None else getattr(_parts, name)


CPU = _Kernels("cpu")
TRITON = _Kernels("cuda")
REFERENCE = _References()
