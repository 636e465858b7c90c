"""HunyuanVideo 1.5 (diffusers ``HunyuanVideo15Transformer3DModel``): its lossless block fusion, and the ``sol_attn``
backend.

At every tier from ``lossless`` (the default without a backend), ``transformer_blocks.N`` carry the block fusion
of :mod:`.fused` (both streams' AdaLN modulations and gated residual adds as verified fused ops) and
``transformer_blocks.N.attn`` the joint attention with the video q/k RoPE as one verified fused op
(``rope_pair_per_channel``); the Sol-Attn site, where there is one, sits above that RoPE fusion on the same module
(its own q/k/v take diffusers' ``apply_rotary_emb``, the same bits), and the attention sites are the same with or
without the block fusion around them.

Every dual-stream block's ``transformer_blocks.N.attn`` is one joint attention: the video tokens (3-D RoPE on q
and k) followed by the text/image tokens, which the model orders valid first, then padding, under a mask that lets
valid tokens attend to valid tokens only. With ``sol_attn`` the Sol-Attn sparse path (``high``) runs on the valid
prefix (video + valid text rows) without a mask, which is that mask exactly: the valid text keys are the exact
sink, and with ``dense_rows="text_audio"`` (default) the valid text query rows are recomputed by the model's own
masked dense attention (diffusers' bits for those rows), as MiniMax-H3's text rows, so only video query rows are
sparse. The padding rows (attending to nothing) run the model's masked dense attention over the padding keys.
A mask that is not that layout (valid tokens not first, or a different count per batch row) declines with a
counted reason. ``context_embedder.token_refiner.refiner_blocks.N.attn``
(text-only, masked) are sites that always stay dense, counted. Dense steps, dense layers and every call that does
not fit run diffusers' ``HunyuanVideo15AttnProcessor2_0`` unchanged. ``cache=`` puts the guarded step cache
(FirstBlockCache or MagCache) on ``transformer_blocks``, registered as blocks returning (video, text):
FirstBlockCache decides on the video residual and reuses both streams' cached residuals; MagCache passes the text
stream through a skipped step unchanged, which the model never reads after its blocks (only the video goes on to
``norm_out``).

The sparse path slices the sequence at the valid-text count, which depends on the mask's values: inside a
``torch.compile`` graph that is a graph break (regional compile works; ``fullgraph=True`` does not on ``high``).

Defaults, and where each comes from: nothing published that we found gives HunyuanVideo-specific dense guards.
* **tau = 1.0** (the backend's default): the Sol-Attn paper (Li et al., arXiv:2607.24027, via a secondary summary)
  reports "HunyuanVideo" at 2.12x end to end and 85.8 % sparsity, without the settings or the model version (1.0
  or 1.5) in our sources; 85.8 % is close to the Gaussian estimate 1 - Phi(tau) ~ 16 % exact blocks at tau = 1.
* **dense_steps = 10** and **dense_layers = 0, 1**: SGLang's ``sol_attn`` policy defaults (the backend's, and
  MiniMax-H3's and Wan's), not HunyuanVideo measurements.
So the defaults are unmeasured on HunyuanVideo 1.5: ``accelpatch validate``/``tune`` must confirm them.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.sites import Decline, Site, bind_call
from accelpatch.sol_attn.sites import AlwaysDense, DispatchSelfAttention, SparseCall
from accelpatch.core.tiers import Tier
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.models.hunyuan_video15.lossless import ATTENTION_RESTATES, FUSED_ATTENTION, FUSED_BLOCK

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

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Decline]:
        call = bind_call(args, kwargs, self.call_names)
        hidden, encoder, mask = call["hidden_states"], call["encoder_hidden_states"], call["attention_mask"]
        if getattr(attn.processor, "_parallel_config", None) is not None:
            return Decline(NO_CP)
        if encoder is None or mask is None:
            return Decline(NO_JOINT)
        if mask.dim() != 2 or tuple(mask.shape) != tuple(encoder.shape[:2]):
            return Decline(MASK_SHAPE)
        valid = mask.bool()
        counts = valid.sum(dim=1)
        prefix_of_row = torch.arange(valid.shape[1], device=valid.device) < counts[:, None]
        # one read of the mask's values per call (a device sync; a graph break under torch.compile)
        text, even, first = torch.stack([counts[0], (counts == counts[0]).all().long(),
                                         (valid == prefix_of_row).all().long()]).tolist()
        if not even:
            return Decline(UNEVEN_TEXT)
        if not first:
            return Decline(NOT_PREFIX)
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

#: which module carries which fast path: the block fusion on every ``transformer_blocks.N`` and the RoPE fusion on
#: every ``transformer_blocks.N.attn`` (lossless, any backend or none); with ``sol_attn`` the Sol-Attn path on the
#: joint attention (high, stacked above the RoPE fusion by tier) and the always-dense text refiner attention (high)
SITES = (
    SiteRule(r"transformer_blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", FUSED_ATTENTION),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"context_embedder\.token_refiner\.refiner_blocks\.(\d+)\.attn", REFINER_DENSE_PATH, backend="sol_attn"),
)


class HunyuanVideo15Adapter(SolAttnAdapter):
    family = "HunyuanVideo 1.5"
    model_classes = (("diffusers", "HunyuanVideo15Transformer3DModel"),)
    sites = SITES
    block_list = "transformer_blocks"
    block_noun = "dual-stream transformer blocks"
    # (video, text), the second stream entering as encoder_hidden_states
    cache = CacheSupport(methods=("first_block", "mag"), blocks="transformer_blocks", block_outputs=(0, 1))

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Every dual-stream block has one joint ``attn`` (an ``Attention`` with added q/k/v projections and
        ``to_add_out``) with diffusers' ``HunyuanVideo15AttnProcessor2_0``; the model computes the RoPE in
        ``rope``; the text refiner's blocks each have an ``attn``."""
        hy = _hy()
        from diffusers.models.attention_processor import Attention

        blocks = getattr(model, self.block_list, None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            return f"it has no non-empty ModuleList `{self.block_list}`"
        if not isinstance(getattr(model, "rope", None), hy.HunyuanVideo15RotaryPosEmbed):
            return f"`rope` is {type(getattr(model, 'rope', None)).__name__}, expected HunyuanVideo15RotaryPosEmbed"
        for i, block in enumerate(blocks):
            attn, where = getattr(block, "attn", None), f"{self.block_list}.{i}.attn"
            if not isinstance(attn, Attention):
                return f"{where} is {type(attn).__name__}, expected Attention"
            if type(attn.processor) is not hy.HunyuanVideo15AttnProcessor2_0:
                return f"{where}.processor is {type(attn.processor).__name__}, expected HunyuanVideo15AttnProcessor2_0"
            if attn.add_q_proj is None or getattr(attn, "to_add_out", None) is None or attn.to_out is None:
                return f"{where} is not a joint attention (no add_q_proj/to_add_out/to_out)"
        refiner = getattr(getattr(getattr(model, "context_embedder", None), "token_refiner", None),
                          "refiner_blocks", None)
        if not isinstance(refiner, torch.nn.ModuleList):
            return "it has no ModuleList `context_embedder.token_refiner.refiner_blocks`"
        return None
