"""HunyuanVideo 1.5's ``high``-tier fast paths (see :mod:`.adapter` for where they sit and why): the Sol-Attn sparse path on
the joint attention over the valid prefix (:class:`HunyuanVideo15SolAttention`) and the always-dense text refiner
attention of the ``sol_attn`` backend.
"""
from __future__ import annotations

from typing import Union

import torch

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import Declined
from accelpatch.core.sites import Site, bind_call
from accelpatch.sol_attn.sites import AlwaysDense, DispatchSelfAttention, SparseCall
from accelpatch.core.tiers import Tier
from accelpatch.models.hunyuan_video15.lossless import ATTENTION_RESTATES

SOL_FUSION = QualityGatedFusion.named("hunyuan_video15_sol_attn", Tier.HIGH)
REFINER_FUSION = QualityGatedFusion.named("hunyuan_video15_refiner_attention", Tier.HIGH)

REFINER_DENSE = "text-only token refiner attention (masked) stays dense: Sol-Attn covers the video self-attention"
NO_JOINT = ("no encoder_hidden_states or attention_mask: not the joint video+text call HunyuanVideo 1.5 makes "
            "(its processor needs both)")
MASK_SHAPE = "the attention_mask is not [batch, text tokens]: not the layout HunyuanVideo 1.5's forward builds"
UNEVEN_TEXT = ("the batch rows have different numbers of valid text tokens: the sparse path needs one valid prefix "
               "(diffusers' guider runs conditional and unconditional batches separately, so this is rare)")
NOT_PREFIX = ("the valid text tokens are not first in the text stream (HunyuanVideo 1.5's forward orders them "
              "so): the mask is not a prefix the sparse path can drop")
NO_CP = "HunyuanVideo 1.5 has no _cp_plan: the sparse path does not run under a parallel config"


def _hy():
    from diffusers.models.transformers import transformer_hunyuan_video15

    return transformer_hunyuan_video15


def _joint_qkv(attn, hidden: torch.Tensor, encoder: torch.Tensor, rotary) -> tuple:
    """q, k, v [B, Tv + Te, H, D] as ``HunyuanVideo15AttnProcessor2_0`` hands them to the dispatcher: projections,
    the per-head RMSNorms, diffusers' own ``apply_rotary_emb`` on the video rows, then the text rows appended."""
    from diffusers.models.embeddings import apply_rotary_emb

    q, k, v = (proj(hidden).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
    q, k = attn.norm_q(q), attn.norm_k(k)
    if rotary is not None:
        q, k = apply_rotary_emb(q, rotary, sequence_dim=1), apply_rotary_emb(k, rotary, sequence_dim=1)
    eq, ek, ev = (proj(encoder).unflatten(2, (attn.heads, -1))
                  for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    if attn.norm_added_q is not None:
        eq = attn.norm_added_q(eq)
    if attn.norm_added_k is not None:
        ek = attn.norm_added_k(ek)
    return tuple(torch.cat(pair, dim=1) for pair in ((q, eq), (k, ek), (v, ev)))


class HunyuanVideo15SolAttention(DispatchSelfAttention):
    """Sol-Attn on HunyuanVideo 1.5's joint attention, over the valid prefix (see the module docstring)."""

    fusion = SOL_FUSION
    description = ("block-sparse Sol-Attn with rank-1 correction on HunyuanVideo 1.5's video rows; valid text as "
                   "exact sink (and dense queries)")
    call_names = ("hidden_states", "encoder_hidden_states", "attention_mask", "image_rotary_emb")
    policy_reasons = DispatchSelfAttention.policy_reasons + (NO_JOINT, MASK_SHAPE, UNEVEN_TEXT, NOT_PREFIX, NO_CP)
    restates = ATTENTION_RESTATES  # the RoPE is diffusers' apply_rotary_emb, called

    def processor_class(self) -> type:
        return _hy().HunyuanVideo15AttnProcessor2_0

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Declined]:
        call = bind_call(args, kwargs, self.call_names)
        hidden, encoder, mask = call["hidden_states"], call["encoder_hidden_states"], call["attention_mask"]
        if getattr(attn.processor, "_parallel_config", None) is not None:
            return Declined(NO_CP)
        if encoder is None or mask is None:
            return Declined(NO_JOINT)
        if mask.dim() != 2 or tuple(mask.shape) != tuple(encoder.shape[:2]):
            return Declined(MASK_SHAPE)
        valid = mask.bool()
        counts = valid.sum(dim=1)
        prefix_of_row = torch.arange(valid.shape[1], device=valid.device) < counts[:, None]
        # one read of the mask's values per call (a device sync; a graph break under torch.compile)
        text, even, first = torch.stack([counts[0], (counts == counts[0]).all().long(),
                                         (valid == prefix_of_row).all().long()]).tolist()
        if not even:
            return Declined(UNEVEN_TEXT)
        if not first:
            return Declined(NOT_PREFIX)
        query, key, value = _joint_qkv(attn, hidden, encoder, call["image_rotary_emb"])
        video, total = hidden.shape[1], query.shape[1]
        prefix = video + text
        backend = getattr(attn.processor, "_attention_backend", None)
        dispatch = _hy().dispatch_attention_fn

        def finish(out: torch.Tensor):
            if prefix < total:  # padding rows attend to nothing: the model's masked dense attention for them
                blocked = torch.zeros(query.shape[0], 1, total - prefix, total - prefix, dtype=torch.bool,
                                      device=query.device)
                padding = dispatch(query[:, prefix:], key[:, prefix:], value[:, prefix:], attn_mask=blocked,
                                   dropout_p=0.0, is_causal=False, backend=backend, parallel_config=None)
                out = torch.cat([out, padding.to(out.dtype)], dim=1)
            out = out.flatten(2, 3).to(query.dtype)
            hidden_out, encoder_out = out[:, :video], out[:, video:]
            hidden_out = attn.to_out[1](attn.to_out[0](hidden_out))
            return hidden_out, attn.to_add_out(encoder_out)

        sparse = SparseCall(query[:, :prefix], key[:, :prefix], value[:, :prefix], finish, dense_backend=backend)
        if text:
            sparse.sink_tokens, sparse.sink_start = text, video
            if site.model.backend.dense_rows == "text_audio":
                # the valid text rows over the whole sequence under their mask rows, as the processor computes
                # them (the same work as over the prefix, and diffusers' bits for these rows)
                keys = (torch.arange(total, device=query.device) < prefix).expand(query.shape[0], 1, text, total)
                sparse.dense_rows = slice(video, prefix)
                sparse.dense_attention = lambda q, k, v: dispatch(
                    q, key, value, attn_mask=keys, dropout_p=0.0, is_causal=False, backend=backend,
                    parallel_config=None)
        return sparse


SOL_ATTENTION = HunyuanVideo15SolAttention()
REFINER_DENSE_PATH = AlwaysDense(REFINER_FUSION, "HunyuanVideo 1.5 text token refiner attention (always dense)",
                                 REFINER_DENSE)
