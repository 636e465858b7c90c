"""SANA-Video 2.0 split over ranks by tokens (diffusers' context parallelism): the plan its ``enable_parallelism``
applies, and the checks and the one split its hooks cannot make.

Tokens are split after the patch embedding. They are in (frame, height, width) raster order, so an equal token
split is a split into whole frames exactly when the frame count divides by the world size. The linear attention
sums its token statistics over the ranks (``attention.gated_linear_attention``), the anchors exchange heads through
diffusers' Ulysses attention (or their own exchange: BF16 on the wire, zero heads padding a degree that does not
divide them), the cross-attention stays local (the text is on every rank), the MLPs and the Block
Attention Residuals are per token, and the output is gathered before the unpatchify. Inference only: the
collectives carry no gradient.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

from accelpatch.parallel.sequence import SequenceShards, whole_frames_error

#: diffusers' plan: the tokens after ``x_embedder``, each block's RoPE table (a tensor argument, not a module
#: output: [N, D/2], split on dim 0 with the tokens), the output gathered at ``final_layer.linear`` (the unpatchify
#: reshape needs every token). The per-frame timestep embeddings are split in the model's forward
#: (:func:`local_frames`), since T2V's [B, 6C] ones must stay whole and a plan entry cannot tell the two apart
#: without diffusers' "ndim mismatch" warning.
CP_PLAN = {
    "x_embedder": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
    "blocks.*": {"rotary_emb": ContextParallelInput(split_dim=0, expected_dims=2)},
    "final_layer.linear": ContextParallelOutput(gather_dim=1, expected_dims=3),
}

MODEL = "SanaVideo2Transformer3DModel"


def check_parallel_config(model: torch.nn.Module, config: Any) -> None:
    """Refuse, before diffusers touches the model, a context-parallel config the anchors cannot run under: ring
    attention for FP32 anchors (it merges partial results by their log-sum-exp, and ``native``, the only
    context-parallel backend that takes FP32, returns none). A Ulysses degree that does not divide the anchor heads
    runs: the anchors pad their heads with zero heads (``attention.anchor_core``)."""
    cp = getattr(config, "context_parallel_config", config)
    ring = getattr(cp, "ring_degree", 1) or 1
    anchors = [block.attn for block in model.blocks if block.attention_type == "softmax"]
    if not anchors:
        return
    if ring > 1 and any(attn.fp32_attention for attn in anchors):
        raise ValueError(
            f"{MODEL}: ring_degree={ring} cannot run its FP32 anchor attention: ring attention merges partial "
            "results by their log-sum-exp, and the only context-parallel backend that takes FP32 (native) returns "
            "none. Use ulysses_degree instead (ring_degree=1).")


def check_split(frames: int, tokens: int, per_frame: bool, shards: SequenceShards) -> None:
    """Refuse an input the token split would get wrong, with the counts that work: per-frame timesteps
    (image-to-video) modulate whole frames, so each rank needs whole frames (``frames % world == 0``); otherwise
    the tokens need only divide evenly. Uneven token shards (diffusers' ``ulysses_anything``) are refused too: on
    gloo diffusers' uneven gather fails, so they could not be checked."""
    if shards.world == 1:
        return
    if per_frame:
        reason = whole_frames_error(frames, shards.world, MODEL)
        if reason is not None:
            raise ValueError(reason + " (per-frame timesteps modulate whole frames)")
        return
    if tokens % shards.world:
        raise ValueError(f"{MODEL}: {tokens} latent tokens do not split evenly over {shards.world} ranks (uneven "
                         f"shards are not supported, ulysses_anything included); use a world size that divides "
                         f"{tokens}, or a latent frame count divisible by {shards.world}")


def local_frames(t: torch.Tensor, shards: Optional[SequenceShards]) -> torch.Tensor:
    """This rank's frames of a per-frame timestep embedding [B, 1, F, ·] (the frames its tokens belong to)."""
    if shards is None:
        return t
    return t.chunk(shards.world, dim=2)[shards.rank]


def inference_only_error(shards: Optional[SequenceShards]) -> Optional[str]:
    """Why this call cannot run split (None when it can): the collectives carry no gradient."""
    if shards is not None and torch.is_grad_enabled():
        return (f"{MODEL} runs split over ranks for inference only: its token-sum all-reduce carries no gradient. "
                "Call it under torch.no_grad() (diffusers' pipelines do).")
    return None
