"""HunyuanVideo 1.5's lossless block fusion: ``HunyuanVideo15TransformerBlock.forward`` restated with its
element-wise chains fused.

The block runs its AdaLN chains in the activations' dtype (no upcast): ``AdaLayerNormZero`` gives six rows per
stream, ``linear(silu(temb)).chunk(6)``, and the chains are the shared verified ops (accelpatch.lossless.ops):

- the four modulations, ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` (video and text, before the attention
  inside ``norm1``/``norm1_context`` and before the feed-forwards): :data:`~accelpatch.lossless.ops.MODULATE`;
- the four gated residual adds: after the attention ``x + out * gate.unsqueeze(1)``, as ``GATED_RESIDUAL``'s
  ``x + gate * out`` (a product is commutative in IEEE arithmetic, NaN payloads aside, which the check ignores);
  after the feed-forwards ``x + gate.unsqueeze(1) * out``, GATED_RESIDUAL as written.

``AdaLayerNormZero.forward`` is restated (its ``linear``, ``silu`` and ``norm`` stay diffusers' modules, called as
modules) only where the norm is diffusers' own class with no embedding of its own and no hook or forward override
on it; otherwise the norm module is called as it is and only the later chains are fused. The joint attention
(``attn``, where the Sol-Attn site sits), the LayerNorms and the feed-forwards stay diffusers' own.

``transformer_blocks.N.attn`` (the joint attention) carries a second fusion: ``HunyuanVideo15AttnProcessor2_0``
restated with its RoPE of the video q and k (``apply_rotary_emb(use_real=True)``: ``x.float() * cos +
x_rot.float() * sin`` with every channel's own table entry, stored in ``x``'s dtype) as one verified op,
:data:`~accelpatch.lossless.ops.ROPE_PAIR_PER_CHANNEL`, and its attention without the processor's L x L mask
(:data:`KEY_MASK_ATTENTION`: the keys' mask broadcast over the queries, the padded text rows attended apart; about
12 GiB a mask at 720p, 121 frames); which rows are padded is read once per forward (:class:`ForwardMasks`, captured
by the adapter's forward hook), not once per block: each read is a host sync on a GPU. Wan's ``rope_pair`` would
not do: it reads ``cos`` at even and ``sin`` at odd channels only and runs bf16 tables in bf16. The projections, the
RMSNorms, the text stream's projections, the dispatcher and the output projections stay diffusers'; the Sol-Attn
path (``high``, stacked above it) builds its own q/k/v with diffusers' ``apply_rotary_emb``.
"""
from __future__ import annotations

import contextvars
from typing import Any, Mapping, Optional

import torch

import torch.nn.functional as F

from accelpatch.core import call_context
from accelpatch.lossless.ops import GATED_RESIDUAL, MODULATE, ROPE_PAIR_PER_CHANNEL
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier
from accelpatch.lossless.verify import ComposedOp

BLOCK_FUSION = QualityGatedFusion.named("hunyuan_video15_fused_block", Tier.LOSSLESS)
ATTENTION_FUSION = QualityGatedFusion.named("hunyuan_video15_fused_attention", Tier.LOSSLESS)

NOT_JOINT = ("no encoder_hidden_states or attention_mask: not the joint video+text call HunyuanVideo 1.5's blocks "
             "make (diffusers' processor runs it)")
NOT_REAL_TABLES = ("image_rotary_emb is not a (cos, sin) pair of [S, D] tensors: not the tables "
                   "HunyuanVideo15RotaryPosEmbed builds (diffusers' processor runs it)")

_CALL = ("hidden_states", "encoder_hidden_states", "temb", "attention_mask", "freqs_cis")


_HY = "diffusers.models.transformers.transformer_hunyuan_video15:"
#: the joint attention's processor and the module forward the gated forward stands in for (the Sol-Attn path
#: restates both too)
ATTENTION_RESTATES = (_HY + "HunyuanVideo15AttnProcessor2_0.__call__",
                      "diffusers.models.attention_processor:Attention.forward")


def _hy_block_class() -> type:
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15TransformerBlock

    return HunyuanVideo15TransformerBlock


def _restatable(norm: torch.nn.Module) -> bool:
    """Whether ``AdaLayerNormZero.forward`` may be restated for this norm: diffusers' own class with no embedding,
    no hooks and no instance forward (accelerate's hooks replace ``forward`` on the instance)."""
    from diffusers.models.normalization import AdaLayerNormZero

    return (type(norm) is AdaLayerNormZero and norm.emb is None and not norm._forward_hooks
            and not norm._forward_pre_hooks and "forward" not in norm.__dict__)


def adaln_zero(site: Site, norm: torch.nn.Module, x: torch.Tensor, temb: torch.Tensor) -> tuple:
    """``AdaLayerNormZero(x, emb=temb)`` with its modulation as MODULATE: the normalised, modulated ``x`` and the
    rows ``gate_msa, shift_mlp, scale_mlp, gate_mlp``, bit for bit diffusers' (the module itself where it cannot
    be restated)."""
    if not _restatable(norm):
        return norm(x, emb=temb)
    emb = norm.linear(norm.silu(temb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    return MODULATE(site, norm.norm(x), scale_msa[:, None], shift_msa[:, None]), gate_msa, shift_mlp, scale_mlp, \
        gate_mlp


class HunyuanVideo15FusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "dual-stream block with its AdaLN modulations and gated residual adds fused (bit-exact)"
    fused_ops = (MODULATE, GATED_RESIDUAL)
    #: adaln_zero restates AdaLayerNormZero.forward where the norm is diffusers' own
    restates = (_HY + "HunyuanVideo15TransformerBlock.forward",
                "diffusers.models.normalization:AdaLayerNormZero.forward")

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, _hy_block_class())

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, _CALL)
        hidden_states, encoder_hidden_states, temb = call["hidden_states"], call["encoder_hidden_states"], call["temb"]

        # 1. Input normalization (AdaLN-Zero, both streams)
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaln_zero(site, block.norm1, hidden_states,
                                                                                  temb)
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = adaln_zero(
            site, block.norm1_context, encoder_hidden_states, temb)

        # 2. Joint attention (diffusers' module: the Sol-Attn site, when there is one, sits on it)
        attn_output, context_attn_output = block.attn(
            hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
            attention_mask=call["attention_mask"], image_rotary_emb=call["freqs_cis"])

        # 3. Modulation and residual connection
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_msa.unsqueeze(1), attn_output)
        encoder_hidden_states = GATED_RESIDUAL(site, encoder_hidden_states, c_gate_msa.unsqueeze(1),
                                               context_attn_output)
        norm_hidden_states = MODULATE(site, block.norm2(hidden_states), scale_mlp[:, None], shift_mlp[:, None])
        norm_encoder_hidden_states = MODULATE(site, block.norm2_context(encoder_hidden_states),
                                              c_scale_mlp[:, None], c_shift_mlp[:, None])

        # 4. Feed-forward
        ff_output = block.ff(norm_hidden_states)
        context_ff_output = block.ff_context(norm_encoder_hidden_states)
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_mlp.unsqueeze(1), ff_output)
        encoder_hidden_states = GATED_RESIDUAL(site, encoder_hidden_states, c_gate_mlp.unsqueeze(1),
                                               context_ff_output)
        return hidden_states, encoder_hidden_states


FUSED_BLOCK = HunyuanVideo15FusedBlock()


def _hy():
    from diffusers.models.transformers import transformer_hunyuan_video15

    return transformer_hunyuan_video15


def _real_tables(rotary) -> bool:
    return (isinstance(rotary, (tuple, list)) and len(rotary) == 2
            and all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in rotary))


def padded_valid(attention_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Which of the joint sequence's ``seq_len`` tokens are valid, [B, L] booleans: the text mask padded with True
    for the video rows in front, as the processor pads it."""
    return F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True).bool()


def pair_mask(attention_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The processor's [B, 1, L, L] boolean mask, ``valid[i] & valid[j]`` (:func:`padded_valid`), the same values,
    shape and strides, as one tensor: the processor materialises ``valid.repeat(..., L, 1)`` first and ands it with
    its transpose, holding two L x L masks at once (at 720p, 121 frames, about 12 GiB each)."""
    return _pair(padded_valid(attention_mask, seq_len))


def _pair(valid: torch.Tensor) -> torch.Tensor:
    batch_size, seq_len = valid.shape
    return valid.view(batch_size, 1, seq_len, 1) & valid.view(batch_size, 1, 1, seq_len)


class Attend:
    """diffusers' ``dispatch_attention_fn`` with the processor's backend (``attend(q, k, v, mask)``): the value in
    the op's call that says which attention runs, equal for one backend and parallel configuration (a part of the
    signature)."""

    __slots__ = ("backend", "parallel_config")

    def __init__(self, backend: Any, parallel_config: Any = None) -> None:
        self.backend, self.parallel_config = backend, parallel_config

    def __call__(self, query, key, value, mask):
        return _hy().dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                           backend=self.backend, parallel_config=self.parallel_config)

    def _key(self) -> tuple:
        return str(self.backend), id(self.parallel_config)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Attend) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"dispatch_attention_fn(backend={self.backend!r})"


def pair_masked_attention(query, key, value, valid: torch.Tensor, attend: Attend):
    """The processor's attention: ``attend`` on the pair mask ``valid[i] & valid[j]`` (one [B, 1, L, L] tensor)."""
    return attend(query, key, value, _pair(valid))


class ForwardMasks:
    """What one forward derives from its masks, made once and read by every block: the mask is the same for the
    whole forward, and reading which rows are padded (``any``, ``nonzero``) makes the host wait for the device (on a
    GPU, a sync per read). Entries are keyed by the function, the tensor itself (held for the forward, so an id cannot
    be reused), its version counter (an in-place change makes a new entry) and the other arguments."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple] = []

    def remembered(self, make: Any, tensor: torch.Tensor, extra: tuple) -> Any:
        """``make(tensor, *extra)``, computed on the first request of the forward."""
        for seen_make, seen, version, seen_extra, value in self._entries:
            if seen_make is make and seen is tensor and version == tensor._version and seen_extra == extra:
                return value
        value = make(tensor, *extra)
        self._entries.append((make, tensor, tensor._version, extra, value))
        return value


_forward_masks: contextvars.ContextVar[Optional[ForwardMasks]] = call_context.register(
    contextvars.ContextVar("accelpatch_hunyuan_video15_masks", default=None))
_read_forward_masks = call_context.ContextReader(_forward_masks)


def capture_masks(arguments: Mapping[str, Any]) -> tuple:
    """A fresh :class:`ForwardMasks` for the duration of one forward (the adapter's ``capture_for``)."""
    return ((_forward_masks, ForwardMasks()),)


def per_forward(make: Any, tensor: torch.Tensor, *extra: Any) -> Any:
    """``make(tensor, *extra)``, once per forward through its :class:`ForwardMasks`; on every call where there is
    none (no forward hook: the op called on its own; or inside ``torch.compile``, where the key-mask attention does
    not run and a per-forward object would be guarded on)."""
    memo = None if torch.compiler.is_compiling() else _read_forward_masks()
    return make(tensor, *extra) if memo is None else memo.remembered(make, tensor, extra)


def padded_rows(valid: torch.Tensor) -> Optional[list[torch.Tensor]]:
    """Per batch row, the positions of the tokens ``valid`` [B, L] masks (padded text), or None when it masks none."""
    masked = ~valid
    if not bool(masked.any()):
        return None
    return [masked[b].nonzero().squeeze(1) for b in range(valid.shape[0])]


class _KeyMaskRows:
    """The same attention without the L x L mask: every query row on the keys' mask ``valid`` broadcast ([B, 1, 1,
    L]: a valid row's mask is exactly that), then the rows of the padded tokens, which the pair mask masks wholly,
    attended apart on an all-False mask and written over theirs (whatever the backend gives a fully masked row)."""

    def unsupported(self, query, key, value, valid, attend) -> Optional[str]:
        if query.dim() != 4 or key.shape[:2] != query.shape[:2] or tuple(valid.shape) != tuple(query.shape[:2]):
            return (f"a self-attention of [B, L, H, D] query and key with a [B, L] mask, not "
                    f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(valid.shape)}")
        return None

    def run(self, query, key, value, valid, attend):
        batch_size, seq_len = valid.shape
        out = attend(query, key, value, valid.view(batch_size, 1, 1, seq_len))
        padded = per_forward(padded_rows, valid)
        if padded is not None:
            nothing = torch.zeros(1, 1, 1, seq_len, dtype=torch.bool, device=valid.device)
            for b, rows in enumerate(padded):
                if rows.numel():
                    part = attend(query[b:b + 1].index_select(1, rows), key[b:b + 1], value[b:b + 1], nothing)
                    out[b].index_copy_(0, rows, part[0])
                    del part
        return out


#: HunyuanVideo 1.5's joint attention without the processor's L x L pair mask, verified per signature against it
KEY_MASK_ATTENTION = ComposedOp(
    "key_mask_attention", pair_masked_attention,
    "the joint attention on its keys' mask broadcast over the queries (the padded text rows attended apart) instead "
    "of an L x L pair mask (HunyuanVideo 1.5)", _KeyMaskRows(), unverified_at_high=True, compiles=False)


class HunyuanVideo15FusedAttention(FusedOpsPath):
    """``HunyuanVideo15AttnProcessor2_0`` on the joint call, its video q/k RoPE as ROPE_PAIR_PER_CHANNEL."""

    fusion = ATTENTION_FUSION
    description = "joint attention with the video q/k interleaved RoPE fused (bit-exact)"
    fused_ops = (ROPE_PAIR_PER_CHANNEL, KEY_MASK_ATTENTION)
    policy_reasons = (NOT_JOINT, NOT_REAL_TABLES)
    #: ROPE_PAIR_PER_CHANNEL restates diffusers' apply_rotary_emb(use_real=True)
    restates = ATTENTION_RESTATES + ("diffusers.models.embeddings:apply_rotary_emb",)

    def expected_processor(self) -> type:
        return _hy().HunyuanVideo15AttnProcessor2_0

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "attention_mask",
                                        "image_rotary_emb"))
        hidden_states, encoder_hidden_states = call["hidden_states"], call["encoder_hidden_states"]
        attention_mask, rotary = call["attention_mask"], call["image_rotary_emb"]
        if encoder_hidden_states is None or attention_mask is None:
            return NotApplicable(NOT_JOINT)
        if rotary is not None and not _real_tables(rotary):
            return NotApplicable(NOT_REAL_TABLES)
        processor = attn.processor
        # 1.-2. projections and per-head RMSNorms
        query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        query = attn.norm_q(query)  # one statement each: the unnormed query is freed before norm_k
        key = attn.norm_k(key)
        # 3. RoPE of the video rows: apply_rotary_emb(x, rotary, sequence_dim=1) on both, fused
        if rotary is not None:
            cos, sin = (t[None, :, None, :].to(query.device) for t in rotary)
            query, key = ROPE_PAIR_PER_CHANNEL(site, query, key, cos, sin)
        # 4. the text stream's projections and norms, appended
        encoder_query, encoder_key, encoder_value = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                                                     for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
        if attn.norm_added_q is not None:
            encoder_query = attn.norm_added_q(encoder_query)
        if attn.norm_added_k is not None:
            encoder_key = attn.norm_added_k(encoder_key)
        query = torch.cat([query, encoder_query], dim=1)
        key = torch.cat([key, encoder_key], dim=1)
        value = torch.cat([value, encoder_value], dim=1)
        del encoder_query, encoder_key, encoder_value
        # 5. attention: the pair mask valid[i] & valid[j] as the keys' mask, verified (a context-parallel call's
        # sequence is sharded: it builds the pair mask as diffusers does)
        attend = Attend(processor._attention_backend, processor._parallel_config)
        if processor._parallel_config is None:
            valid = per_forward(padded_valid, attention_mask, query.shape[1])
            hidden_states = KEY_MASK_ATTENTION(site, query, key, value, valid, attend)
        else:
            hidden_states = attend(query, key, value, pair_mask(attention_mask, query.shape[1]))
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        # 6. output projections
        hidden_states, encoder_hidden_states = (hidden_states[:, : -encoder_hidden_states.shape[1]],
                                                hidden_states[:, -encoder_hidden_states.shape[1]:])
        if getattr(attn, "to_out", None) is not None:
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
        if getattr(attn, "to_add_out", None) is not None:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


FUSED_ATTENTION = HunyuanVideo15FusedAttention()
