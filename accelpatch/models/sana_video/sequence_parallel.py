"""SANA-Video split by whole frames over diffusers' context-parallel group: the plan ``enable_parallelism`` reads,
and what ``apply`` makes split-aware in the layers diffusers' hooks do not reach.

Tokens are frame-major (f, h, w), so an equal token split is a split by whole frames exactly when the latent frame
count F divides by the world size; other counts are refused at the first split forward, naming the valid ones.

- the plan (:func:`cp_plan`): ``rope``'s tables and ``transformer_blocks.0``'s hidden states split on the tokens,
  ``proj_out`` gathered (as diffusers' Wan plan);
- the model's entry (:class:`SplitEntry`, a forward pre-hook): checks (no autograd, whole frames, every attn1 sees
  the split, the temporal conv is the one the halo covers) and splits a per-token (image-to-video) ``timestep`` by
  frames, so that the blocks' modulation and ``norm_out``'s ``embedded_timestep`` cover the local tokens; a T2V
  timestep (one per batch item) stays whole. It runs after accelpatch's own model hooks, which read the full
  timestep (the step clock);
- each block (:class:`LocalFrames`, a forward pre-hook): the local frame count in place of the global ``frames``
  the block unflattens its tokens with before ``ff``;
- ``ff.conv_temp`` (:class:`TemporalHalo`, forward pre- and post-hooks): kernel (3, 1) over frames, so each rank's
  conv input gets the neighbouring ranks' boundary frames (:func:`exchange_halo`) and the extra outputs are dropped
  (the zero padding stays at the global ends);
- the attention processors (:mod:`.split_processors`): attn1's linear attention all-reduces its token sums (also in
  the fast paths, :mod:`.linear_attention`); attn2 stays local.

Every piece is idle unless the model is split: the split is read from what ``enable_parallelism`` recorded on the
blocks' attn1 processors (``_parallel_config``); the entry also reads ``model._parallel_config``, to refuse a split
model whose processors cannot see it. At world size 1, :func:`one_process_split` turns the pieces on without diffusers
(whose config refuses a degree of 1). Inference only: the collectives carry no backward.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from accelpatch.parallel.sequence import (SequenceShards, exchange_halo, model_split, processor_shards,
                                  split_in_one_process, whole_frames_error)
from accelpatch.models.sana_video.split_processors import (LocalCrossAttnProcessor, SanaAttnProcessor2_0, SanaLinearAttnProcessor3_0,
                               SplitLinearAttnProcessor)

__all__ = ["cp_plan", "split_layers", "one_process_split"]

MODEL = "SANA-Video"
#: the temporal convolution the one-frame halo is right for
_TEMPORAL_CONV = dict(kernel_size=(3, 1), stride=(1, 1), padding=(1, 0), dilation=(1, 1), groups=1)


def cp_plan(model: torch.nn.Module) -> dict:
    """diffusers' context-parallel plan for ``SanaVideoTransformer3DModel`` (it ships none)."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        "rope": {0: ContextParallelInput(split_dim=1, expected_dims=4, split_output=True),
                 1: ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)},
        "transformer_blocks.0": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)},
        "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def one_process_split(model: torch.nn.Module, shards: SequenceShards) -> None:
    """Split a patched SANA-Video over a group of one process (the world-size-1 check that the split layers change no
    bit): :func:`accelpatch.parallel.sequence.split_in_one_process` on the attn1 processors ``apply`` put in."""
    split_in_one_process(model, shards, SplitLinearAttnProcessor)


def _attn1_split(attn1: torch.nn.Module) -> Optional[SequenceShards]:
    """The split a block's linear attention ``attn1`` sees: None unless its processor is ours (a processor of the
    user's own never does the all-reduce, whatever config diffusers recorded on it)."""
    processor = attn1.processor
    return processor_shards(processor) if isinstance(processor, SplitLinearAttnProcessor) else None


def _argument(args: tuple, kwargs: dict, name: str, index: int) -> Any:
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


def _with_argument(args: tuple, kwargs: dict, name: str, index: int, value: Any) -> tuple[tuple, dict]:
    if name in kwargs or len(args) <= index:
        return args, {**kwargs, name: value}
    return args[:index] + (value,) + args[index + 1:], kwargs


class SplitEntry:
    """The model's forward pre-hook: see the module docstring."""

    def __call__(self, model: torch.nn.Module, args: tuple, kwargs: dict):
        shards = model_split(model)
        if shards is None:
            return None
        if torch.is_grad_enabled():
            raise RuntimeError(f"{MODEL} split over {shards.world} ranks runs inference only (its collectives carry "
                               "no backward): call it under torch.no_grad() or torch.inference_mode()")
        _check_layers(model, shards)
        hidden_states = _argument(args, kwargs, "hidden_states", 0)
        p_t, p_h, p_w = model.config.patch_size
        frames = hidden_states.shape[2] // p_t
        error = whole_frames_error(frames, shards.world, MODEL)
        if error is not None:
            raise ValueError(error)
        timestep = _argument(args, kwargs, "timestep", 2)
        batch = hidden_states.shape[0]
        tokens = frames * (hidden_states.shape[3] // p_h) * (hidden_states.shape[4] // p_w)
        if timestep is None or tokens == 1 or timestep.numel() != batch * tokens:
            return None  # one timestep per batch item: the same on every token
        local = timestep.reshape(batch, frames, -1).chunk(shards.world, dim=1)[shards.rank].reshape(batch, -1)
        return _with_argument(args, kwargs, "timestep", 2, local)


def _check_layers(model: torch.nn.Module, shards) -> None:
    """Refuse a split model with a layer that would stay local (a processor not ours: set after ``apply``) or a
    temporal conv the one-frame halo does not cover."""
    for index, block in enumerate(model.transformer_blocks):
        seen = _attn1_split(block.attn1)
        if seen is None or (seen.rank, seen.world) != (shards.rank, shards.world):
            raise RuntimeError(
                f"{MODEL} is split over {shards.world} ranks but transformer_blocks.{index}.attn1's processor "
                f"({type(block.attn1.processor).__name__}) does not see that split, so its linear attention would stay "
                "local: call accelpatch.apply before enable_parallelism and do not replace the processors after it")
        conv = block.ff.conv_temp
        geometry = {name: tuple(getattr(conv, name)) if name != "groups" else conv.groups for name in _TEMPORAL_CONV}
        if geometry != _TEMPORAL_CONV:
            raise RuntimeError(f"{MODEL}: transformer_blocks.{index}.ff.conv_temp is {geometry}; the frame halo "
                               f"of the split covers {_TEMPORAL_CONV} only")


class LocalFrames:
    """Each block's forward pre-hook: under a split, the local frame count instead of the global one (the entry made
    sure F divides by the world size; at block 0 diffusers' split hook runs after this, inside the forward)."""

    def __call__(self, block: torch.nn.Module, args: tuple, kwargs: dict):
        shards = _attn1_split(block.attn1)
        if shards is None:
            return None
        frames = _argument(args, kwargs, "frames", 5)
        return _with_argument(args, kwargs, "frames", 5, frames // shards.world)


class TemporalHalo:
    """``ff.conv_temp``'s hooks: under a split, the neighbouring ranks' boundary frames (:func:`exchange_halo`) are
    put around the local frames before the conv (:meth:`before`) and the outputs they produce are dropped after it
    (:meth:`after`). The conv thus computes every local frame from the same three frames as unsplit, in its own
    accumulation; at the global ends its zero padding stays. Costs one or two extra output frames per rank, and reads
    no weight outside the conv's own forward (an offloading hook may load the weights only there)."""

    def __init__(self, attn: torch.nn.Module) -> None:
        self.attn = attn  # the block's attn1: its processor sees the split (no per-call state here: thread-safe)

    def before(self, conv: torch.nn.Module, args: tuple):
        shards = _attn1_split(self.attn)
        if shards is None:
            return None
        x = args[0]  # [B, C, F_local, H'·W']
        previous, following = exchange_halo(x[:, :, 0], x[:, :, -1], shards)
        if previous is None and following is None:
            return None
        frames = [f.unsqueeze(2) for f in (previous,) if f is not None] + [x]
        frames += [f.unsqueeze(2) for f in (following,) if f is not None]
        return (torch.cat(frames, dim=2),) + tuple(args[1:])

    def after(self, conv: torch.nn.Module, args: tuple, output: torch.Tensor):
        shards = _attn1_split(self.attn)
        if shards is None or shards.world == 1:  # one rank: no neighbours, nothing was added
            return None
        # exchange_halo gave one frame from each neighbour: none before rank 0, none after the last rank
        before, after = int(shards.rank > 0), int(shards.rank < shards.world - 1)
        return output[:, :, before:output.shape[2] - after].contiguous()


class SplitLayers:
    """What :func:`split_layers` did to one model; calling it undoes all of it (``remove()``)."""

    def __init__(self) -> None:
        self.processors: list[tuple[torch.nn.Module, Any]] = []
        self.handles: list = []

    def __call__(self) -> None:
        while self.handles:
            self.handles.pop().remove()
        while self.processors:
            module, original = self.processors.pop()
            module.processor = original


def _swap(module: torch.nn.Module, stock: type, ours: type, undo: SplitLayers) -> None:
    original = module.processor
    if type(original) is not stock:  # a processor of the user's own: the entry refuses to split over it
        return
    replacement = ours()
    replacement.__dict__.update({k: v for k, v in vars(original).items() if k != "_parallel_config"})
    module.processor = replacement
    undo.processors.append((module, original))


def split_layers(model: torch.nn.Module) -> Optional[Callable[[], None]]:
    """Make ``model``'s layers split-aware (idle until it is split; no bit changes before): the processor swaps and
    hooks of the module docstring. Returns the undo. (A model split before ``apply`` never gets here: apply
    refuses it, accelpatch.parallel.lifecycle.)"""
    undo = SplitLayers()
    try:
        for block in model.transformer_blocks:
            _swap(block.attn1, SanaLinearAttnProcessor3_0, SplitLinearAttnProcessor, undo)
            if getattr(block, "attn2", None) is not None:
                _swap(block.attn2, SanaAttnProcessor2_0, LocalCrossAttnProcessor, undo)
            undo.handles.append(block.register_forward_pre_hook(LocalFrames(), with_kwargs=True))
            halo = TemporalHalo(block.attn1)
            undo.handles.append(block.ff.conv_temp.register_forward_pre_hook(halo.before))
            undo.handles.append(block.ff.conv_temp.register_forward_hook(halo.after))
        undo.handles.append(model.register_forward_pre_hook(SplitEntry(), with_kwargs=True))
    except BaseException:
        undo()
        raise
    return undo
