"""Which ranks must take a model's data-dependent decisions together.

A decision that changes which collectives run (a step cache reusing a step instead of running the blocks) must come
out alike on every rank the model is split over, or the ranks wait on each other for ever; where the ranks' inputs
differ (each holds its own CFG branch or sequence shard) they decide together through
:func:`accelpatch.parallel.sequence.all_agree` over the group named here.
"""
from __future__ import annotations

from typing import Any, Optional

from .sequence import SequenceShards, sequence_shards


def deciding_ranks(model: Any) -> Optional[SequenceShards]:
    """The group of every rank ``model`` is split over: with CFG parallelism, all ranks of its mesh (cfg × sequence;
    the world without a mesh); under diffusers' context parallelism alone, its sequence group; None when the model
    runs whole on this process."""
    from .cfg import cfg_parallel_of

    state = cfg_parallel_of(model) if hasattr(model, "__dict__") else None
    if state is not None and state.everyone.world > 1:
        return state.everyone
    shards = sequence_shards(getattr(model, "_parallel_config", None))
    return shards if shards is not None and shards.world > 1 else None
