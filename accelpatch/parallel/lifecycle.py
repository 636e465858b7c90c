"""What ``apply()`` and ``remove()`` do about a model that runs on several processes.

- At ``apply()``: a model that an adapter gives a context-parallel plan must not be split already (diffusers would
  have split it by a plan accelpatch did not write: its token-mixing layers would stay local or crash).
- Before each forward of a split model (sequence or CFG parallelism), in eager code: once per parallel config, every rank must be patched alike
  (same tier, backend, options and sites: a rank running another path waits in a collective the others never
  reach); on every call, the calling context's tier must be the same on every rank.
- At ``remove()``: parallelism enabled after ``apply()`` is undone too: diffusers' split and gather hooks come off,
  ``_parallel_config`` is cleared on the model and its processors (diffusers has no inverse of
  ``enable_parallelism``), and the model is the unsplit one it was before.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import torch
import torch.distributed as dist

from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.parallel.cfg import cfg_parallel_of
from accelpatch.parallel.sequence import sequence_shards, unsplit_in_one_process


def cfg_degree(model: torch.nn.Module) -> int:
    """How many ranks share the CFG batch of ``model`` (1 unless CFG parallelism is on)."""
    state = cfg_parallel_of(model)
    return state.degree if state is not None else 1

#: diffusers' names of its context-parallel hooks (diffusers/hooks/context_parallel.py)
_CP_HOOK_PREFIXES = ("cp_input---", "cp_output---")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def parallel_config(model: torch.nn.Module) -> Any:
    """The ``ParallelConfig`` diffusers recorded on ``model`` (None when it is not split)."""
    return getattr(model, "_parallel_config", None)


#: the name parallelism registers under with the core (accelpatch.parallel.feature): ``patch.attached[FEATURE]``
FEATURE = "parallel"


def guard_of(patch: Any) -> Optional["ParallelGuard"]:
    """The rank check attached to a model's patch (None: no patch, or not attached)."""
    return getattr(patch.attached.get(FEATURE) if patch is not None else None, "guard", None)


def refuse_split_model(model: torch.nn.Module, plan: Optional[dict]) -> None:
    """Raise when ``model`` was split before ``apply()`` although accelpatch provides its plan."""
    if plan is not None and parallel_config(model) is not None:
        raise RuntimeError(
            f"this {type(model).__name__} was parallelised (enable_parallelism) before accelpatch.apply(): its split "
            "was not planned by accelpatch, and its linear attention and temporal convolutions would run on one "
            "shard only. Load the model again, call accelpatch.apply() first, then enable_parallelism().")


def refuse_repatching_split_model(model: torch.nn.Module, patch: Any) -> None:
    """Raise when ``apply()`` with other arguments would re-patch a model split after the first ``apply()``: the
    re-patch starts from the unsplit model, and the split made for the old patch would be lost half-way."""
    guard = guard_of(patch)
    if guard is not None and not guard.split_at_apply and parallel_config(model) is not None:
        raise RuntimeError(
            f"this {type(model).__name__} was parallelised (enable_parallelism) after accelpatch.apply(): apply() "
            "with other arguments cannot re-patch it in place. Call accelpatch.remove() (it undoes the split too), "
            "then apply() with the new arguments and enable_parallelism() again.")


def fingerprint(patch: Any) -> str:
    """What must be equal on every rank: the patch as asked for, and the sites it mounted."""
    sites = sorted((s.path, s.kind, s.mounted) for s in patch.sites)
    return _ADDRESS.sub("", repr((patch.model_class, patch.key(), sites)))


def _gather(value: Any) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def refuse_world_mismatch(model: torch.nn.Module, config: Any) -> None:
    """Raise when the split does not use every process of the job: diffusers builds its mesh on the first ranks
    only, and the others would wait in the first collective for ever."""
    shards = sequence_shards(config)
    degree = shards.world if shards is not None else 1
    cfg = cfg_degree(model)
    if degree * cfg != dist.get_world_size():
        raise RuntimeError(
            f"accelpatch: {type(model).__name__} is split {degree} ways over the sequence"
            + (f" and {cfg} ways over CFG" if cfg > 1 else "")
            + f", but the job has {dist.get_world_size()} processes: launch {degree * cfg} processes (torchrun "
            f"--nproc_per_node={degree * cfg}), or give ContextParallelConfig a degree that uses all of them")


class ParallelGuard:
    """Made by ``apply()`` for every patched model and asked by its forward pre-hook (accelpatch.core.model_hooks):
    checks a split model's ranks agree; undoes parallelism enabled after ``apply()`` when the patch is removed."""

    def __init__(self, model: torch.nn.Module, patch: Any) -> None:
        self.patch = patch
        self.split_at_apply = parallel_config(model) is not None
        self.checked = None  # the parallel config whose ranks were compared

    def __getstate__(self) -> dict:
        return dict(self.__dict__, checked=None)  # a process group does not pickle; a copy checks again

    def before_forward(self, model: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():
            return
        config, cfg = parallel_config(model), cfg_parallel_of(model)
        if config is None and cfg is None or not dist.is_initialized():
            return
        if self.checked != (id(config), id(cfg)):
            if config is not None:
                refuse_world_mismatch(model, config)  # before any collective: a rank left out would never answer
            prints = _gather(fingerprint(self.patch))
            differing = [rank for rank, value in enumerate(prints) if value != prints[0]]
            if differing:
                raise RuntimeError(
                    f"accelpatch: ranks {differing} are patched differently from rank 0 (call apply() with the same "
                    f"arguments on every rank). Rank 0: {prints[0]}; rank {differing[0]}: {prints[differing[0]]}")
            self.checked = (id(config), id(cfg))
        tier = torch.tensor([int(effective_tier(self.patch.default_tier))])
        tiers = [torch.empty_like(tier) for _ in range(dist.get_world_size())]
        dist.all_gather(tiers, tier)
        if len({int(t) for t in tiers}) > 1:
            tiers = [str(Tier(int(t))) for t in tiers]
            raise RuntimeError(f"accelpatch: the ranks run different tiers in this call ({tiers}, by rank): enter "
                               "the same accelpatch.quality(...) block on every rank")

    def remove(self, model: torch.nn.Module) -> None:
        unsplit_in_one_process(model)
        if parallel_config(model) is not None and not self.split_at_apply:
            undo_parallelism(model)


def undo_parallelism(model: torch.nn.Module) -> None:
    """Take diffusers' context-parallel hooks off ``model`` and clear the parallel config it recorded on the model
    and on its attention processors."""
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            for name in [n for n in registry._hook_order if n.startswith(_CP_HOOK_PREFIXES)]:
                registry.remove_hook(name, recurse=False)
            if not registry.hooks:  # diffusers leaves the forward it wrapped as an instance attribute
                del module._diffusers_hook
                forward = module.__dict__.get("forward")
                if getattr(forward, "__self__", None) is module and \
                        getattr(forward, "__func__", None) is type(module).forward:
                    del module.__dict__["forward"]
        processor = getattr(module, "processor", None)
        if processor is not None and getattr(processor, "_parallel_config", None) is not None:
            processor._parallel_config = None
    for module in model.modules():  # registries cache their descendants' registries: rebuild on next use
        if hasattr(module, "_diffusers_hook"):
            module._diffusers_hook._child_registries_cache = None
    model._parallel_config = None
