"""Read a released SANA-Video 2.0 checkpoint (original NVlabs/Sana format) into a given model class: open the file
safely (a pickle only with ``weights_only=True``, memory-mapped), check every key and shape against the model's own
state dict before anything is assigned, and give the model tensors it owns, one by one.

The model class is an argument: this module knows checkpoints, not the model (``transformer.py``'s
``from_original_checkpoint`` passes its own class; :mod:`.convert` the released one).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

import torch

from accelpatch.models.sana_video2.release import CheckpointError, anchor_layer_indices, sana_video2_config_from_yaml
from accelpatch.models.sana_video2.modeling.file_reading import SafetensorsReader, owned_copy

PathLike = Union[str, "os.PathLike[str]"]


#: The two persistent buffers of the release that inference never reads (checkpoint reference §2.1).
POS_EMBED = "pos_embed"
Y_EMBEDDING = "y_embedder.y_embedding"
#: The wrappers the upstream loader accepts, in its order of preference, and the key prefixes it strips.
WRAPPERS = ("generator", "state_dict", "state_dict_ema")
PREFIXES = ("module.", "model.")
PICKLE_SUFFIXES = (".pth", ".pt", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
#: How many key names an error message lists before it gives a count.
LISTED_KEYS = 20


class UnsafeCheckpointError(CheckpointError):
    """A torch pickle that ``weights_only=True`` cannot read. Unpickling it would run code from the file."""


# -- reading a checkpoint -----------------------------------------------------------------------------------------


@dataclass
class _Checkpoint:
    """An original state dict whose key names, shapes and dtypes are known before any tensor data is read.
    ``take(key)`` hands over one tensor (and forgets it): a ``.safetensors`` file's is read from disk only then, into
    fresh memory. ``mapped``: ``take`` returns views of a memory-mapped file, which the loader copies out."""

    origin: str
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    take: Callable[[str], torch.Tensor]
    mapped: bool = False


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
                       "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


#: What torch's weights-only unpickler says when a pickle references code (a global, a class to build, a function
#: to call): such a file needs ``weights_only=False``. Other failures (say "Unsupported operand") mean that the file
#: is not a checkpoint at all.
_NEEDS_FULL_PICKLE = ("Unsupported global", "Unsupported class", "unrecognized function", "Can only build")


def _unsafe_pickle_error(path: Path, error: BaseException) -> UnsafeCheckpointError:
    match = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    what = f" (it references {match.group(1)})" if match else ""
    return UnsafeCheckpointError(
        f"{path} cannot be loaded with torch.load(weights_only=True): the pickle contains objects other than "
        f"tensors and plain containers{what}, so it needs weights_only=False. accelpatch will not do that, because "
        "unpickling with weights_only=False can execute arbitrary code stored in the file. Only if you trust the "
        "file: load it yourself (state = torch.load(path, map_location='cpu', weights_only=False)) and pass the "
        "state dict (state['state_dict']) instead of the path, or re-save the weights as safetensors "
        "(safetensors.torch.save_file(state['state_dict'], 'checkpoint.safetensors')) and pass that file, which "
        "also works on the command line.")


def _torch_load(path: Path) -> tuple[Any, bool]:
    """``torch.load`` with ``weights_only=True`` and, for the zip format, ``mmap=True``, and whether it is mapped. A
    file in the legacy (pre-zip) format cannot be memory-mapped and is read into memory instead, still with
    ``weights_only=True``."""
    import pickle

    def load(mmap: bool) -> Any:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)

    try:
        try:
            return load(mmap=True), True
        except RuntimeError as error:
            if "mmap can only be used with files saved with" not in str(error):
                raise
            return load(mmap=False), False
    except pickle.UnpicklingError as error:
        if any(marker in str(error) for marker in _NEEDS_FULL_PICKLE):
            raise _unsafe_pickle_error(path, error) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", str(error), re.DOTALL)
        reason = detail.group(1) if detail else str(error)
        raise CheckpointError(f"{path} is not a readable torch checkpoint: {' '.join(reason.split())}") from None
    except (RuntimeError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable torch checkpoint: {_reason(error)}") from None


def _reason(error: BaseException) -> str:
    """An exception's message on one line; for one without a message, what it means (an EOFError: the data ends
    early)."""
    message = " ".join(str(error).split())
    if message:
        return message
    if isinstance(error, EOFError):
        return "the data ends early (EOFError): the file is truncated or is not a torch checkpoint"
    return type(error).__name__


def _unwrap(obj: Any, origin: str) -> dict[str, torch.Tensor]:
    """The flat state dict inside a loaded checkpoint: the dict under ``generator``, else ``state_dict``, else
    ``state_dict_ema``, else the object itself; a ``module.`` or ``model.`` prefix on every key is stripped."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{origin}: expected a dict of tensors, got {type(obj).__name__}")
    wrapped = next((w for w in WRAPPERS if isinstance(obj.get(w), Mapping)), None)
    if wrapped is not None:
        obj, origin = obj[wrapped], f"{origin}[{wrapped!r}]"
    not_tensors = sorted(str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor) or not isinstance(k, str))
    if not_tensors:
        where = "" if wrapped else f" (and there is no {' / '.join(repr(w) for w in WRAPPERS)} entry holding one)"
        raise CheckpointError(f"{origin}: expected a state dict (names to tensors){where}, but {_listed(not_tensors)} "
                              f"{'is' if len(not_tensors) == 1 else 'are'} not a tensor")
    return _strip_prefix(dict(obj))


def _strip_prefix(state: dict[str, Any]) -> dict[str, Any]:
    for prefix in PREFIXES:
        if state and all(key.startswith(prefix) for key in state):
            return {key[len(prefix):]: value for key, value in state.items()}
    return state


def _open_safetensors(path: Path) -> _Checkpoint:
    """Names, shapes and dtypes from ``safe_open``; each tensor read by :class:`SafetensorsReader` (not a view of
    safetensors' file mapping, which ``get_tensor`` returns)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names = list(handle.keys())
            slices = {name: handle.get_slice(name) for name in names}
            stored = {name: (tuple(view.get_shape()), view.get_dtype()) for name, view in slices.items()}
        reader = SafetensorsReader(path)
    except Exception as error:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a readable .safetensors file: {_reason(error)}") from None
    renamed = _strip_prefix({name: name for name in names})
    shapes, dtypes = {}, {}
    for key, name in renamed.items():
        shapes[key], stored_dtype = stored[name]
        name_of_dtype = _SAFETENSORS_DTYPES.get(stored_dtype)
        if name_of_dtype is None or not hasattr(torch, name_of_dtype):
            raise CheckpointError(f"{path}: {key} has the dtype {stored_dtype}, which this loader does not read")
        dtypes[key] = getattr(torch, name_of_dtype)  # a non-float dtype is refused by the validation, naming the key

    def take(key: str) -> torch.Tensor:
        try:
            return reader.read(renamed[key], shapes[key], dtypes[key])
        except (OSError, ValueError) as error:
            raise CheckpointError(str(error)) from None

    return _Checkpoint(str(path), shapes, dtypes, take)


def _open_checkpoint(source: Union[PathLike, Mapping[str, Any]]) -> _Checkpoint:
    mapped = False
    if isinstance(source, Mapping):
        state = _unwrap(source, "the state dict")
        origin = "the state dict"
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
        suffix = path.suffix.lower()
        if suffix not in (*PICKLE_SUFFIXES, SAFETENSORS_SUFFIX):
            raise CheckpointError(f"{path}: unknown checkpoint format {suffix or '(no suffix)'!r}; expected a torch "
                                  f"pickle ({', '.join(PICKLE_SUFFIXES)}) or {SAFETENSORS_SUFFIX}")
        if path.stat().st_size == 0:
            raise CheckpointError(f"{path} is empty (0 bytes), not a checkpoint: was its download or copy "
                                  "interrupted?")
        if suffix == SAFETENSORS_SUFFIX:
            return _open_safetensors(path)
        loaded, mapped = _torch_load(path)
        state = _unwrap(loaded, str(path))
        origin = str(path)
        del loaded  # the other entries of the file (optimizer state, ...) are never read
    else:
        raise TypeError(f"expected a checkpoint path or a state dict, got {type(source).__name__}")
    return _Checkpoint(origin, {k: tuple(v.shape) for k, v in state.items()}, {k: v.dtype for k, v in state.items()},
                       state.pop, mapped=mapped)


def read_original_state_dict(path_or_state_dict: Union[PathLike, Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """The flat original state dict of a checkpoint (wrappers and prefixes removed), unvalidated. Pickles are read
    with ``weights_only=True`` and memory-mapped when possible: those tensors are views of the file (clone them to
    keep them past a change to it); a ``.safetensors`` file's tensors are read into memory."""
    checkpoint = _open_checkpoint(path_or_state_dict)
    return {key: checkpoint.take(key) for key in checkpoint.shapes}


# -- config ---------------------------------------------------------------------------------------------------------


def _listed(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:LISTED_KEYS])
    return shown if len(keys) <= LISTED_KEYS else f"{shown} and {len(keys) - LISTED_KEYS} more"


def infer_sana_video2_config(checkpoint: Union[PathLike, Mapping[str, Any]]) -> dict[str, Any]:
    """Constructor kwargs read off a checkpoint's shapes (a path, a state dict, or a dict of meta tensors).

    Determined by the shapes: ``hidden_size``, ``in_channels`` and ``patch_size`` (patch embedding), ``depth``
    (block indices), ``caption_channels``, ``model_max_length`` (``y_embedding``, when present; else 300),
    ``linear_head_dim`` (rows of ``attn.beta_proj``), ``mlp_ratio``, ``pred_sigma``, ``qk_norm`` / ``cross_norm`` /
    ``y_norm`` (whether those norms have weights), ``input_size`` (``pos_embed``, when present; else 15), and the
    anchor layers (those without ``attn.beta_proj``). The anchors must follow the release rule for some
    ``softmax_ratio``; the release's 0.25 is preferred when it fits.

    Not visible in any shape, and set to the release values: ``num_heads`` (cross-attention heads; only their
    product with the head dim is stored) = ``hidden_size // 128``, ``softmax_head_dim`` = 256,
    ``attn_res_block_size`` = 8, ``fp32_attention`` = True, ``norm_eps`` = 1e-5 and ``timestep_norm_scale_factor``
    = 1.0. Several of these change the output, so a model that is not release-sized needs an explicit config.
    """
    state = _open_checkpoint(checkpoint) if not isinstance(checkpoint, _Checkpoint) else checkpoint
    shapes = state.shapes

    def shape_of(key: str, dims: int) -> tuple[int, ...]:
        if key not in shapes:
            raise CheckpointError(f"cannot infer the config of {state.origin}: key {key!r} is missing (pass config=)")
        if len(shapes[key]) != dims:
            raise CheckpointError(f"cannot infer the config of {state.origin}: {key!r} has shape "
                                  f"{list(shapes[key])}, expected {dims} dimensions")
        return shapes[key]

    hidden, in_channels, *patch = shape_of("x_embedder.proj.weight", 5)
    caption_channels = shape_of("y_embedder.y_proj.fc1.weight", 2)[1]
    out_rows = shape_of("final_layer.linear.weight", 2)[0]
    out_channels, remainder = divmod(out_rows, math.prod(patch))
    if remainder or out_channels not in (in_channels, 2 * in_channels):
        raise CheckpointError(f"cannot infer the config of {state.origin}: final_layer.linear.weight has {out_rows} "
                              f"rows; expected patch {patch} × {in_channels} or × {2 * in_channels} channels")
    blocks = {int(m.group(1)) for key in shapes if (m := re.match(r"blocks\.(\d+)\.", key))}
    if not blocks:
        raise CheckpointError(f"cannot infer the config of {state.origin}: it has no 'blocks.N.' keys")
    depth = max(blocks) + 1
    if len(blocks) != depth:
        raise CheckpointError(f"cannot infer the config of {state.origin}: blocks {sorted(set(range(depth)) - blocks)} "
                              f"have no keys (the highest block index is {depth - 1})")
    beta_rows = {i: shapes[f"blocks.{i}.attn.beta_proj.weight"][0] for i in range(depth)
                 if f"blocks.{i}.attn.beta_proj.weight" in shapes}
    anchors = [i for i in range(depth) if i not in beta_rows]
    if set(beta_rows.values()) - {next(iter(beta_rows.values()), None)}:
        raise CheckpointError(f"cannot infer the config of {state.origin}: attn.beta_proj has different head counts "
                              f"across layers: {dict(sorted(beta_rows.items()))}")
    linear_heads = next(iter(beta_rows.values()), None)
    if linear_heads is not None and (linear_heads < 1 or hidden % linear_heads):
        raise CheckpointError(f"cannot infer the config of {state.origin}: attn.beta_proj has {linear_heads} rows, "
                              f"which does not divide hidden_size {hidden}")
    linear_head_dim = hidden // linear_heads if linear_heads else 128
    softmax_ratio = _ratio_for(depth, anchors, state.origin)
    ffn_rows = shape_of("blocks.0.mlp.gate_proj.weight", 2)[0]
    mlp_ratio = ffn_rows / hidden
    if int(hidden * mlp_ratio) != ffn_rows:
        raise CheckpointError(f"cannot infer the config of {state.origin}: no mlp_ratio gives {ffn_rows} SwiGLU "
                              f"channels for hidden_size {hidden}")
    num_heads = hidden // 128
    if num_heads < 1 or hidden % num_heads or hidden % 256:
        raise CheckpointError(
            f"cannot infer the config of {state.origin}: the cross-attention head count and the softmax head dim are "
            f"not visible in the shapes, and the release values (head dim 128, softmax head dim 256) do not fit "
            f"hidden_size {hidden}; pass config= (a dict of constructor kwargs or a config.yaml)")
    config: dict[str, Any] = dict(
        in_channels=in_channels, hidden_size=hidden, depth=depth, num_heads=num_heads,
        linear_head_dim=linear_head_dim, softmax_head_dim=256, softmax_ratio=softmax_ratio, mlp_ratio=mlp_ratio,
        caption_channels=caption_channels, patch_size=tuple(patch), pred_sigma=out_channels != in_channels,
        qk_norm="blocks.0.attn.q_norm.weight" in shapes, cross_norm="blocks.0.cross_attn.q_norm.weight" in shapes,
        y_norm="attention_y_norm.weight" in shapes,
    )
    if Y_EMBEDDING in shapes:
        config["model_max_length"] = shape_of(Y_EMBEDDING, 2)[0]
    if POS_EMBED in shapes and len(shapes[POS_EMBED]) == 3:
        side = math.isqrt(shapes[POS_EMBED][1])
        if side >= 1 and side * side == shapes[POS_EMBED][1]:
            config["input_size"] = side
    return config


def _ratio_for(depth: int, anchors: list[int], origin: str) -> float:
    """A ``softmax_ratio`` whose release rule gives exactly ``anchors`` (0.25 when it does)."""
    count = len(anchors)
    for ratio in (0.25, count / depth, (count + 0.5) / depth):
        if 0.0 < ratio <= 1.0 and anchor_layer_indices(depth, ratio) == anchors:
            return ratio
    rule = anchor_layer_indices(depth, max(count, 1) / depth)
    raise CheckpointError(f"{origin}: the layers without attn.beta_proj (softmax anchors) are {anchors}, which is not "
                          f"the release anchor rule for any softmax_ratio (depth {depth} with {max(count, 1)} "
                          f"anchor(s) gives {rule})")


def _resolve_config(config: Union[None, PathLike, Mapping[str, Any]], checkpoint: _Checkpoint,
                    model_cls) -> tuple[dict[str, Any], str]:
    """Constructor kwargs and a short note on where they came from."""
    import inspect

    if config is None:
        return infer_sana_video2_config(checkpoint), "inferred from the checkpoint's shapes"
    if isinstance(config, Mapping):
        kwargs, source = dict(config), "from the given dict"
    elif isinstance(config, (str, os.PathLike)):
        if Path(config).suffix.lower() not in (".yaml", ".yml"):
            raise CheckpointError(f"{config}: expected a release config.yaml (.yaml or .yml)")
        kwargs, source = sana_video2_config_from_yaml(config), f"from {config}"
    else:
        raise TypeError(f"config must be None, a dict of constructor kwargs or a config.yaml path, got "
                        f"{type(config).__name__}")
    accepted = set(inspect.signature(model_cls.__init__).parameters) - {"self"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise CheckpointError(f"unknown config field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                              f"{model_cls.__name__} takes: {', '.join(sorted(accepted))}")
    return kwargs, source


# -- validation and loading -----------------------------------------------------------------------------------------


def _check_against(model: torch.nn.Module, checkpoint: _Checkpoint, config_note: str) -> None:
    """Raise naming every missing, unexpected, mis-shaped or non-float key (the two unused buffers excepted)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = checkpoint.shapes
    missing = sorted(set(expected) - set(got) - {POS_EMBED, Y_EMBEDDING})
    unexpected = sorted(set(got) - set(expected))
    wrong_shape = [f"{key} (checkpoint {list(got[key])}, model {list(expected[key])})"
                   for key in sorted(set(got) & set(expected)) if key != POS_EMBED and got[key] != expected[key]]
    width = expected[POS_EMBED][-1]
    if POS_EMBED in got:
        shape = got[POS_EMBED]
        if not (len(shape) == 3 and shape[0] == 1 and shape[2] == width and shape[1] >= 1
                and math.isqrt(shape[1]) ** 2 == shape[1]):
            wrong_shape.append(f"{POS_EMBED} (checkpoint {list(shape)}, expected [1, S², {width}] for some S)")
    not_float = sorted(key for key in set(got) & set(expected) if not checkpoint.dtypes[key].is_floating_point)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key{'s' if len(missing) > 1 else ''}: {_listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key{'s' if len(unexpected) > 1 else ''}: "
                        f"{_listed(unexpected)}")
    if wrong_shape:
        problems.append(f"{len(wrong_shape)} key{'s' if len(wrong_shape) > 1 else ''} with a wrong shape: "
                        f"{_listed(wrong_shape)}")
    if not_float:
        problems.append(f"{len(not_float)} key{'s' if len(not_float) > 1 else ''} not floating point: "
                        f"{_listed(f'{k} ({checkpoint.dtypes[k]})' for k in not_float)}")
    if not problems:
        return
    hint = ""
    depth = getattr(model.config, "depth", 0)
    ckpt_anchors = [i for i in range(depth) if f"blocks.{i}.attn.qkv.weight" in got
                    and f"blocks.{i}.attn.beta_proj.weight" not in got]
    if ckpt_anchors and ckpt_anchors != list(model.softmax_layer_indices):
        hint = (f" The checkpoint's softmax anchors (layers without attn.beta_proj) are {ckpt_anchors}; the config's "
                f"are {list(model.softmax_layer_indices)}.")
    cfg = model.config
    raise CheckpointError(
        f"{checkpoint.origin} does not match SanaVideo2Transformer3DModel(hidden_size={cfg.hidden_size}, "
        f"depth={cfg.depth}, in_channels={cfg.in_channels}, caption_channels={cfg.caption_channels}, "
        f"linear_head_dim={cfg.linear_head_dim}, softmax_ratio={cfg.softmax_ratio}; config {config_note}): "
        + "; ".join(problems) + "." + hint + " Nothing was loaded.")


def _weights_dtype(checkpoint: _Checkpoint, names: Iterable[str]) -> torch.dtype:
    """The dtype the loaded parameters get without ``torch_dtype``: the checkpoint's, or, if its parameters mix
    dtypes, the widest of them (no value is rounded)."""
    dtypes = {checkpoint.dtypes[name] for name in names if name in checkpoint.dtypes}
    result = next(iter(dtypes), torch.float32)
    for dtype in dtypes:
        result = torch.promote_types(result, dtype)
    return result


def _owned(tensor: torch.Tensor, seen_storages: set[int]) -> torch.Tensor:
    """``tensor`` itself when it is contiguous and alone in its storage; else a copy. safetensors cannot save
    tensors that share memory, and assigning views would keep whole foreign storages alive."""
    storage = tensor.untyped_storage()
    alone = (tensor.is_contiguous() and tensor.storage_offset() == 0 and storage.nbytes() == tensor.nbytes
             and storage.data_ptr() not in seen_storages)
    if alone:
        seen_storages.add(storage.data_ptr())
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _bar(progress: bool, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(disable=None if progress else True, **kwargs)


def load_checkpoint(path_or_state_dict, config, torch_dtype, *, progress: bool, model_cls, own_memory: bool):
    """An instance of ``model_cls`` holding the checkpoint's weights (see
    :func:`~accelpatch.models.sana_video2.modeling.convert.load_sana_video2_checkpoint`); ``own_memory=False`` keeps
    a mapped pickle's tensors as views of the file
    (for :func:`convert_sana_video2`, whose model only lives while it is written out: no copy to pay for)."""
    checkpoint = _open_checkpoint(path_or_state_dict)
    kwargs, config_note = _resolve_config(config, checkpoint, model_cls)
    try:
        with torch.device("meta"):
            model = model_cls(**kwargs)
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"the config {config_note} does not describe a valid model: {error}") from None
    _check_against(model, checkpoint, config_note)

    expected = {name: tensor for name, tensor in model.state_dict().items()}
    parameter_names = {name for name, _ in model.named_parameters()}
    dtype = torch_dtype or _weights_dtype(checkpoint, parameter_names)
    if not dtype.is_floating_point:
        raise CheckpointError(f"torch_dtype must be a floating-point dtype, got {dtype}")
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    with _bar(progress, total=len(expected), desc="loading SANA-Video 2.0 weights", unit="tensor") as bar:
        for name, meta in expected.items():
            if name == POS_EMBED:  # unused: our own zeros, whatever the checkpoint's training size was
                tensor = torch.zeros(meta.shape, dtype=dtype)
            elif name == Y_EMBEDDING and name not in checkpoint.shapes:
                generator = torch.Generator().manual_seed(0)
                tensor = (torch.randn(meta.shape, generator=generator) / meta.shape[1] ** 0.5).to(dtype)
            elif checkpoint.mapped and own_memory:  # a view of the file: copied out, its pages released, dropped
                tensor = owned_copy(checkpoint.take(name), dtype)
            else:
                tensor = _owned(checkpoint.take(name).to(dtype), seen)
            state[name] = tensor
            bar.update(1)
    model.load_state_dict(state, strict=True, assign=True)
    still_meta = sorted(name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta)
    if still_meta:  # pragma: no cover - every persistent tensor is in `state`; a non-persistent buffer would land here
        raise RuntimeError(f"tensors left on the meta device after loading: {_listed(still_meta)}")
    return model.eval()
