"""GGUF weights weighed for the memory plan (issue #44): what a transformer loaded from a GGUF file holds, and what
its layers hold for a moment at each call.

diffusers loads a GGUF file (``from_single_file(..., quantization_config=GGUFQuantizationConfig(...))``) by keeping
each quantised tensor's bytes as they are in the file (``GGUFParameter``) in a ``GGUFLinear``, the file's F32/F16
tensors as ordinary parameters in the compute dtype, and a quantised tensor of a module the model keeps in float32
dequantised to float32; at every call each ``GGUFLinear`` dequantises its whole weight and casts it to the compute
dtype before its matmul. So a GGUF transformer costs its codes at rest, and while it runs, one layer's
dequantisation temporaries (4 to 10 bytes a weight, by type) beside the activations of that moment.

Two ways to weigh: by type (:func:`by_type`, :func:`type_weights`: every ``nn.Linear`` weight whose rows split into
the type's blocks stored in that type, as the common community files do), or from a file a user has
(:func:`file_types`: the file's own types and sizes, read from its header; no tensor data is read). What a step
holds while it runs: the planner's unpatched trace records, at each linear layer's call, the bytes alive when it
starts (:func:`~accelpatch.memory.live_bytes.linear_calls`); a GGUF layer there holds those, then its
dequantisation (:func:`dequantise_peak`: diffusers' own ``GGUFLinear`` traced on fake tensors, its weight a stand-in
of the codes' shape carrying the two attributes diffusers' dequantisation reads, since ``GGUFParameter`` cannot wrap
a fake tensor), then its cast weight beside its output (:func:`dequantise_extra`). One trace serves every type and
file. The ``gguf`` package is optional: where it does not import, the plan says why.
"""
from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Union

__all__ = ["GGUF_TYPES", "gguf_types", "by_type", "type_weights", "file_types", "dequantise_peak", "dequantise_extra"]

#: the GGUF types a plan with a budget weighs by type (the community files' most common high and low ones)
GGUF_TYPES = ("Q8_0", "Q4_K")

#: which GGUF type (a ``gguf.GGMLQuantizationType``) a linear layer's weight is stored in, by the layer's name and
#: its weight's shape (None: left as it is)
Types = Callable[[str, Any], Optional[Any]]


def gguf_types() -> Union[dict[str, Any], str]:
    """The GGUF quantisation types diffusers loads, by name ("Q8_0": the ``gguf`` enum member), or why there are
    none here."""
    try:
        from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES
    except Exception as error:  # noqa: BLE001 - an optional dependency: the plan says why
        return f"gguf is not importable here ({type(error).__name__}: {error}); pip install gguf"
    return {t.name: t for t in SUPPORTED_GGUF_QUANT_TYPES}


def _block(quant_type) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF type."""
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[quant_type]


def _codes_bytes(weight_shape, quant_type) -> int:
    values, size = _block(quant_type)
    return weight_shape[0] * (weight_shape[1] // values) * size


def _kept_in_float32(model) -> set[str]:
    """The names of ``model``'s parameters in the modules its class keeps in float32: diffusers' GGUF loader
    dequantises a quantised tensor it loads into one of them, to float32."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    return {name for name, _ in model.named_parameters() if any(k in name.split(".") for k in keep)}


def _linears(model) -> list[tuple[str, Any]]:
    """``model``'s linear layers that diffusers' GGUF loader can keep quantised (not those kept in float32)."""
    import torch

    kept = _kept_in_float32(model)
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and f"{name}.weight" not in kept]


def _eligible(model, types: Types) -> dict[str, tuple[Any, Any]]:
    """``model``'s linear layers ``types`` stores in GGUF, with their weight and type: those the loader can keep
    quantised whose rows split into their type's blocks."""
    found = {}
    for name, linear in _linears(model):
        quant_type = types(name, tuple(linear.weight.shape))
        if quant_type is not None and linear.weight.shape[1] % _block(quant_type)[0] == 0:
            found[name] = linear.weight, quant_type
    return found


def type_weights(model, types: Types) -> int:
    """The bytes of ``model`` (built on the meta device in its compute dtype) loaded with the layers ``types`` gives
    a type holding that type's codes."""
    from accelpatch.memory.live_bytes import module_bytes

    return module_bytes(model) + sum(_codes_bytes(weight.shape, quant_type) - weight.numel() * weight.element_size()
                                     for weight, quant_type in _eligible(model, types).values())


def _quant_type(kind: str):
    types = gguf_types()
    if isinstance(types, str):
        return types
    if kind not in types:
        raise ValueError(f"GGUF type must be one of {', '.join(sorted(types))}, got {kind!r}")
    return types[kind]


def by_type(kind: str) -> Union[Types, str]:
    """The :data:`Types` of a file whose every linear weight is ``kind`` (e.g. "Q4_K"), or why not."""
    quant_type = _quant_type(kind)
    if isinstance(quant_type, str):
        return quant_type
    return lambda name, shape: quant_type


def file_types(path: Union[str, Path], model, compute_dtype) -> Union[tuple[Types, int], str]:
    """(the :data:`Types` of the GGUF file at ``path`` for ``model``, the bytes diffusers' loader holds for it), or
    why not. Reads the file's header, not its tensors. Its quantised tensors (every type but F32 and F16, as the
    loader keeps them) count as stored, the rest of ``model`` (built on the meta device in the compute dtype) as
    loaded; a quantised tensor named as a parameter the model keeps in float32 is loaded dequantised to float32. A
    linear layer is given its tensor's type by name: the file's own names, or, in a file of the original checkpoint's
    names, those diffusers' loader converts them to (:func:`_loaded_names`); where neither matches, every layer is
    given the file's most common type. A file whose values do not add up to ``model``'s parameters (within 1 %) is of
    another model: said, not weighed."""
    import torch

    from accelpatch.memory.live_bytes import module_bytes

    types = gguf_types()
    if isinstance(types, str):
        return types
    from gguf import GGMLQuantizationType, GGUFReader

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no GGUF file at {str(path)!r}")
    try:
        tensors = GGUFReader(path).tensors
    except Exception as error:  # noqa: BLE001 - a file we cannot read is said, not raised from inside a plan
        return f"{path.name} is not a GGUF file gguf can read ({type(error).__name__}: {error})"
    plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
    unsupported = sorted({t.tensor_type.name for t in tensors if t.tensor_type not in plain
                          and t.tensor_type.name not in types})
    if unsupported:
        return f"{path.name} holds GGUF types diffusers does not load: {', '.join(unsupported)}"
    values = sum(int(t.n_elements) for t in tensors)
    parameters = sum(p.numel() for p in model.parameters())
    if abs(values - parameters) > 0.01 * parameters:
        return (f"{path.name} holds {values / 1e9:.3f}B values, this transformer {parameters / 1e9:.3f}B parameters: "
                "a file of another model (or another size of it)")
    kept = _kept_in_float32(model)
    linear_names = {name for name, _ in _linears(model)}
    loaded = {t.name: t.name for t in tensors}
    if not linear_names & {name.removesuffix(".weight") for name in loaded}:
        loaded = _loaded_names(model, tensors)
    quantised = [t for t in tensors if t.tensor_type not in plain and loaded.get(t.name) not in kept]
    size = torch.empty((), dtype=compute_dtype, device="meta").element_size()
    weights = module_bytes(model) - sum(int(t.n_elements) for t in quantised) * size + sum(
        int(t.n_bytes) for t in quantised)
    named = {loaded[t.name].removesuffix(".weight"): t.tensor_type for t in quantised if t.name in loaded}
    if not quantised:
        return lambda name, shape: None, weights
    common = Counter(t.tensor_type for t in quantised).most_common(1)[0][0]
    if linear_names & set(named):
        return lambda name, shape: named.get(name), weights
    return lambda name, shape: common, weights


def _loaded_names(model, tensors) -> dict[str, str]:
    """The name diffusers' single-file loader gives each of a GGUF file's ``tensors`` in ``model``'s class, by the
    file's name: the class's ``checkpoint_mapping_fn`` (what ``from_single_file`` runs on the checkpoint) run on meta
    stand-ins in the tensors' shapes. A renamed stand-in is the same object, so it keeps its tensor's name; one the
    mapping splits or reshapes is a new tensor and is left out, as are all where the class has no mapping or the
    mapping fails on the file."""
    import torch

    try:
        from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

        mapping = SINGLE_FILE_LOADABLE_CLASSES[type(model).__name__]["checkpoint_mapping_fn"]
        stand_ins = {t.name: torch.empty(tuple(int(d) for d in reversed(t.shape)), device="meta") for t in tensors}
        by_object = {id(v): name for name, v in stand_ins.items()}
        converted = mapping(checkpoint=dict(stand_ins), config=dict(model.config))
    except Exception:  # noqa: BLE001 - no mapping, or one this file does not suit: the caller's fallback
        return {}
    return {by_object[id(v)]: name for name, v in converted.items() if id(v) in by_object}


@functools.lru_cache(maxsize=256)
def dequantise_peak(out_features: int, in_features: int, quant_type, compute_dtype) -> int:
    """The most bytes diffusers' ``GGUFLinear`` creates while it dequantises an ``out_features`` x ``in_features``
    weight of ``quant_type`` and casts it to ``compute_dtype`` (its forward on one token, the token's output left
    out), traced on fake tensors: the layer's weight a uint8 tensor of the codes' shape carrying ``quant_type`` and
    ``as_tensor``, what diffusers' ``dequantize_gguf_tensor`` reads of a ``GGUFParameter``."""
    import torch
    from diffusers.quantizers.gguf.utils import GGUFLinear

    from accelpatch.memory.components import trace_mode
    from accelpatch.memory.live_bytes import LiveBytes

    values, size = _block(quant_type)
    with trace_mode(True):
        layer = GGUFLinear(in_features, out_features, bias=False, compute_dtype=compute_dtype, device="meta")
        codes = torch.empty(out_features, in_features // values * size, dtype=torch.uint8)
        codes.quant_type = quant_type
        codes.as_tensor = lambda: codes
        del layer._parameters["weight"]
        layer.__dict__["weight"] = codes
        token = torch.empty(1, in_features, dtype=compute_dtype)
        with torch.no_grad(), LiveBytes() as live:
            out = layer(token)
    return live.peak - out.numel() * out.element_size()


def dequantise_extra(calls, peak: int, model, types: Types, compute_dtype) -> int:
    """What the layers ``types`` stores in GGUF add to a step's peak of created bytes ``peak``: at each recorded
    linear call (``calls``: :func:`~accelpatch.memory.live_bytes.linear_calls` of the unpatched step) a GGUF layer
    holds the bytes alive when it starts plus the larger of its dequantisation (:func:`dequantise_peak`) and its
    weight cast to ``compute_dtype`` beside its output (as diffusers' ``GGUFLinear.forward_native`` does: dequantise,
    cast, then ``F.linear``); the largest of these over the peak, or 0."""
    import torch

    eligible = _eligible(model, types)
    size = torch.empty((), dtype=compute_dtype, device="meta").element_size()
    top = peak
    for name, shape, start, out in calls:
        if name in eligible:
            _, quant_type = eligible[name]
            top = max(top, start + max(dequantise_peak(*shape, quant_type, compute_dtype),
                                       shape[0] * shape[1] * size + out))
    return top - peak
