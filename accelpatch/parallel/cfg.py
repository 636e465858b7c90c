"""CFG parallelism: the two classifier-free-guidance branches of a batched transformer call on two ranks.

SANA-Video, SANA-Video 2.0 and diffusers' other single-model pipelines run guidance as *one* transformer call per
step on a batch of 2·B (``[negative, positive]`` concatenated on dim 0). :func:`enable_cfg_parallel` puts a forward
pre-hook and a forward hook on the transformer: before the call, every batch-carrying argument is cut on dim 0 and
rank r keeps chunk r; after it, the outputs are all-gathered on dim 0 over the cfg group (one collective per call:
all outputs and an input fingerprint travel as one byte buffer), so every rank holds the full 2·B prediction and
runs the same guidance and scheduler step. The hooks sit outside diffusers' own hooks (its context-parallel split
and gather run inside the local call), so a ``("cfg", "ring", "ulysses")`` mesh from :func:`parallel_mesh`, handed
to ``ContextParallelConfig(mesh=...)`` too, composes CFG and sequence parallelism.

Under ``torchrun --nproc-per-node 4`` (2-way CFG × 2-way Ulysses; every rank runs the same script)::

    dist.init_process_group("nccl"); torch.cuda.set_device(dist.get_rank())
    mesh = accelpatch.parallel.parallel_mesh(cfg=2, ulysses=2)
    pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh))
    accelpatch.parallel.enable_cfg_parallel(pipe, mesh=mesh)         # with 2 ranks and no sequence split: mesh=None
    video = pipe(prompt, generator=torch.Generator().manual_seed(0)).frames   # the same seed on every rank

Calls that do not split run whole on every rank, counted by reason in :func:`cfg_parallel_counts` (and warned
once): a pipeline without guidance, a batch of 1, a cfg degree of 1 (world size 1). Every rank must be given the
same inputs (the same seeded generator): the gather carries a fingerprint of them and raises where they differ.

A pipeline that calls the transformer twice per step (once per branch) cannot be split by a hook: at the first call
rank 1 does not hold the second call's inputs yet. The smallest correct scheme defers: rank 1 returns an empty
tensor from call 0 and fills it in place after call 1's gather. It holds only if the pipeline reads call 0's output
after call 1 and keeps the very tensor (a ``.float()`` of a bf16 output copies it), so it is not offered: the three
pipelines this serves batch their branches (SANA-Video T2V and I2V, SANA-Video 2.0), and diffusers' MiniMax-H3
pipeline is guidance-distilled (one batch-1 call per step, run whole).
"""
from __future__ import annotations

import contextvars
import inspect
import threading
import warnings
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist

from accelpatch.parallel.sequence import CFG_STATE_ATTR, SequenceShards, sequence_shards

__all__ = ["enable_cfg_parallel", "disable_cfg_parallel", "parallel_mesh", "cfg_parallel_counts", "cfg_parallel_of",
           "SHARED_ARGUMENTS"]

STATE_ATTR = CFG_STATE_ATTR

#: per transformer class: forward arguments shared by the whole batch (never split, whatever their first dim).
#: MiniMax-H3 describes one packed layout for every sample: its ``timestep`` holds the distinct noise levels, not
#: one per sample, and is as long as a CFG batch whenever two levels are present.
SHARED_ARGUMENTS = {
    "MiniMaxH3Transformer3DModel": frozenset({"timestep", "timestep_indices", "token_tags", "position_ids",
                                              "video_indices", "audio_indices", "text_indices"}),
}

#: why a call ran whole on every rank
NO_GUIDANCE = "no guidance (the pipeline's guidance_scale <= 1)"
BATCH_OF_ONE = "batch 1: no guidance branches to split"
DEGREE_ONE = "cfg degree 1 (world size 1 or a mesh whose cfg dim is 1)"


def _require_process_group(verb: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{verb} needs torch.distributed initialised on every rank first (run under torchrun, "
                           "then torch.distributed.init_process_group(...))")


def _device_type() -> str:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None else "cpu"


def parallel_mesh(cfg: int = 2, ulysses: int = 1, ring: int = 1, device_type: Optional[str] = None):
    """A ``DeviceMesh`` of shape (cfg, ring, ulysses) named ``("cfg", "ring", "ulysses")`` over the whole world:
    give it to :func:`enable_cfg_parallel` (its "cfg" dim) and to diffusers'
    ``ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses, mesh=...)`` (its "ring" × "ulysses" dims).
    Ranks of one sequence group are consecutive (the per-layer traffic stays between neighbours)."""
    _require_process_group("parallel_mesh()")
    degrees = {"cfg": cfg, "ring": ring, "ulysses": ulysses}
    for name, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"parallel_mesh(): {name} must be an integer >= 1, got {value!r}")
    world = dist.get_world_size()
    if cfg * ring * ulysses != world:
        raise ValueError(f"parallel_mesh(cfg={cfg}, ring={ring}, ulysses={ulysses}) spans {cfg * ring * ulysses} "
                         f"ranks, the world has {world}: the product of the degrees must equal the world size")
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type or _device_type(), (cfg, ring, ulysses),
                            mesh_dim_names=("cfg", "ring", "ulysses"))


def _cfg_group(mesh: Any) -> tuple[SequenceShards, SequenceShards, list[int]]:
    """(the cfg group, the group of every rank the model is split over, the ranks sharing this rank's cfg index)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if mesh is None:
        if world > 2:
            raise ValueError(f"CFG parallelism splits the two guidance branches over 2 ranks; the world has {world}: "
                             "pass mesh=accelpatch.parallel.parallel_mesh(cfg=2, ulysses=...) to combine it with sequence "
                             "parallelism")
        shards = SequenceShards(None, rank, world)
        return shards, shards, [rank]
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "cfg" not in names:
        raise ValueError(f"the mesh has no 'cfg' dim (dims {tuple(names)}): build it with accelpatch.parallel.parallel_mesh()")
    cfg = mesh["cfg"]
    if cfg.size() > 2:
        raise ValueError(f"CFG parallelism splits the two guidance branches: the mesh's cfg dim must be 1 or 2, got "
                         f"{cfg.size()}")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(f"rank {rank} is not in the mesh")
    index = list(names).index("cfg")
    ranks = mesh.mesh.select(index, coordinate[index]).flatten().tolist()
    shards = SequenceShards(cfg.get_group(), cfg.get_local_rank(), cfg.size())
    if mesh.size() == world:
        everyone = SequenceShards(None, rank, world)
    else:
        flat = mesh._flatten()
        everyone = SequenceShards(flat.get_group(), flat.get_local_rank(), flat.size())
    return shards, everyone, ranks


def _fingerprint(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One int64 per input: the sum of its bytes (exact, equal on every rank that holds the same tensor)."""
    sums = [t.detach().contiguous().reshape(-1).view(torch.uint8).sum(dtype=torch.int64).reshape(1).to(device)
            for t in tensors]
    return torch.cat(sums)


#: every piece of the gathered buffer starts at a multiple of this many bytes (a dtype view needs its alignment)
ALIGN = 16


def pack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The tensors' bytes in one uint8 buffer (each piece padded to :data:`ALIGN`), and each piece's padded size."""
    pieces, sizes = [], []
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        pad = -raw.numel() % ALIGN
        pieces += [raw, raw.new_zeros(pad)] if pad else [raw]
        sizes.append(raw.numel() + pad)
    return torch.cat(pieces), sizes


def unpack(buffer: torch.Tensor, sizes: list[int], like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse of :func:`pack`: views of ``buffer`` with the dtype and shape of each of ``like``."""
    out = []
    for piece, model in zip(buffer.split(sizes), like):
        nbytes = model.numel() * model.element_size()
        out.append(piece[:nbytes].view(model.dtype).view(model.shape))
    return out


def _keep_layout(full: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``full`` in ``local``'s channels-last layout, where the model returns one (the batched call would too)."""
    if local.is_contiguous():
        return full
    for fmt, dims in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if local.dim() == dims and local.is_contiguous(memory_format=fmt):
            return full.contiguous(memory_format=fmt)
    return full


class _Counts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.split = 0
        self.whole: dict[str, int] = {}

    def add(self, reason: Optional[str]) -> None:
        with self._lock:
            if reason is None:
                self.split += 1
            else:
                self.whole[reason] = self.whole.get(reason, 0) + 1

    def read(self, reset: bool) -> dict:
        with self._lock:
            out = {"split": self.split, "whole": dict(self.whole)}
            if reset:
                self.split, self.whole = 0, {}
            return out


class CfgParallel:
    """The hooks on one transformer: which ranks share the batch, what was split, and how to take it all off."""

    def __init__(self, model: torch.nn.Module, mesh: Any, pipeline: Any) -> None:
        self.mesh = mesh
        self.shards, self.everyone, self._slice = _cfg_group(mesh)
        self.counts = _Counts()
        self._pipeline = weakref.ref(pipeline) if pipeline is not None else None
        self._names = [n for n in inspect.signature(type(model).forward).parameters][1:]  # without self
        self._shared = SHARED_ARGUMENTS.get(type(model).__name__, frozenset())
        self._split_call: contextvars.ContextVar = contextvars.ContextVar(f"accelpatch_cfg_{id(self)}", default=None)
        self._checked_sequence = False
        self._warned: set[str] = set()
        self.handles = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                        model.register_forward_hook(self._after)]
        if self.shards.world == 1:
            self._whole(DEGREE_ONE, count=False)

    @property
    def degree(self) -> int:
        return self.shards.world

    def __reduce__(self):  # its process groups belong to this process
        raise TypeError("a transformer with CFG parallelism cannot be copied or pickled (its process groups belong to "
                        "this process): call accelpatch.parallel.disable_cfg_parallel() first, enable it again on the copy")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # --- before the call ------------------------------------------------------------------------------------

    def _whole(self, reason: str, count: bool = True) -> None:
        if count:
            self.counts.add(reason)
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"accelpatch CFG parallelism: calls run whole on every rank: {reason}", stacklevel=4)

    def _guidance(self) -> Optional[bool]:
        pipeline = self._pipeline() if self._pipeline is not None else None
        try:
            value = getattr(pipeline, "do_classifier_free_guidance", None)
        except Exception:  # a property reading call state that is not set
            value = None
        return value if isinstance(value, bool) else None

    def _check_sequence_group(self, model: torch.nn.Module) -> None:
        """Under diffusers' context parallelism too, its sequence group must be this rank's cfg slice (checked once
        a context-parallel config is there: ``enable_parallelism`` may come after this)."""
        if self._checked_sequence:
            return
        sequence = sequence_shards(getattr(model, "_parallel_config", None))
        if sequence is not None:
            ranks = dist.get_process_group_ranks(sequence.group) if sequence.group is not None \
                else list(range(dist.get_world_size()))
            if sorted(ranks) != sorted(self._slice):
                raise ValueError(f"CFG parallelism with sequence parallelism: the sequence group {sorted(ranks)} "
                                 f"must be the ranks sharing this rank's cfg index {sorted(self._slice)}; give the "
                                 "same accelpatch.parallel.parallel_mesh(...) to ContextParallelConfig(mesh=...) and to "
                                 "enable_cfg_parallel(mesh=...)")
            self._checked_sequence = True

    def _before(self, module, args, kwargs):
        self._split_call.set(None)
        if self.shards.world == 1:
            self.counts.add(DEGREE_ONE)
            return None
        named = list(zip(self._names, args)) + list(kwargs.items())
        tensors = [(n, v) for n, v in named if isinstance(v, torch.Tensor)]
        first = dict(named).get(self._names[0])  # hidden_states: its dim 0 is the batch
        if not isinstance(first, torch.Tensor) or first.dim() == 0:
            raise ValueError(f"CFG parallelism: the transformer's first argument {self._names[0]!r} is not a batched "
                             "tensor")
        batch = first.shape[0]
        guidance = self._guidance()
        if guidance is False:
            self._whole(NO_GUIDANCE)
            return None
        if batch % self.degree:
            if batch == 1 and guidance is None:
                self._whole(BATCH_OF_ONE)
                return None
            raise ValueError(f"CFG parallelism: {self._names[0]} has a batch of {batch}, which does not split over "
                             f"the {self.degree} cfg ranks (with guidance the batch is 2·B: [negative, positive])")
        self._check_sequence_group(module)

        def cut(name, value):
            if name in self._shared:
                return value
            if isinstance(value, torch.Tensor):
                return value.chunk(self.degree)[self.shards.rank] if value.dim() and value.shape[0] == batch \
                    else value
            if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
                return type(value)(cut(name, v) for v in value)
            return value

        new_args = tuple(cut(n, v) for n, v in zip(self._names, args))
        new_kwargs = {n: cut(n, v) for n, v in kwargs.items()}
        self._split_call.set((batch // self.degree, _fingerprint([v for _, v in tensors], first.device),
                              [n for n, _ in tensors]))
        self.counts.add(None)
        return new_args, new_kwargs

    # --- after the call -------------------------------------------------------------------------------------

    def _after(self, module, args, output):
        call = self._split_call.get()
        if call is None:
            return None
        self._split_call.set(None)
        local_batch, fingerprint, input_names = call
        if isinstance(output, torch.Tensor):
            fields = {None: output}
        elif isinstance(output, tuple):
            fields = dict(enumerate(output))
        else:  # diffusers' BaseOutput (an ordered dict of tensors)
            fields = dict(output.items())
        gathered = {k: v for k, v in fields.items()
                    if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == local_batch}
        device = next(iter(gathered.values())).device if gathered else fingerprint.device
        like = [fingerprint.to(device), *gathered.values()]
        buffer, sizes = pack(like)
        received = [torch.empty_like(buffer) for _ in range(self.degree)]
        dist.all_gather(received, buffer, group=self.shards.group)
        per_rank = [unpack(r, sizes, like) for r in received]
        prints = [p[0] for p in per_rank]
        if any(not torch.equal(p, prints[0]) for p in prints[1:]):
            differ = [n for i, n in enumerate(input_names) if any(p[i] != prints[0][i] for p in prints[1:])]
            raise RuntimeError(f"CFG parallelism: the ranks were given different transformer inputs ({differ}): "
                               "every rank must build the same latents and prompts; pass the same seeded generator "
                               "(e.g. generator=torch.Generator().manual_seed(0)) on every rank")
        for i, (key, local) in enumerate(gathered.items(), start=1):
            parts = [p[i] for p in per_rank]
            parts[self.shards.rank] = local
            fields[key] = _keep_layout(torch.cat(parts), local)
        if isinstance(output, torch.Tensor):
            return fields[None]
        if isinstance(output, tuple):
            return type(output)(fields[i] for i in range(len(output)))
        return type(output)(**fields)


def _transformers(target: Any, verb: str) -> tuple[list[torch.nn.Module], Any]:
    if isinstance(target, torch.nn.Module):
        return [target], None
    found = [m for m in (getattr(target, n, None) for n in ("transformer", "transformer_2"))
             if isinstance(m, torch.nn.Module)]
    if not found:
        raise TypeError(f"{verb}() expects a diffusers pipeline with a `transformer` or a transformer module; got "
                        f"{type(target).__name__}")
    return found, target


def cfg_parallel_of(model: torch.nn.Module) -> Optional[CfgParallel]:
    """The CFG parallelism on ``model`` (None when not enabled)."""
    return model.__dict__.get(STATE_ATTR)


def enable_cfg_parallel(target: Any, mesh: Any = None) -> None:
    """Split each guided transformer call of ``target`` (a pipeline or a transformer) over the cfg ranks: rank r
    runs branch r (``[negative, positive]`` order) and every rank gets the gathered output. ``mesh``: None for a
    world of 2 (1: calls run whole, counted), else a mesh with a "cfg" dim (see :func:`parallel_mesh`). Enabling
    again with the same mesh changes nothing; :func:`disable_cfg_parallel` takes it off."""
    _require_process_group("enable_cfg_parallel()")
    models, pipeline = _transformers(target, "enable_cfg_parallel")
    for model in models:
        current = cfg_parallel_of(model)
        if current is not None and current.mesh is not mesh:
            raise ValueError(f"CFG parallelism is already enabled on this {type(model).__name__} with another mesh: "
                             "call accelpatch.parallel.disable_cfg_parallel() first")
    for model in models:
        current = cfg_parallel_of(model)
        if current is None:
            model.__dict__[STATE_ATTR] = CfgParallel(model, mesh, pipeline)
        elif pipeline is not None:  # the same transformer in another pipeline: read that one's guidance
            current._pipeline = weakref.ref(pipeline)


def disable_cfg_parallel(target: Any) -> None:
    """Take CFG parallelism off ``target``'s transformers (nothing stays registered); a no-op where it is off."""
    models, _ = _transformers(target, "disable_cfg_parallel")
    for model in models:
        state = model.__dict__.pop(STATE_ATTR, None)
        if state is not None:
            state.remove()


def cfg_parallel_counts(target: Any, *, reset: bool = False) -> dict:
    """Per transformer path ("transformer", "transformer_2", or "" for a module): calls split over the cfg ranks
    and calls run whole by reason (``{"split": n, "whole": {reason: n}}``); only enabled models are listed."""
    if isinstance(target, torch.nn.Module):
        named = [("", target)]
    else:
        named = [(n, getattr(target, n)) for n in ("transformer", "transformer_2")
                 if isinstance(getattr(target, n, None), torch.nn.Module)]
    return {name: state.counts.read(reset) for name, model in named
            if (state := cfg_parallel_of(model)) is not None}
