"""The sequence group of a model split by diffusers' context parallelism, and the collectives its token-mixing
layers need that diffusers' hooks do not provide.

diffusers' ``enable_parallelism`` records a ``ParallelConfig`` on the model (``model._parallel_config``) and on every
attention processor that has a ``_parallel_config`` attribute. Its split hooks shard tokens over the flattened
ring × ulysses mesh; layers that mix tokens outside ``dispatch_attention_fn`` (linear attention, temporal
convolutions) must combine shards themselves, over that same group: :func:`sequence_shards` names it.

The collectives are for inference: they carry no backward (a model split over ranks runs under ``no_grad``), except
Ulysses' head exchange (:func:`heads_to_ranks`, :func:`ranks_to_heads`), which Sol-Attn's sites also run under
autograd (training, gradient checkpointing) and which is therefore differentiable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class SequenceShards:
    """Where this process sits in the sequence split: the process group, this rank's index in it, its size."""

    group: Any
    rank: int
    world: int


def sequence_shards(parallel_config: Any) -> Optional[SequenceShards]:
    """The sequence group of diffusers' ``ParallelConfig`` (or ``ContextParallelConfig``), or None when the config
    has no context parallelism (None, tensor parallelism only, or not set up yet)."""
    cp = getattr(parallel_config, "context_parallel_config", parallel_config)
    mesh = getattr(cp, "_flattened_mesh", None)
    if mesh is None:
        return None
    return SequenceShards(mesh.get_group(), mesh.get_local_rank(), mesh.size())


def shards_of_group(group: Any = None) -> SequenceShards:
    """A :class:`SequenceShards` over a plain process group (default: the world), for code and tests that split a
    model without a diffusers config, e.g. on one process, where diffusers' configs refuse a degree of 1."""
    return SequenceShards(group, dist.get_rank(group), dist.get_world_size(group))


def split_of(recorded: Any) -> Optional[SequenceShards]:
    """The split a model or processor runs under, from what was recorded on it: a diffusers ``ParallelConfig`` (its
    sequence group), a :class:`SequenceShards` put there by :func:`split_in_one_process`, or None (unsplit)."""
    return recorded if isinstance(recorded, SequenceShards) else sequence_shards(recorded)


def processor_shards(processor: Any) -> Optional[SequenceShards]:
    """The split an attention processor sees (its ``_parallel_config``: see :func:`split_of`)."""
    return split_of(getattr(processor, "_parallel_config", None))


def model_split(model: torch.nn.Module) -> Optional[SequenceShards]:
    """The split a whole model runs under: diffusers' config on it, or the one-process split of
    :func:`split_in_one_process` (``model._sequence_shards``); None when unsplit."""
    return getattr(model, "_sequence_shards", None) or sequence_shards(getattr(model, "_parallel_config", None))


def split_in_one_process(model: torch.nn.Module, shards: SequenceShards, processors: type | tuple) -> None:
    """Split ``model`` over a group of one process (:func:`shards_of_group` of a one-process group), where diffusers'
    ``ContextParallelConfig`` refuses a degree of 1: ``shards`` is recorded on the model and on every processor of
    the types ``processors`` (the token-mixing layers that read their split from there), so the split layers run
    their collectives and checks over the one rank, which holds every token (no split hooks are needed). This is
    the world-size-1 check that a split changes no bit; ``accelpatch.remove`` (or :func:`unsplit_in_one_process`)
    undoes it. More ranks go through diffusers' ``enable_parallelism``, whose hooks split the tokens."""
    if shards.world != 1:
        raise ValueError(f"a one-process split takes a group of one process (got {shards.world}); split over more "
                         "ranks with model.enable_parallelism(config=ContextParallelConfig(ulysses_degree="
                         f"{shards.world}))")
    if getattr(model, "_parallel_config", None) is not None:
        raise RuntimeError(f"this {type(model).__name__} is already split by enable_parallelism")
    found = [m.processor for m in model.modules() if isinstance(getattr(m, "processor", None), processors)]
    if not found:
        names = processors.__name__ if isinstance(processors, type) else ", ".join(p.__name__ for p in processors)
        raise RuntimeError(f"{type(model).__name__} has no {names} processor to split (for SANA-Video: call "
                           "accelpatch.apply first)")
    model._sequence_shards = shards
    for processor in found:
        processor._parallel_config = shards


def unsplit_in_one_process(model: torch.nn.Module) -> None:
    """Undo :func:`split_in_one_process` (a no-op on a model it did not split)."""
    if model.__dict__.pop("_sequence_shards", None) is None:
        return
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if isinstance(getattr(processor, "_parallel_config", None), SequenceShards):
            processor._parallel_config = None


#: where :func:`accelpatch.parallel.enable_cfg_parallel` keeps its state on a transformer (named here, on the ground floor,
#: so that the model code can see every split a model is in without importing the CFG machinery)
CFG_STATE_ATTR = "_accelpatch_cfg_parallel"


def deciding_ranks(model: Any) -> Optional[SequenceShards]:
    """The group of every rank ``model`` is split over, which must take its data-dependent decisions together (a
    step cache reusing a step instead of running the blocks: ranks that decide differently wait on each other for
    ever) and start from one noise: with CFG parallelism, all ranks of its mesh (cfg × sequence; the world without
    a mesh); under diffusers' context parallelism alone, its sequence group; None when the model runs whole here."""
    state = model.__dict__.get(CFG_STATE_ATTR) if hasattr(model, "__dict__") else None
    if state is not None and state.everyone.world > 1:
        return state.everyone
    shards = sequence_shards(getattr(model, "_parallel_config", None))
    return shards if shards is not None and shards.world > 1 else None


def sum_over_ranks(x: torch.Tensor, shards: SequenceShards) -> torch.Tensor:
    """The sum of ``x`` over the ranks of the group (a new tensor; ``x`` is left as it was). Summation order is
    the backend's: equal on every rank, not equal to one process's single sum."""
    out = x.contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=shards.group)
    return out


def exchange_halo(first: torch.Tensor, last: torch.Tensor,
                  shards: SequenceShards) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Neighbour-only exchange along the split: send ``first`` to the previous rank and ``last`` to the next one;
    return (the previous rank's last, the next rank's first), None at the ends of the sequence. Point to point:
    each rank moves two slices whatever the world size."""
    if shards.world == 1:
        return None, None
    ranks = dist.get_process_group_ranks(shards.group) if shards.group is not None else list(range(shards.world))
    ops, previous, following = [], None, None
    first, last = first.contiguous(), last.contiguous()
    if shards.rank > 0:
        previous = torch.empty_like(last)
        ops += [dist.P2POp(dist.isend, first, ranks[shards.rank - 1], shards.group),
                dist.P2POp(dist.irecv, previous, ranks[shards.rank - 1], shards.group)]
    if shards.rank < shards.world - 1:
        following = torch.empty_like(first)
        ops += [dist.P2POp(dist.isend, last, ranks[shards.rank + 1], shards.group),
                dist.P2POp(dist.irecv, following, ranks[shards.rank + 1], shards.group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return previous, following


def all_agree(flag: bool, shards: Optional[SequenceShards]) -> bool:
    """True only when ``flag`` is true on every rank: a decision that changes which collectives run (a step cache
    reusing a step) must be taken alike everywhere, or the ranks wait on each other for ever."""
    if shards is None or shards.world == 1:
        return flag
    vote = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=shards.group)
    return bool(vote.item())


def whole_frames_error(frames: int, world: int, model: str) -> Optional[str]:
    """Why ``frames`` latent frames cannot be split over ``world`` ranks in whole, equal shards (None when they can),
    naming the world sizes and frame counts that work."""
    if frames % world == 0:
        return None
    sizes = [n for n in range(1, frames + 1) if frames % n == 0]
    counts = [n * world for n in range(1, 4)]
    return (f"{model}: {frames} latent frames do not split over {world} ranks in whole frames; use a world size "
            f"in {sizes} for this clip, or a latent frame count divisible by {world} (e.g. {counts})")


def all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Equal chunks of dim 0 exchanged between the ranks of ``group`` (None: the world): chunk j goes to rank j, and
    chunk i of the result came from rank i. Differentiable (its backward is the reverse exchange), through torch's
    functional collectives: torch.distributed.nn.functional's version is deprecated and warns on every rank at every
    call."""
    from torch.distributed import _functional_collectives as funcol

    group = dist.group.WORLD if group is None else group
    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x.contiguous(), None, None, group))


def heads_to_ranks(x: torch.Tensor, shards: SequenceShards) -> torch.Tensor:
    """Ulysses' first exchange: this rank's sequence shard of every head [B, N/W, H, D] → the whole sequence of its
    share of the heads [B, N, H/W, D] (rank r gets heads r·H/W … (r+1)·H/W − 1), one all-to-all in ``x``'s dtype;
    differentiable. H must divide by the world size (the caller checks, naming the valid degrees)."""
    batch, tokens, heads, dim = x.shape
    world = shards.world
    send = x.reshape(batch, tokens, world, heads // world, dim).permute(2, 0, 1, 3, 4)
    received = all_to_all(send, shards.group)  # [W, B, N/W, H/W, D]: block j is rank j's tokens of this rank's heads
    return received.permute(1, 0, 2, 3, 4).reshape(batch, world * tokens, heads // world, dim)


def ranks_to_heads(x: torch.Tensor, shards: SequenceShards) -> torch.Tensor:
    """The inverse of :func:`heads_to_ranks`: [B, N, H/W, D] → [B, N/W, H, D]; differentiable."""
    batch, tokens, heads, dim = x.shape
    world = shards.world
    send = x.reshape(batch, world, tokens // world, heads, dim).permute(1, 0, 2, 3, 4)
    received = all_to_all(send, shards.group)  # [W, B, N/W, H/W, D]: block j is rank j's heads of this rank's tokens
    return received.permute(1, 2, 0, 3, 4).reshape(batch, tokens // world, world * heads, dim)
