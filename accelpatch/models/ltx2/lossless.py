"""LTX-2's lossless block fusion: ``LTX2VideoTransformerBlock.forward`` restated with its element-wise chains fused.

LTX-2 runs its AdaLN chains in the activations' dtype: the tables are parameters of the model's dtype, ``temb`` is
built in it (``hidden_dtype``), so every row and every operand of a chain has one dtype and each op rounds once in
it. The rows are [B, 1, C] (one timestep per sample) or [B, N, C] (per-token timesteps), unbound views of a
[B, T, k, C] sum, as ``get_mod_params`` builds them. Fused, with the shared ops (accelpatch.lossless.ops):

- every modulation ``x * (1 + scale) + shift``: :data:`~accelpatch.lossless.ops.MODULATE` — both streams' attention
  and feed-forward ones, the four a2v/v2a query/key ones and, with LTX-2.3's cross-attention AdaLN, the text
  query's and the prompt key/value's (``encoder_hidden_states * (1 + scale) + shift``);
- every gated residual add: :data:`~accelpatch.lossless.ops.GATED_RESIDUAL` as ``residual + gate * out`` — both
  streams' attention and feed-forward ones (diffusers writes ``out * gate``: a product is commutative in IEEE
  arithmetic), the a2v/v2a ones, and LTX-2.3's text cross-attention gate (``out * gate`` then the add: the same two
  roundings).

The norms, the six attentions (so their sites, Sol-Attn's among them, stay below this one), the feed-forwards and
the plain residual adds stay diffusers' own.

``transformer_blocks.N.attn1`` (the video self-attention) carries a second fusion: ``LTX2AudioVideoAttnProcessor``
(and ``LTX2PerturbedAttnProcessor`` outside STG blocks, with LTX-2.3's per-head gates) restated for self-attention
calls, the RoPE of q and k as one verified op: interleaved (``apply_interleaved_rotary_emb``: float32 products on
[B, S, C] tables) as :data:`~accelpatch.lossless.ops.ROPE_PAIR_PER_CHANNEL` on the [B, S, 1, C] views; split (LTX-2.3's
default, ``apply_split_rotary_emb``: float32 ``addcmul_`` on [B, H, T, D/2] tables) as
:data:`~accelpatch.lossless.ops.SPLIT_ROPE_PAIR` on the [B, S, C] q and k themselves (tests/ops/
test_fused_cpu_rope_pair_per_channel.py and test_fused_cpu_rope_split_pair.py check both chains against diffusers'
bit for bit). The projections, the RMSNorms, the dispatcher, the gates and ``to_out`` stay diffusers'; the Sol-Attn
path (``high``, stacked above it) builds its q/k/v with the same :func:`project_qkv` and diffusers' RoPE functions.
Masked, STG-perturbed and cross-attention calls, and calls whose tables the ops do not take, run the processor,
counted with their reason.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch

from accelpatch.lossless.ops import GATED_RESIDUAL, MODULATE, ROPE_PAIR_PER_CHANNEL, SPLIT_ROPE_PAIR
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("ltx2_fused_block", Tier.LOSSLESS)
ATTENTION_FUSION = QualityGatedFusion.named("ltx2_fused_attention", Tier.LOSSLESS)

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


_LTX2 = "diffusers.models.transformers.transformer_ltx2:"
#: both LTX-2 processors and the module forward that hands them their arguments (the self-attention paths, this
#: fused one and Sol-Attn's, restate all three)
ATTENTION_RESTATES = (_LTX2 + "LTX2AudioVideoAttnProcessor.__call__", _LTX2 + "LTX2PerturbedAttnProcessor.__call__",
                      _LTX2 + "LTX2Attention.forward")


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
    restates = (_LTX2 + "LTX2VideoTransformerBlock.forward",)

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


# ---- the video self-attention (attn1) with its interleaved q/k RoPE fused ------------------------------------------

#: ``LTX2Attention.forward``'s named parameters, which it hands the processor positionally
ATTENTION_CALL = ("hidden_states", "encoder_hidden_states", "attention_mask", "query_rotary_emb", "key_rotary_emb")
#: the keyword arguments ``LTX2PerturbedAttnProcessor`` takes beyond them
PERTURBED_CALL = ("perturbation_mask", "all_perturbed")

NOT_SELF = "encoder_hidden_states given: a cross-attention call (diffusers' processor runs it)"
OTHER_ROPE = "rope_type is neither 'interleaved' nor 'split': the processor applies no RoPE and runs the call"
NO_ROPE = "no query_rotary_emb: no RoPE to fuse (diffusers' processor runs the call)"
NOT_TABLES = ("the rotary tables are not one (cos, sin) pair of [B, S, C] tensors for q and k (or key_rotary_emb is "
              "another pair): diffusers' processor runs the call")
SPLIT_TABLES = ("rope_type 'split' with tables rope_split_pair does not take (not one (cos, sin) pair of "
                "[B, H, T, D/2] or [B, S, C/2] tensors for q and k, or key_rotary_emb another pair): diffusers' "
                "processor runs the call")
MASKED = "an attention_mask was given (video_self_attention_mask): diffusers' processor runs the call"
PERTURBED = ("an STG perturbation_mask or all_perturbed was given (spatio_temporal_guidance_blocks): diffusers' "
             "processor runs the call")
UNUSUAL = ("arguments the restated processor does not take (extra positional ones, or keywords its processor "
           "lacks): diffusers' LTX2Attention.forward runs the call")
SWAPPED = "the processor is no longer the LTX-2 processor this path restates (set after apply): it runs the call"


def _ltx2():
    from diffusers.models.transformers import transformer_ltx2

    return transformer_ltx2


def _processors() -> tuple[type, type]:
    ltx2 = _ltx2()
    return ltx2.LTX2AudioVideoAttnProcessor, ltx2.LTX2PerturbedAttnProcessor


def processor_mismatch(module: torch.nn.Module) -> Optional[str]:
    """Why ``module``'s processor is neither of diffusers' LTX-2 processors (None when it is one)."""
    processor = type(getattr(module, "processor", None))
    if processor in _processors():
        return None
    return f"processor is {processor.__name__}, expected LTX2AudioVideoAttnProcessor or LTX2PerturbedAttnProcessor"


def project_qkv(attn: torch.nn.Module, hidden_states: torch.Tensor, query_rotary_emb, key_rotary_emb,
                rope: Callable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, S, H, D] of a self-attention call exactly as LTX-2's processors hand them to the dispatcher:
    the projections, the RMSNorms across heads, ``rope(query, key, q_tables, k_tables)`` when there are tables
    (the key's default to the query's), then the heads unflattened. The Sol-Attn path passes diffusers' RoPE
    functions, the fused attention ROPE_PAIR_PER_CHANNEL or SPLIT_ROPE_PAIR."""
    query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query = attn.norm_q(query)  # one statement each: the unnormed query is freed before norm_k
    key = attn.norm_k(key)
    if query_rotary_emb is not None:
        query, key = rope(query, key, query_rotary_emb,
                          key_rotary_emb if key_rotary_emb is not None else query_rotary_emb)
    return tuple(x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))


def _fused_split_rope(site: Site) -> Callable:
    """The split RoPE of [B, S, C] q and k with one table pair, as SPLIT_ROPE_PAIR on q and k as they are
    (diffusers' ``apply_split_rotary_emb`` on each, bit for bit); ``k_tables`` is ``q_tables`` here."""
    def rope(query, key, q_tables, k_tables):
        return SPLIT_ROPE_PAIR(site, query, key, *q_tables)

    return rope


def _fused_rope(site: Site) -> Callable:
    """The interleaved RoPE of [B, S, C] q and k with one [B, S, C] table pair, as ROPE_PAIR_PER_CHANNEL on the
    [B, S, 1, C] views (diffusers' ``apply_interleaved_rotary_emb`` on each, bit for bit). ``k_tables`` is
    ``q_tables`` here: the fused attention takes no call with a key pair of its own."""
    def rope(query, key, q_tables, k_tables):
        cos, sin = q_tables
        query, key = ROPE_PAIR_PER_CHANNEL(site, query[:, :, None], key[:, :, None], cos[:, :, None],
                                           sin[:, :, None])
        return query.squeeze(2), key.squeeze(2)

    return rope


def _one_table_pair(call: dict, dims: tuple[int, ...] = (3,)) -> bool:
    """One (cos, sin) pair of tensors of a rank in ``dims`` (both the same) for q and k: the key's absent or the
    very same pair."""
    tables, key_tables = call["query_rotary_emb"], call["key_rotary_emb"]
    return (isinstance(tables, (tuple, list)) and len(tables) == 2
            and all(isinstance(t, torch.Tensor) and t.dim() in dims for t in tables)
            and tables[0].dim() == tables[1].dim() and (key_tables is None or key_tables is tables))


def gate_and_project_out(attn: torch.nn.Module, hidden_states: torch.Tensor, gate_logits) -> torch.Tensor:
    """The processors' tail after the dispatcher's flattened output: LTX-2.3's per-head gates
    ``2 * sigmoid(logits)`` where the module has them, then ``to_out``."""
    if gate_logits is not None:
        hidden_states = hidden_states.unflatten(2, (attn.heads, -1))
        hidden_states = (hidden_states * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)).flatten(2, 3)
    return attn.to_out[1](attn.to_out[0](hidden_states))


class LTX2FusedAttention(FusedOpsPath):
    """LTX-2's processors on a plain video self-attention call, the q/k RoPE as ROPE_PAIR_PER_CHANNEL
    (interleaved) or SPLIT_ROPE_PAIR (split); every other call runs diffusers' processor, counted with its reason."""

    fusion = ATTENTION_FUSION
    description = "video self-attention with the q/k RoPE (interleaved or split) fused (bit-exact)"
    fused_ops = (ROPE_PAIR_PER_CHANNEL, SPLIT_ROPE_PAIR)
    policy_reasons = (NOT_SELF, OTHER_ROPE, NO_ROPE, NOT_TABLES, SPLIT_TABLES, MASKED, PERTURBED, UNUSUAL, SWAPPED)
    #: the fused ops restate diffusers' two RoPE functions too
    restates = ATTENTION_RESTATES + (_LTX2 + "apply_interleaved_rotary_emb", _LTX2 + "apply_split_rotary_emb")

    def processor_mismatch(self, module: torch.nn.Module) -> Optional[str]:
        return processor_mismatch(module)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        """diffusers' ``LTX2Attention`` (its forward, which hands the processor its arguments, is restated too)
        with one of diffusers' LTX-2 processors."""
        return restated_class_mismatch(site, _ltx2().LTX2Attention) or super().mount_reject_reason(module, site)

    def unfused_reason(self, attn: torch.nn.Module, args: tuple, call: dict) -> Optional[str]:
        """Why this call runs diffusers' processor (None when the restatement takes it)."""
        processor = type(attn.processor)
        if processor not in _processors():
            return SWAPPED
        takes = ATTENTION_CALL + (PERTURBED_CALL if processor is _processors()[1] else ())
        if len(args) > len(ATTENTION_CALL) or any(name not in takes for name in call):
            return UNUSUAL
        perturbed = call.get("all_perturbed")  # by identity: a tensor here is STG's, compared by no value
        if call.get("perturbation_mask") is not None or (perturbed is not None and perturbed is not False):
            return PERTURBED
        if call["encoder_hidden_states"] is not None:
            return NOT_SELF
        if call["attention_mask"] is not None:
            return MASKED
        if attn.rope_type not in ("interleaved", "split"):
            return OTHER_ROPE
        if call["query_rotary_emb"] is None:
            return NO_ROPE
        if attn.rope_type == "split":
            return None if _one_table_pair(call, (3, 4)) else SPLIT_TABLES
        if not _one_table_pair(call):
            return NOT_TABLES
        return None

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ATTENTION_CALL)
        reason = self.unfused_reason(attn, args, call)
        if reason is not None:
            return NotApplicable(reason)
        hidden_states = call["hidden_states"]
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        rope = _fused_split_rope(site) if attn.rope_type == "split" else _fused_rope(site)
        query, key, value = project_qkv(attn, hidden_states, call["query_rotary_emb"], None, rope)
        processor = attn.processor
        hidden_states = _ltx2().dispatch_attention_fn(
            query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
            backend=processor._attention_backend, parallel_config=processor._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        return gate_and_project_out(attn, hidden_states, gate_logits)


FUSED_ATTENTION = LTX2FusedAttention()
