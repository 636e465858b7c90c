"""Weights quantised by torchao, weighed on the meta device (issue #44): torchao's own ``quantize_`` lays out each
linear layer's codes, scales and zero points on meta tensors as it would on real ones (one layer of each kind), so
the plan counts the bytes behind them without a weight or a kernel. torchao is optional: where it does not import, the plan says why."""
from __future__ import annotations

from typing import Union

__all__ = ["TORCHAO_CONFIGS", "torchao_quantised", "tensor_bytes"]

#: torchao's weight-only configurations the plan weighs, by the name the plan's options take
TORCHAO_CONFIGS = {"int8": "Int8WeightOnlyConfig", "fp8": "Float8WeightOnlyConfig"}


def torchao_quantised(model, kind: str) -> Union[tuple[int, int], str]:
    """(the bytes of ``model``, built on the meta device in its compute dtype, after torchao's
    ``quantize_(model, <kind>WeightOnlyConfig())``; its largest linear layer's weight as stored before, the one
    dequantised temporary a weight-only matmul may hold), or why it cannot be weighed.

    A weight-only config lays out each linear layer on its own, so one copy of each kind of layer (class, shape,
    bias, dtypes) is quantised and weighed for all of its kind: a 19B transformer's thousands of layers are a few
    dozen kinds (seconds saved per plan; tests compare it with quantising the whole model). ``model`` is left as it
    was."""
    import copy

    import torch

    from accelpatch.memory.live_bytes import storage_bytes

    try:
        from torchao import quantization
    except Exception as error:  # noqa: BLE001 - an optional dependency: the plan says why
        return f"torchao is not importable here ({type(error).__name__}: {error}); pip install torchao"
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    largest = max((m.weight.numel() * m.weight.element_size() for m in linears), default=0)
    kinds: dict[tuple, list] = {}
    weights: set[int] = set()
    for m in linears:
        if id(m.weight) in weights:  # tied to a layer already counted: quantize_ leaves the quantised one shared
            continue
        weights.add(id(m.weight))
        bias = getattr(m, "bias", None)
        key = (type(m), tuple(m.weight.shape), m.weight.dtype, m.weight.stride(),
               None if bias is None else (tuple(bias.shape), bias.dtype))
        kinds.setdefault(key, []).append(m)
    layers = [copy.deepcopy(group[0]) for group in kinds.values()]
    quantization.quantize_(torch.nn.ModuleList(layers), getattr(quantization, TORCHAO_CONFIGS[kind])())
    quantised = sum(len(group) * tensor_bytes([*layer.parameters(), *layer.buffers()])
                    for group, layer in zip(kinds.values(), layers))
    inside = {id(m) for m in linears}
    rest = [t for m in model.modules() if id(m) not in inside
            for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]
    return storage_bytes(rest) + quantised, largest


def tensor_bytes(tensors) -> int:
    """The bytes behind ``tensors``: a tensor subclass's (torchao's) inner tensors, each storage once."""
    from accelpatch.memory.live_bytes import storage_bytes

    plain = []

    def walk(tensor):
        if hasattr(tensor, "__tensor_flatten__") and type(tensor).__name__ not in ("Tensor", "Parameter"):
            for name in tensor.__tensor_flatten__()[0]:
                walk(getattr(tensor, name))
        else:
            plain.append(tensor)

    for tensor in tensors:
        walk(tensor)
    return storage_bytes(plain)
