"""Load the released SANA-Video 2.0 weights (original NVlabs/Sana format) into
:class:`SanaVideo2Transformer3DModel`, and convert them to a diffusers folder.

The release is a torch pickle with the weights under ``state_dict``. Its keys are the original module names,
which our model mirrors, so no key is renamed. The work is in reading the file safely: a pickle is only opened
with ``weights_only=True``. The loader validates every key and shape before it assigns anything, so a load either
succeeds completely or changes nothing. The model is built on the meta device and gets its tensors one by one,
each read (or copied out of the file mapping) into memory the model owns, so no weight stays a view of the file and
peak host memory stays near one copy of the weights. The expected keys and shapes are the model's own state dict
(built on the meta device from the release config), checked key by key.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

import torch

from accelpatch.models.sana_video2.modeling.checkpoint import (  # noqa: F401 (re-exported)
    CheckpointError, PathLike, UnsafeCheckpointError, _bar, infer_sana_video2_config, load_checkpoint,
    read_original_state_dict, sana_video2_config_from_yaml)
from accelpatch.models.sana_video2.modeling.transformer import SanaVideo2Transformer3DModel
from accelpatch.models.sana_video2.release import _YAML_FIXED, _YAML_MAPPED, REGISTRY  # noqa: F401 (re-exported)

__all__ = [
    "CheckpointError", "UnsafeCheckpointError", "ConversionSummary", "load_sana_video2_checkpoint",
    "convert_sana_video2", "read_original_state_dict", "infer_sana_video2_config", "sana_video2_config_from_yaml",
]


def load_sana_video2_checkpoint(path_or_state_dict: Union[PathLike, Mapping[str, Any]],
                                config: Union[None, PathLike, Mapping[str, Any]] = None,
                                torch_dtype: Optional[torch.dtype] = None, *, progress: bool = True,
                                model_cls=None):
    """A :class:`SanaVideo2Transformer3DModel` in eval mode with the weights of an original SANA-Video 2.0
    checkpoint.

    ``path_or_state_dict``: a ``.pth`` / ``.pt`` / ``.bin`` torch pickle (read with ``weights_only=True``,
    memory-mapped), a ``.safetensors`` file, or an in-memory state dict. The weights may be under ``generator``,
    ``state_dict`` or ``state_dict_ema``, and every key may carry a ``module.`` or ``model.`` prefix.
    ``config``: None (inferred from the shapes; see :func:`infer_sana_video2_config`), a dict of constructor
    kwargs, or a release ``config.yaml`` (see :func:`sana_video2_config_from_yaml`).

    Every key and shape is checked before anything is assigned. Any missing, unexpected, mis-shaped or
    non-float key raises :class:`CheckpointError`, naming the keys. There are two exceptions. ``pos_embed`` may be
    absent or of any ``[1, S², C]`` shape; the model keeps its own zeros. ``y_embedder.y_embedding`` (the
    training-time null caption) may be absent, and then gets the constructor's initialisation from a fixed seed.
    The model is built on the meta device and owns its weights: it never keeps a view of the file, so rewriting,
    truncating or deleting the checkpoint afterwards changes nothing. Tensor by tensor, a memory-mapped pickle's
    tensor is copied into fresh memory and the file pages it read are released, and a ``.safetensors`` tensor is
    read straight into fresh memory, so the peak stays near one copy of the weights. An in-memory state dict's
    tensors are assigned as they are (shared with the model, like ``load_state_dict(assign=True)``). Without
    ``torch_dtype`` the tensors keep the checkpoint's dtype (the widest one if the parameters mix dtypes). With it,
    they are cast one by one while they are copied.
    """
    return load_checkpoint(path_or_state_dict, config, torch_dtype, progress=progress,
                           model_cls=model_cls or SanaVideo2Transformer3DModel, own_memory=True)


# -- conversion to a diffusers folder --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionSummary:
    """What :func:`convert_sana_video2` wrote."""

    out_dir: Path
    parameters: int
    dtype: torch.dtype
    files: tuple[str, ...]
    bytes_on_disk: int
    config: dict = field(repr=False)

    def __str__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return (f"SANA-Video 2.0 transformer: {self.parameters:,} parameters ({dtype}), "
                f"{_human_bytes(self.bytes_on_disk)} in {len(self.files)} files in {self.out_dir}")


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.2f} {unit}" if unit != "B" else f"{count} B"
        value /= 1024
    return f"{count} B"  # pragma: no cover


def _weight_files(out_dir: Path) -> set[str]:
    """The diffusers safetensors weight files (single, shards, index) now in ``out_dir``."""
    return {p.name for p in out_dir.iterdir() if p.is_file() and p.name.startswith("diffusion_pytorch_model")
            and (p.name.endswith(".safetensors") or p.name.endswith(".safetensors.index.json"))}


def _planned_files(model, max_shard_size: Union[int, str]) -> list[str]:
    """The weight files ``save_pretrained(safe_serialization=True, max_shard_size=...)`` writes: it splits the state
    dict with huggingface_hub's ``split_torch_state_dict_into_shards``, as here."""
    from diffusers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFETENSORS_WEIGHTS_NAME
    from huggingface_hub import split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(model.state_dict(), max_shard_size=max_shard_size,
                                               filename_pattern=SAFETENSORS_WEIGHTS_NAME.replace(
                                                   ".safetensors", "{suffix}.safetensors"))
    names = sorted(split.filename_to_tensors)
    return [SAFE_WEIGHTS_INDEX_NAME, *names] if split.is_sharded else names


def convert_sana_video2(checkpoint: Union[PathLike, Mapping[str, Any]], out_dir: PathLike, *,
                        config: Union[None, PathLike, Mapping[str, Any]] = None,
                        torch_dtype: Optional[torch.dtype] = None, max_shard_size: Union[int, str] = "5GB",
                        progress: bool = True) -> ConversionSummary:
    """Convert an original SANA-Video 2.0 checkpoint into a diffusers folder: ``config.json`` plus
    ``diffusion_pytorch_model*.safetensors`` (sharded at ``max_shard_size``, with an index when sharded), written
    by ``save_pretrained(safe_serialization=True)``.
    ``SanaVideo2Transformer3DModel.from_pretrained(out_dir)`` loads the result. The checkpoint is validated in full
    before anything is written (see :func:`load_sana_video2_checkpoint` for ``config`` and ``torch_dtype``). Weight
    files that an earlier conversion left in ``out_dir`` and that this one did not write are removed, so the
    folder stays consistent. The model built here only lives while it is written, so a memory-mapped pickle's tensors
    are written from the mapping, not copied first."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{out_dir} exists and is not a directory")
    model = load_checkpoint(checkpoint, config, torch_dtype, progress=progress,
                            model_cls=SanaVideo2Transformer3DModel, own_memory=False)
    try:
        planned = _planned_files(model, max_shard_size)
    except ValueError as error:
        raise CheckpointError(f"max_shard_size {max_shard_size!r}: {error}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = [name for name in planned if name.endswith(".safetensors")]
    total = sum(t.nbytes for t in model.state_dict().values())
    stop = threading.Event()
    with _bar(progress, total=total, desc="writing", unit="B", unit_scale=True, unit_divisor=1024) as bar:
        def follow() -> None:  # the bar follows the bytes on disk: save_pretrained has no progress hook
            while not stop.wait(0.25):
                bar.n = min(total, _bytes_in(out_dir, shards))
                bar.refresh()

        for name in planned:  # a file from an earlier run must not count as progress
            (out_dir / name).unlink(missing_ok=True)
        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        try:
            model.save_pretrained(out_dir, safe_serialization=True, max_shard_size=max_shard_size)
        finally:
            stop.set()
            watcher.join()
        bar.n = total
        bar.refresh()
    for stale in _weight_files(out_dir) - set(planned):
        (out_dir / stale).unlink()
    files = ("config.json", *planned)
    missing = [name for name in files if not (out_dir / name).is_file()]
    if missing:  # pragma: no cover - diffusers changed how it names its files
        raise RuntimeError(f"save_pretrained did not write the expected files {missing} in {out_dir}")
    return ConversionSummary(out_dir=out_dir, parameters=sum(p.numel() for p in model.parameters()),
                             dtype=next(model.parameters()).dtype, files=files,
                             bytes_on_disk=_bytes_in(out_dir, files), config=dict(model.config))


def _bytes_in(out_dir: Path, names: Iterable[str]) -> int:
    total = 0
    for name in names:
        try:
            total += (out_dir / name).stat().st_size
        except FileNotFoundError:
            pass
    return total
