"""Helpers of ``test_works_with.py``: the tiny bf16 models, the tools people put on big video models (each a function
that applies it to a transformer in place), and the checks every combination must pass: bit-identical outputs, a
``remove()`` back to the same bits, unchanged weights (SHA-256 of the plain tensors behind every state-dict entry)
and the declined fused ops named in ``report()``."""
from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import warnings
import weakref
from typing import Callable, Optional

import pytest
import torch

import accelpatch
from accelpatch import testing as T

#: family -> (builder, inputs builder)
FAMILIES = {
    "sana_video": (T.tiny_sana_video_transformer, T.sana_video_transformer_inputs),
    "wan": (T.tiny_wan_transformer, functools.partial(T.wan_transformer_inputs, num_frames=2, height=8, width=8)),
    "sana_video2": (T.tiny_sana_video2_transformer, T.sana_video2_transformer_inputs),
    "minimax_h3": (T.tiny_minimax_h3_transformer, T.minimax_h3_transformer_inputs),
}
_INPUTS: dict[str, dict] = {}


def build(family: str, config=None) -> torch.nn.Module:
    """The family's tiny transformer in bf16 (same seed: same weights every time)."""
    builder = FAMILIES[family][0]
    return builder(config, dtype=torch.bfloat16) if config is not None else builder(dtype=torch.bfloat16)


def inputs(family: str) -> dict:
    """One bf16 input per family, built once."""
    if family not in _INPUTS:
        _INPUTS[family] = FAMILIES[family][1](build(family))
    return _INPUTS[family]


def forward(model: torch.nn.Module, family_or_inputs) -> torch.Tensor:
    kwargs = inputs(family_or_inputs) if isinstance(family_or_inputs, str) else family_or_inputs
    with torch.no_grad():
        return model(**kwargs).sample


#: transformer -> diffusers' block-registry entries accelpatch held just before the test applied it
_HELD_BEFORE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def held_entries(collect: bool = False) -> dict[type, int]:
    """How many patched models hold each class accelpatch registered in diffusers' block registry (other tests'
    models that are still alive, such as one a failed test's traceback keeps, hold theirs); ``collect`` first lets
    the garbage collector release what unreachable models hold."""
    from accelpatch.core import block_registry

    if collect:
        gc.collect()
    with block_registry._LOCK:
        return {cls: held[1] for cls, held in block_registry._HELD.items()}


def _within(now: dict, before: dict) -> bool:
    """Nothing held now that was not held before (what other models held since may only have gone)."""
    return all(n <= before.get(cls, 0) for cls, n in now.items())


def apply(target, **kwargs):
    """``accelpatch.apply`` without the CPU box's expected "not mounted: CUDA is unavailable" warnings; remembers
    the registry entries held before, for :func:`assert_unpatched`."""
    from accelpatch.core.patcher import transformers_of

    for model in transformers_of(target):
        _HELD_BEFORE.setdefault(model, held_entries())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(not mounted|CUDA).*", category=RuntimeWarning)
        return accelpatch.apply(target, **kwargs)


def need(module: str):
    """The optional package ``module`` (a guard: the tests of a tool skip where it is not installed)."""
    return pytest.importorskip(module)


# -- weights -----------------------------------------------------------------------------------------------------

def _plain_parts(tensor: torch.Tensor, name: str = ""):
    """The plain tensors behind ``tensor``: itself, or a tensor subclass's inner tensors (torchao's
    ``__tensor_flatten__``), or a subclass's own storage viewed as a plain tensor (GGUF's ``GGUFParameter``)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        for inner in names:
            yield from _plain_parts(getattr(tensor, inner), f"{name}.{inner}")
        return
    with torch._C.DisableTorchFunctionSubclass():
        yield name, tensor.detach().cpu().contiguous().reshape(-1)


def sha256(tensor: torch.Tensor) -> str:
    digest = hashlib.sha256()
    for name, part in _plain_parts(tensor):
        digest.update(f"{name}|{part.dtype}|{part.numel()}|".encode())
        with torch._C.DisableTorchFunctionSubclass():
            digest.update(part.view(torch.uint8).numpy().tobytes())
    return f"{tuple(tensor.shape)} {tensor.dtype} {digest.hexdigest()}"


def weights(model: torch.nn.Module) -> dict[str, str]:
    """SHA-256 of every state-dict entry (the plain tensors behind it), by key."""
    return {key: sha256(value) for key, value in model.state_dict().items()}


def saved_files(model: torch.nn.Module, folder, **kwargs) -> dict[str, str]:
    """``save_pretrained`` into ``folder``: SHA-256 of each file written, by name."""
    model.save_pretrained(folder, **kwargs)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


# -- the report ----------------------------------------------------------------------------------------------------

def op_outcomes(target, op: str) -> dict[str, int]:
    """One lossless fused op's calls on every site, by outcome ("ran" or the reason the reference ran)."""
    out: dict[str, int] = {}
    for site in accelpatch.report(target).sites:
        for outcome, n in site.fused_ops.get(op, {}).items():
            out[outcome] = out.get(outcome, 0) + n
    return out


def module_runs_reasons() -> tuple[str, ...]:
    """The generic reason a fused op counts when the module it stands in for runs itself (accelpatch.lossless.verify)."""
    verify = importlib.import_module("accelpatch.lossless.verify")
    return tuple(r for r in (getattr(verify, "MODULE_RUNS", None),) if r)


def assert_ran_itself(target, op: str, calls: int, names: tuple[str, ...], hooked: bool = False) -> None:
    """Every one of the ``calls`` calls of ``op`` ran the module itself, counted with a reason naming the layer's
    class (a wrapped or quantized layer: one of ``names``), or, for a ``hooked`` layer of torch's own class,
    accelpatch's reason for hooks."""
    outcomes = op_outcomes(target, op)
    assert sum(outcomes.values()) == calls, outcomes
    for reason in outcomes:
        assert (hooked and reason in module_runs_reasons()) or any(n in reason for n in names), (op, reason)


def assert_never_fused(target, op: str) -> None:
    """``op`` ran, and never fused: it stood in for layers whose weights it cannot read (a quantized tensor
    subclass) and each call counts the reason it ran the reference, whatever the CPU."""
    outcomes = op_outcomes(target, op)
    assert outcomes and "ran" not in outcomes, outcomes
    assert all(o.startswith(("not applicable:", "declined:")) for o in outcomes), outcomes


def assert_unpatched(model: torch.nn.Module, like: Optional[torch.nn.Module] = None) -> None:
    """No module keeps a gated class, and diffusers' block registry holds what it held before the test applied
    ``model`` (or ``like``, the model it was copied from): ``remove()`` let go of what the patch registered (a
    patched model dropped without ``remove()`` lets go of its entries when it is collected), whatever other live
    models hold. No entry of a gated class is left that no patched model holds."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    from accelpatch.core import block_registry

    assert not [m for m in model.modules() if "_accelpatch_original_class" in type(m).__dict__]
    before = _HELD_BEFORE[like if like is not None else model]
    now = held_entries()
    if not _within(now, before):  # unreachable models of earlier tests may have been holding entries: collect
        now = held_entries(collect=True)
    assert _within(now, before), (now, before)
    orphans = [c for c in TransformerBlockRegistry._registry
               if "_accelpatch_original_class" in c.__dict__ and c not in block_registry._HELD]
    assert not orphans, orphans


# -- the tools -------------------------------------------------------------------------------------------------------

def torchao(config_name: str) -> Callable[[torch.nn.Module], None]:
    def tool(model):
        quantization = need("torchao.quantization")
        quantization.quantize_(model, getattr(quantization, config_name)())
    return tool


def quanto_int8(model) -> None:
    quanto = need("optimum.quanto")
    quanto.quantize(model, weights=quanto.qint8)
    quanto.freeze(model)


def layerwise_casting(model) -> None:
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)


def group_offload(offload_type: str) -> Callable[[torch.nn.Module], None]:
    def tool(model):
        from diffusers.hooks import apply_group_offloading

        cpu = torch.device("cpu")
        extra = {"num_blocks_per_group": 1} if offload_type == "block_level" else {}
        apply_group_offloading(model, onload_device=cpu, offload_device=cpu, offload_type=offload_type, **extra)
    return tool


def enable_group_offload(model) -> None:
    cpu = torch.device("cpu")
    model.enable_group_offload(onload_device=cpu, offload_device=cpu, offload_type="block_level",
                               num_blocks_per_group=1)


def gguf_q8_0(model) -> None:
    """Q8_0-quantize every Linear whose rows split into 32-value blocks, with the ``gguf`` package, and load the
    result as diffusers' GGUF loader does (``GGUFLinear`` layers holding ``GGUFParameter`` weights), through
    diffusers' own helper: for families diffusers cannot single-file-load (SANA-Video has no single-file mapping)."""
    gguf = need("gguf")
    from diffusers.quantizers.gguf.utils import GGUFParameter, _replace_with_gguf_linear

    state = {}
    for key, value in model.state_dict().items():
        if key.endswith(".weight") and value.ndim == 2 and value.shape[1] % 32 == 0:
            packed = gguf.quantize(value.float().numpy(), gguf.GGMLQuantizationType.Q8_0)
            state[key] = GGUFParameter(torch.from_numpy(packed), quant_type=gguf.GGMLQuantizationType.Q8_0)
        else:
            state[key] = value
    _replace_with_gguf_linear(model, torch.bfloat16, state)  # new layers, on the meta device
    for key, value in state.items():
        owner, _, name = key.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(value, GGUFParameter) or module._parameters.get(name) is not None and module._parameters[
                name].is_meta:
            module._parameters[name] = value if isinstance(value, GGUFParameter) else torch.nn.Parameter(
                value, requires_grad=False)


def write_gguf_checkpoint(model: torch.nn.Module, path) -> None:
    """``model``'s state dict as a GGUF file: Q8_0 for Linear weights whose rows split into 32-value blocks, float32
    for the rest (diffusers-format keys, which ``from_single_file`` loads without conversion)."""
    gguf = need("gguf")
    writer = gguf.GGUFWriter(str(path), "accelpatch-test")
    for key, value in model.state_dict().items():
        array = value.float().numpy()
        if key.endswith(".weight") and value.ndim == 2 and value.shape[1] % 32 == 0:
            packed = gguf.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(key, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(key, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
