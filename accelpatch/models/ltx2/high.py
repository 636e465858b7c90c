"""LTX-2's ``high``-tier fast paths (see :mod:`.adapter` for where they sit and why): the Sol-Attn sparse path on the
video self-attention (:class:`LTX2SolAttention`), and the always-dense audio self-attention and cross-attention sites
of the ``sol_attn`` backend.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import Declined, NotApplicable
from accelpatch.core.sites import Site, bind_call
from accelpatch.sol_attn.sites import AlwaysDense, DispatchSelfAttention, SparseCall, dense_policy
from accelpatch.core.tiers import Tier
from accelpatch.models.ltx2.lossless import ATTENTION_RESTATES, gate_and_project_out, processor_mismatch, project_qkv

SOL_FUSION = QualityGatedFusion.named("ltx2_sol_attn", Tier.HIGH)
DENSE_FUSION = QualityGatedFusion.named("ltx2_dense_attention", Tier.HIGH)

AUDIO_DENSE = "audio self-attention stays dense: not measured safe under Sol-Attn"
CROSS_DENSE = ("cross-attention (text, audio-to-video, video-to-audio) stays dense: Sol-Attn covers "
               "self-attention only")
PERTURBED_CALL = "an STG perturbation_mask was given (spatio_temporal_guidance_blocks): the processor runs it"

ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")


def _ltx2():
    from diffusers.models.transformers import transformer_ltx2

    return transformer_ltx2


class LTX2SolAttention(DispatchSelfAttention):
    """Sol-Attn on LTX-2's video self-attention: q/k/v as ``LTX2AudioVideoAttnProcessor`` (or LTX-2.3's
    ``LTX2PerturbedAttnProcessor`` outside STG blocks) hands them to the dispatcher, then its gates and ``to_out``."""

    fusion = SOL_FUSION
    description = "block-sparse Sol-Attn with rank-1 correction on LTX-2's video self-attention"
    call_names = ("hidden_states", "encoder_hidden_states", "attention_mask", "query_rotary_emb", "key_rotary_emb")
    policy_reasons = DispatchSelfAttention.policy_reasons + (PERTURBED_CALL,)
    restates = ATTENTION_RESTATES

    def processor_class(self) -> type:
        return _ltx2().LTX2AudioVideoAttnProcessor

    def processor_mismatch(self, module: torch.nn.Module) -> Optional[str]:
        return processor_mismatch(module)

    def project(self, attn, call):
        """The fused attention's :func:`~.lossless.project_qkv` with diffusers' own RoPE functions (interleaved or
        split, as ``attn.rope_type`` says; none for another type, as in the processor)."""
        ltx2 = _ltx2()
        rotate = {"interleaved": ltx2.apply_interleaved_rotary_emb,
                  "split": ltx2.apply_split_rotary_emb}.get(attn.rope_type)

        def rope(query, key, q_tables, k_tables):
            return (rotate(query, q_tables), rotate(key, k_tables)) if rotate is not None else (query, key)

        return project_qkv(attn, call["hidden_states"], call["query_rotary_emb"], call["key_rotary_emb"], rope)

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        """An STG-perturbed call (LTX-2.3's guidance, chosen by the caller) is dense by policy, not a failure: it
        runs the processor, counted after the dense steps and layers."""
        call = bind_call(args, kwargs, self.call_names)
        perturbed = call.get("all_perturbed")
        if call.get("perturbation_mask") is not None or (perturbed is not None and perturbed is not False):
            verdict = dense_policy(site.model.backend, site)
            return verdict if verdict is not None else NotApplicable(PERTURBED_CALL)
        return super().run(attn, site, args, kwargs)

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Declined]:
        call = bind_call(args, kwargs, self.call_names)
        sparse = super().prepare(attn, site, args, kwargs)
        if isinstance(sparse, Declined) or attn.to_gate_logits is None:
            return sparse
        gate_logits = attn.to_gate_logits(call["hidden_states"])
        query = sparse.query

        def gated_finish(out: torch.Tensor) -> torch.Tensor:  # LTX-2.3's per-head gates, as the processor does
            return gate_and_project_out(attn, out.flatten(2, 3).to(query.dtype), gate_logits)

        sparse.finish = gated_finish
        return sparse


SOL_ATTENTION = LTX2SolAttention()
AUDIO_DENSE_PATH = AlwaysDense(DENSE_FUSION, "LTX-2 audio self-attention (always dense)", AUDIO_DENSE)
CROSS_DENSE_PATH = AlwaysDense(DENSE_FUSION, "LTX-2 cross-attention (always dense)", CROSS_DENSE)
