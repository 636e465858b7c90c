"""Tensors read from a checkpoint file into memory that the model owns, one tensor at a time.

A model must not keep views of its checkpoint file: rewriting the file would change its weights, and truncating
or deleting it would crash the process at the next forward (``SIGBUS``). Two readers, each holding about one copy
of the weights at its peak:

* :func:`owned_copy` copies one tensor out of a memory-mapped torch pickle (``torch.load(mmap=True)``) and then
  releases the file pages it read. Without that release the pages stay resident for as long as any tensor of the
  file is alive, and the peak is two copies (measured: ``benchmarks/bench_sana_video2_convert.py``).
* :class:`SafetensorsReader` reads one tensor of a ``.safetensors`` file with ``readinto`` straight into a fresh
  tensor, never mapping the file.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import sys
from pathlib import Path
from typing import Callable

import torch

__all__ = ["owned_copy", "SafetensorsReader"]


def _madvise() -> Callable[[int, int], None]:
    """``madvise(address, length, MADV_DONTNEED)`` where Linux has it; elsewhere a no-op (the copy is still owned;
    only the peak is higher)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if not sys.platform.startswith("linux") or advice is None:
        return lambda address, length: None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def release(address: int, length: int) -> None:
        libc.madvise(address, length, advice)  # best effort: a failure only keeps the pages resident

    return release


_release = _madvise()


def _release_mapped_pages(tensor: torch.Tensor) -> None:
    """Drop this process's resident pages of a clean, privately mapped file range (the whole pages inside the
    tensor's storage). A later read would fault them in again from the file, so no value changes."""
    storage = tensor.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _release(first, last - first)


def owned_copy(mapped: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy of ``mapped`` (a view of a file mapping made by ``torch.load(mmap=True)``) in fresh
    memory, cast to ``dtype``; the file pages it read are released. Only for file-backed tensors: on ordinary
    memory, releasing pages would zero them."""
    owned = torch.empty(mapped.shape, dtype=dtype, device="cpu")
    owned.copy_(mapped)
    _release_mapped_pages(mapped)
    return owned


class SafetensorsReader:
    """Reads single tensors of a ``.safetensors`` file (validated by ``safe_open`` before) into fresh memory.

    The format: an 8-byte little-endian header length, a JSON header (per tensor: ``dtype``, ``shape`` and
    ``data_offsets`` relative to the end of the header), then the little-endian tensor bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(length))
        self._data_start = 8 + length
        self._offsets = {name: tuple(entry["data_offsets"]) for name, entry in header.items()
                         if name != "__metadata__"}

    def read(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Tensor ``name`` as stored (``shape``, ``dtype``: what ``safe_open`` reported), in memory it owns."""
        begin, end = self._offsets[name]
        tensor = torch.empty(shape, dtype=dtype, device="cpu")
        buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        if len(buffer) != end - begin:
            raise ValueError(f"{self.path}: {name} has {end - begin} bytes in the file, expected {len(buffer)} for "
                             f"{list(shape)} {dtype}")
        with open(self.path, "rb") as file:
            file.seek(self._data_start + begin)
            read = file.readinto(buffer)
        if read != len(buffer):
            raise ValueError(f"{self.path} is truncated: {name} needs {len(buffer)} bytes, the file has {read}")
        return tensor
