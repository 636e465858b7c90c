"""LTX-2's lossless block fusion: ``LTX2VideoTransformerBlock.forward`` restated with its element-wise chains fused.

LTX-2 runs its AdaLN chains in the activations' dtype: the tables are parameters of the model's dtype, ``temb`` is
built in it (``hidden_dtype``), so every row and every operand of a chain has one dtype and each op rounds once in
it. The rows are [B, 1, C] (one timestep per sample) or [B, N, C] (per-token timesteps), unbound views of a
[B, T, k, C] sum, as ``get_mod_params`` builds them. Fused, with the shared ops (accelpatch.fused_ops):

- every modulation ``x * (1 + scale) + shift``: :data:`~accelpatch.fused_ops.MODULATE` — both streams' attention
  and feed-forward ones, the four a2v/v2a query/key ones and, with LTX-2.3's cross-attention AdaLN, the text
  query's and the prompt key/value's (``encoder_hidden_states * (1 + scale) + shift``);
- every gated residual add: :data:`~accelpatch.fused_ops.GATED_RESIDUAL` as ``residual + gate * out`` — both
  streams' attention and feed-forward ones (diffusers writes ``out * gate``: a product is commutative in IEEE
  arithmetic), the a2v/v2a ones, and LTX-2.3's text cross-attention gate (``out * gate`` then the add: the same two
  roundings).

The norms, the six attentions (so their sites, Sol-Attn's among them, stay below this one), the feed-forwards and
the plain residual adds stay diffusers' own. The RoPE inside the attentions is not fused yet: its interleaved form
(``apply_interleaved_rotary_emb``, float32 products on [B, S, C] tables with a batch dim) is the chain of
:data:`~accelpatch.fused_ops.ROPE_PAIR_PER_CHANNEL` on the [B, S, 1, C] views (tests/ops/
test_fused_cpu_rope_pair_per_channel.py checks it bit for bit), which a restated ``attn1`` could call; the split
form (``addcmul_``) has no shared op.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

from ...fused_ops import GATED_RESIDUAL, MODULATE
from ...gate import QualityGatedFusion
from ...sites.base import FusedOpsPath, Site, restated_class_mismatch
from ...tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("ltx2_fused_block", Tier.LOSSLESS)

#: ``LTX2VideoTransformerBlock.forward``'s parameters (diffusers 0.42.1) and the defaults that are not None; a
#: block whose forward takes others is refused at apply (its restatement would not be this one)
CALL_NAMES = (
    "hidden_states", "audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states", "temb",
    "temb_audio", "temb_ca_scale_shift", "temb_ca_audio_scale_shift", "temb_ca_gate", "temb_ca_audio_gate",
    "temb_prompt", "temb_prompt_audio", "video_rotary_emb", "audio_rotary_emb", "ca_video_rotary_emb",
    "ca_audio_rotary_emb", "encoder_attention_mask", "audio_encoder_attention_mask", "self_attention_mask",
    "audio_self_attention_mask", "a2v_cross_attention_mask", "v2a_cross_attention_mask", "use_a2v_cross_attention",
    "use_v2a_cross_attention", "perturbation_mask", "all_perturbed")
DEFAULTS = {"use_a2v_cross_attention": True, "use_v2a_cross_attention": True}


def _ltx2_block_class() -> type:
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    return LTX2VideoTransformerBlock


def signature_mismatch(block_class: type) -> Optional[str]:
    """Why ``block_class.forward``'s parameters are not :data:`CALL_NAMES` with :data:`DEFAULTS` (None if they are)."""
    params = list(inspect.signature(block_class.forward).parameters.values())[1:]
    names = tuple(p.name for p in params)
    if names != CALL_NAMES:
        return f"its forward takes ({', '.join(names)}), this fast path restates ({', '.join(CALL_NAMES)})"
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty
                and p.default is not None}
    if defaults != DEFAULTS:
        return f"its forward's defaults are {defaults}, this fast path restates {DEFAULTS}"
    return None


def bind(args: tuple, kwargs: dict) -> dict:
    """A block call's arguments by name, with the forward's defaults."""
    call = dict.fromkeys(CALL_NAMES)
    call.update(DEFAULTS)
    call.update(zip(CALL_NAMES, args))
    call.update(kwargs)
    return call


def _self_attention(block, attn, call: dict, hidden, rotary_emb, mask):
    """A self-attention call as the block makes it (LTX-2.3's STG processor also gets the perturbation)."""
    args = {"hidden_states": hidden, "encoder_hidden_states": None, "query_rotary_emb": rotary_emb,
            "attention_mask": mask}
    if block.perturbed_attn:
        args["perturbation_mask"] = call["perturbation_mask"]
        args["all_perturbed"] = call["all_perturbed"]
    return attn(**args)


def _static_prompt_rows(table: torch.Tensor, like: torch.Tensor):
    """LTX-2.3's prompt key/value rows without ``temb_prompt`` (KV-cacheable cross-attention): the table alone."""
    return table[None, None].to(device=like.device, dtype=like.dtype).unbind(dim=2)


class LTX2FusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = ("block with both streams' AdaLN modulations, the a2v/v2a modulations and every gated residual "
                   "add fused (bit-exact)")
    fused_ops = (MODULATE, GATED_RESIDUAL)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, _ltx2_block_class()) or signature_mismatch(site.original_class)

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind(args, kwargs)
        hidden_states, audio_hidden_states = call["hidden_states"], call["audio_hidden_states"]
        encoder_hidden_states = call["encoder_hidden_states"]
        audio_encoder_hidden_states = call["audio_encoder_hidden_states"]
        batch_size = hidden_states.size(0)

        # 1.1. Video self-attention
        video_ada_params = block.get_mod_params(block.scale_shift_table, call["temb"], batch_size)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = video_ada_params[:6]
        if block.video_cross_attn_adaln:
            shift_text_q, scale_text_q, gate_text_q = video_ada_params[6:9]
        norm_hidden_states = MODULATE(site, block.norm1(hidden_states), scale_msa, shift_msa)
        attn_hidden_states = _self_attention(block, block.attn1, call, norm_hidden_states,
                                             call["video_rotary_emb"], call["self_attention_mask"])
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_msa, attn_hidden_states)

        # 1.2. Audio self-attention
        audio_ada_params = block.get_mod_params(block.audio_scale_shift_table, call["temb_audio"], batch_size)
        (audio_shift_msa, audio_scale_msa, audio_gate_msa, audio_shift_mlp, audio_scale_mlp,
         audio_gate_mlp) = audio_ada_params[:6]
        if block.audio_cross_attn_adaln:
            audio_shift_text_q, audio_scale_text_q, audio_gate_text_q = audio_ada_params[6:9]
        norm_audio_hidden_states = MODULATE(site, block.audio_norm1(audio_hidden_states), audio_scale_msa,
                                            audio_shift_msa)
        attn_audio_hidden_states = _self_attention(block, block.audio_attn1, call, norm_audio_hidden_states,
                                                   call["audio_rotary_emb"], call["audio_self_attention_mask"])
        audio_hidden_states = GATED_RESIDUAL(site, audio_hidden_states, audio_gate_msa, attn_audio_hidden_states)

        # 2. Text cross-attention, with LTX-2.3's prompt modulation where the config has it
        if block.cross_attn_adaln:
            if call["temb_prompt"] is not None:
                shift_text_kv, scale_text_kv = block.get_mod_params(
                    block.prompt_scale_shift_table, call["temb_prompt"], batch_size)
            else:
                shift_text_kv, scale_text_kv = _static_prompt_rows(block.prompt_scale_shift_table, hidden_states)
            if call["temb_prompt_audio"] is not None:
                audio_shift_text_kv, audio_scale_text_kv = block.get_mod_params(
                    block.audio_prompt_scale_shift_table, call["temb_prompt_audio"], batch_size)
            else:
                audio_shift_text_kv, audio_scale_text_kv = _static_prompt_rows(
                    block.audio_prompt_scale_shift_table, audio_hidden_states)

        norm_hidden_states = block.norm2(hidden_states)
        if block.video_cross_attn_adaln:
            norm_hidden_states = MODULATE(site, norm_hidden_states, scale_text_q, shift_text_q)
        if block.cross_attn_adaln:
            encoder_hidden_states = MODULATE(site, encoder_hidden_states, scale_text_kv, shift_text_kv)
        attn_hidden_states = block.attn2(norm_hidden_states, encoder_hidden_states=encoder_hidden_states,
                                         query_rotary_emb=None, attention_mask=call["encoder_attention_mask"])
        if block.video_cross_attn_adaln:
            hidden_states = GATED_RESIDUAL(site, hidden_states, gate_text_q, attn_hidden_states)
        else:
            hidden_states = hidden_states + attn_hidden_states

        norm_audio_hidden_states = block.audio_norm2(audio_hidden_states)
        if block.audio_cross_attn_adaln:
            norm_audio_hidden_states = MODULATE(site, norm_audio_hidden_states, audio_scale_text_q,
                                                audio_shift_text_q)
        if block.cross_attn_adaln:
            audio_encoder_hidden_states = MODULATE(site, audio_encoder_hidden_states, audio_scale_text_kv,
                                                   audio_shift_text_kv)
        attn_audio_hidden_states = block.audio_attn2(
            norm_audio_hidden_states, encoder_hidden_states=audio_encoder_hidden_states, query_rotary_emb=None,
            attention_mask=call["audio_encoder_attention_mask"])
        if block.audio_cross_attn_adaln:
            audio_hidden_states = GATED_RESIDUAL(site, audio_hidden_states, audio_gate_text_q,
                                                 attn_audio_hidden_states)
        else:
            audio_hidden_states = audio_hidden_states + attn_audio_hidden_states

        # 3. Audio-to-video and video-to-audio cross-attention
        use_a2v, use_v2a = call["use_a2v_cross_attention"], call["use_v2a_cross_attention"]
        if use_a2v or use_v2a:
            norm_hidden_states = block.audio_to_video_norm(hidden_states)
            norm_audio_hidden_states = block.video_to_audio_norm(audio_hidden_states)

            video_table = block.video_a2v_cross_attn_scale_shift_table
            video_a2v_scale, video_a2v_shift, video_v2a_scale, video_v2a_shift = block.get_mod_params(
                video_table[:4, :], call["temb_ca_scale_shift"], batch_size)
            a2v_gate = block.get_mod_params(video_table[4:, :], call["temb_ca_gate"], batch_size)[0].squeeze(2)
            audio_table = block.audio_a2v_cross_attn_scale_shift_table
            audio_a2v_scale, audio_a2v_shift, audio_v2a_scale, audio_v2a_shift = block.get_mod_params(
                audio_table[:4, :], call["temb_ca_audio_scale_shift"], batch_size)
            v2a_gate = block.get_mod_params(audio_table[4:, :], call["temb_ca_audio_gate"], batch_size)[0].squeeze(2)

            if use_a2v:
                mod_video = MODULATE(site, norm_hidden_states, video_a2v_scale.squeeze(2),
                                     video_a2v_shift.squeeze(2))
                mod_audio = MODULATE(site, norm_audio_hidden_states, audio_a2v_scale.squeeze(2),
                                     audio_a2v_shift.squeeze(2))
                a2v_attn_hidden_states = block.audio_to_video_attn(
                    mod_video, encoder_hidden_states=mod_audio, query_rotary_emb=call["ca_video_rotary_emb"],
                    key_rotary_emb=call["ca_audio_rotary_emb"], attention_mask=call["a2v_cross_attention_mask"])
                hidden_states = GATED_RESIDUAL(site, hidden_states, a2v_gate, a2v_attn_hidden_states)

            if use_v2a:
                mod_video = MODULATE(site, norm_hidden_states, video_v2a_scale.squeeze(2),
                                     video_v2a_shift.squeeze(2))
                mod_audio = MODULATE(site, norm_audio_hidden_states, audio_v2a_scale.squeeze(2),
                                     audio_v2a_shift.squeeze(2))
                v2a_attn_hidden_states = block.video_to_audio_attn(
                    mod_audio, encoder_hidden_states=mod_video, query_rotary_emb=call["ca_audio_rotary_emb"],
                    key_rotary_emb=call["ca_video_rotary_emb"], attention_mask=call["v2a_cross_attention_mask"])
                audio_hidden_states = GATED_RESIDUAL(site, audio_hidden_states, v2a_gate, v2a_attn_hidden_states)

        # 4. Feed-forward
        norm_hidden_states = MODULATE(site, block.norm3(hidden_states), scale_mlp, shift_mlp)
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_mlp, block.ff(norm_hidden_states))
        norm_audio_hidden_states = MODULATE(site, block.audio_norm3(audio_hidden_states), audio_scale_mlp,
                                            audio_shift_mlp)
        audio_hidden_states = GATED_RESIDUAL(site, audio_hidden_states, audio_gate_mlp,
                                             block.audio_ff(norm_audio_hidden_states))
        return hidden_states, audio_hidden_states


FUSED_BLOCK = LTX2FusedBlock()
