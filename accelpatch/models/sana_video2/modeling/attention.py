"""SANA-Video 2.0 attention: the softmax "anchor" attention, the gated linear attention and the text cross-attention.

Each self-attention kind is its own module class holding the weights (names mirror the original checkpoint:
``qkv``, ``q_norm``, ``k_norm``, ``output_gate``, ``proj``; the linear kind adds ``beta_proj`` and ``o_norm``) and
delegating its math to a processor object, as diffusers' attention modules do, so that patchers and readers find
them by class and can swap the processor. The math follows the release (NVlabs/Sana ``sana_video2_blocks.py``):
q/k RMSNorm over the full width, Wan 3-D RoPE applied in float64,
the FP32 upcast when ``fp32_attention`` is set (every release config sets it), and a sigmoid output gate.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_dispatch import dispatch_attention_fn
from torch import nn

from accelpatch.parallel.sequence import (SequenceShards, heads_to_ranks, processor_shards, ranks_to_heads, sequence_shards,
                                 sum_over_ranks)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in FP32, or as it is when already wider (the release's ``.float()``; a float64 model stays float64)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    """RMSNorm with a learnable weight, computed in FP32 and cast back (the release's ``RMSNorm``): ``(weight ·
    x·rsqrt(mean(x²) + eps))``. ``dim`` is the normalised axis (-1; -2 for the linear attention's channel-first
    output)."""

    def __init__(self, width: int, *, eps: float, scale_factor: float = 1.0, dim: int = -1) -> None:
        super().__init__()
        self.eps = eps
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(width) * scale_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1] * x.dim()
        shape[self.dim] = -1
        xf = at_least_fp32(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(self.dim, keepdim=True) + self.eps)
        return (self.weight.view(shape) * normed).type_as(x)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of ``x`` [B, N, H, D] by the complex ``freqs`` [N, D/2] in float64; the result
    has ``x``'s dtype."""
    rotated = torch.view_as_complex(x.to(torch.float64).unflatten(-1, (-1, 2))) * freqs[None, :, None, :]
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


def _qkv(attn: nn.Module, hidden_states: torch.Tensor):
    """q, k, v [B, N, H, D] with q/k RMSNorm over the full width (shared by both self-attention kinds)."""
    query, key, value = attn.qkv(hidden_states).chunk(3, dim=-1)
    query, key = attn.q_norm(query), attn.k_norm(key)
    return tuple(x.unflatten(-1, (attn.heads, attn.head_dim)) for x in (query, key, value))


def sigmoid_gate(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(logits)``: the default ``gate`` of the functions below (a fast path passes a fused one)."""
    return x * torch.sigmoid(logits)


def _gated_output(attn: nn.Module, out: torch.Tensor, hidden_states: torch.Tensor,
                  gate: Callable = sigmoid_gate) -> torch.Tensor:
    """[B, N, C] attention output in the input dtype, times sigmoid(output_gate(x)), through ``proj``."""
    out = gate(out.to(hidden_states.dtype), attn.output_gate(hidden_states))
    return attn.proj(out)


def apply_rope_pair(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """:func:`apply_rope` of query and key (the default ``rope_pair`` of the functions below; a fast path passes a
    fused one)."""
    return apply_rope(query, freqs), apply_rope(key, freqs)


def anchor_qkv(attn: "SanaVideo2SoftmaxAttention", hidden_states: torch.Tensor,
               rotary_emb: Optional[torch.Tensor], rope_pair: Callable = apply_rope_pair):
    """The anchor attention's q, k, v [B, N, H, D] in the activations' dtype, RoPE applied: everything before the
    FP32 upcast. Shared by the reference processor and the fast paths that replace what follows."""
    query, key, value = _qkv(attn, hidden_states)
    if rotary_emb is not None:
        query, key = rope_pair(query, key, rotary_emb)
    return query, key, value


def anchor_output(attn: "SanaVideo2SoftmaxAttention", out: torch.Tensor, hidden_states: torch.Tensor,
                  gate: Callable = sigmoid_gate):
    """The anchor attention's tail, from the attention result ``out`` [B, N, H, D]: cast back, gate, project."""
    return _gated_output(attn, out.flatten(2, 3), hidden_states, gate)


def _own_ulysses(processor, query: torch.Tensor, upcast: bool) -> Optional[SequenceShards]:
    """The group to run Ulysses' exchange over ourselves (None: leave it to diffusers), under pure Ulysses (no ring,
    even shards): where q/k/v are narrower than the FP32 the release upcasts them to, and where the heads do not
    divide by the degree (diffusers' template would fail in a reshape)."""
    config = getattr(processor, "_parallel_config", None)
    cp = getattr(config, "context_parallel_config", None)
    if cp is None or (cp.ring_degree or 1) > 1 or (cp.ulysses_degree or 1) < 2 or cp.ulysses_anything:
        return None
    narrow = upcast and query.dtype in (torch.bfloat16, torch.float16)
    if not narrow and query.shape[2] % cp.ulysses_degree == 0:
        return None
    return sequence_shards(config)


def _pad_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, N, H, D] with zero heads appended up to ``heads``: a zero query over zero keys and values attends
    uniformly to zeros, so a padded head's output is 0 and the real heads are untouched (attention is per head)."""
    return torch.cat([x, x.new_zeros(*x.shape[:2], heads - x.shape[2], x.shape[3])], dim=2)


def anchor_core(processor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                upcast: bool) -> torch.Tensor:
    """Softmax attention of q, k, v [B, N, H, D] through diffusers' dispatcher with ``processor``'s backend and
    parallel config; ``upcast``: in FP32 (the release's ``fp32_attention``). Shared by the reference processor
    and the fast paths.

    Under Ulysses we exchange the heads ourselves in two cases. With BF16/FP16 activations, q/k/v cross the ranks
    as they are and are upcast after the exchange, the output cast back before its exchange: the casts are
    elementwise, so this gives diffusers' Ulysses bits at half its bytes (its template moves the FP32 tensors it is
    handed), in the activations' dtype, which the attention's tail casts to anyway. With heads that do not divide by
    the degree (the 5B model's 10 on 4 or 8 ranks), zero heads pad them to the next multiple (12 or 16: that much
    more anchor compute) and are dropped after the return exchange."""
    shards = _own_ulysses(processor, query, upcast)
    if shards is None:
        if upcast:
            query, key, value = at_least_fp32(query), at_least_fp32(key), at_least_fp32(value)
        return dispatch_attention_fn(query, key, value, dropout_p=0.0, is_causal=False,
                                     backend=processor._attention_backend, parallel_config=processor._parallel_config)
    dtype, heads = query.dtype, query.shape[2]
    padded = -(-heads // shards.world) * shards.world
    if padded != heads:
        query, key, value = (_pad_heads(x, padded) for x in (query, key, value))
    query, key, value = (heads_to_ranks(x, shards) for x in (query, key, value))
    if upcast:
        query, key, value = at_least_fp32(query), at_least_fp32(key), at_least_fp32(value)
    out = dispatch_attention_fn(query, key, value, dropout_p=0.0, is_causal=False,
                                backend=processor._attention_backend)
    out = ranks_to_heads(out.to(dtype), shards)
    return out[:, :, :heads] if padded != heads else out


class SanaVideo2SoftmaxAttnProcessor:
    """The anchor attention's reference math: softmax attention over all tokens with RoPE, in FP32 when the module's
    ``fp32_attention`` is set, then the sigmoid output gate and the projection."""

    _attention_backend = None
    _parallel_config = None

    def __call__(self, attn: "SanaVideo2SoftmaxAttention", hidden_states: torch.Tensor,
                 rotary_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        query, key, value = anchor_qkv(attn, hidden_states, rotary_emb)
        out = anchor_core(self, query, key, value, upcast=attn.fp32_attention)
        return anchor_output(attn, out, hidden_states)


def _state_over_ranks(scores: torch.Tensor, key_sum: torch.Tensor, shards: Optional[SequenceShards]):
    """The token sums of the whole sequence from this rank's partial ones, in one all-reduce: the state
    ``scores`` = Σ v·k̃ᵀ [B, H, D, D] and the normaliser's ``key_sum`` = Σ ReLU(k) [B, H, D, 1] (carried in the
    state's dtype and cast back: no extra rounding when both are FP32, or at world size 1). Unsplit: as given."""
    if shards is None:
        return scores, key_sum
    packed = torch.cat([scores.flatten(), key_sum.to(scores.dtype).flatten()])
    total = sum_over_ranks(packed, shards)
    return (total[:scores.numel()].view_as(scores),
            total[scores.numel():].view_as(key_sum).to(key_sum.dtype))


def gated_linear_attention(attn: "SanaVideo2LinearAttention", hidden_states: torch.Tensor,
                           rotary_emb: Optional[torch.Tensor], first_gemm: Optional[Callable] = None,
                           rope_pair: Callable = apply_rope_pair, gate: Callable = sigmoid_gate, *,
                           shards: Optional[SequenceShards]) -> torch.Tensor:
    """The gated linear attention: out = (v·k̃ᵀ)·RoPE(q) per head with k̃ = RoPE(k)·sigmoid(β), times the
    ReLU-kernel normaliser 1/(Σ ReLU(k)ᵀReLU(q) + 1e-8) of the release (computed in the input dtype from the
    un-rotated q and k; the RMSNorm that follows cancels it except for its epsilon, and later upstream code drops
    it), then the head-dim RMSNorm ``o_norm`` in FP32, the sigmoid output gate and the projection.

    Both GEMMs run on FP32 operands when ``fp32_attention`` is set (the release). ``first_gemm(v, k̃)``, given by a
    fast path, replaces the first one ([B, H, D, N] operands in the activations' dtype → [B, H, D, D] FP32); the
    second then runs on FP32 operands. ``rope_pair(q, k, freqs)`` applies the RoPE (:func:`apply_rope_pair`),
    ``gate(x, logits)`` the sigmoid output gate (:func:`sigmoid_gate`; the key gate β, a [B, N, H] sigmoid broadcast
    over the head dim, stays eager: cheaper than any fused pass on CPU).

    ``shards`` (required, so that no caller forgets it: pass :func:`processor_shards` of the module's processor):
    under a sequence split each rank holds some tokens, and the two token sums, the state and Σ ReLU(k), are summed
    over the ranks (:func:`_state_over_ranks`) before they meet the local queries. None: unsplit, the same ops."""
    batch, tokens, width = hidden_states.shape
    query, key, value = _qkv(attn, hidden_states)
    if rotary_emb is not None:
        query_rot, key_rot = rope_pair(query, key, rotary_emb)
    else:
        query_rot, key_rot = query, key
    beta = torch.sigmoid(attn.beta_proj(hidden_states))  # [B, N, H]
    key_gated = key_rot * beta[..., None]
    # channel-first per head: [B, H, D, N]
    query_rot, key_gated, value = (x.permute(0, 2, 3, 1) for x in (query_rot, key_gated, value))
    if first_gemm is not None:
        scores = first_gemm(value, key_gated)
        query_rot = at_least_fp32(query_rot)
    else:
        if attn.fp32_attention:
            query_rot, key_gated, value = at_least_fp32(query_rot), at_least_fp32(key_gated), at_least_fp32(value)
        scores = torch.matmul(value, key_gated.transpose(-1, -2))
    relu_q = F.relu(query).permute(0, 2, 3, 1)  # un-rotated, un-gated, input dtype
    relu_k = F.relu(key).permute(0, 2, 3, 1)
    scores, key_sum = _state_over_ranks(scores, relu_k.sum(-1, keepdim=True), shards)
    out = torch.matmul(scores, query_rot)  # [B, H, D, N]

    normaliser = 1.0 / (key_sum.transpose(-1, -2) @ relu_q + attn.eps)  # [B, H, 1, N]
    out = attn.o_norm(out * normaliser)
    out = out.to(hidden_states.dtype).reshape(batch, width, tokens).transpose(1, 2)
    return _gated_output(attn, out, hidden_states, gate)


class SanaVideo2LinearAttnProcessor:
    """The gated linear attention's reference math (:func:`gated_linear_attention`). ``_parallel_config``: set by
    diffusers' ``enable_parallelism`` on processors that have the attribute; it makes the token sums span the
    sequence group (:func:`processor_shards`)."""

    _parallel_config = None

    def __call__(self, attn: "SanaVideo2LinearAttention", hidden_states: torch.Tensor,
                 rotary_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        return gated_linear_attention(attn, hidden_states, rotary_emb, shards=processor_shards(self))


class _GatedSelfAttention(nn.Module, AttentionModuleMixin):
    """Weights shared by both self-attention kinds; the subclass picks the head dim and the processor."""

    _supports_qkv_fusion = False

    def __init__(self, hidden_size: int, head_dim: int, *, qk_norm: bool, norm_eps: float,
                 fp32_attention: bool, processor) -> None:
        super().__init__()
        if hidden_size % head_dim:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by the head dim {head_dim}")
        self.heads = hidden_size // head_dim
        self.head_dim = head_dim
        #: run the attention core in FP32 (every release config sets it; False runs it in the activations' dtype)
        self.fp32_attention = fp32_attention
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.q_norm = RMSNorm(hidden_size, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hidden_size, eps=norm_eps) if qk_norm else nn.Identity()
        self.output_gate = nn.Linear(hidden_size, hidden_size, bias=True)
        self.proj = nn.Linear(hidden_size, hidden_size, bias=True)
        self.set_processor(processor)

    def forward(self, hidden_states: torch.Tensor, rotary_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.processor(self, hidden_states, rotary_emb)


class SanaVideo2SoftmaxAttention(_GatedSelfAttention):
    """Softmax "anchor" self-attention (head dim ``softmax_head_dim``, 256 in the release)."""

    _default_processor_cls = SanaVideo2SoftmaxAttnProcessor
    _available_processors = [SanaVideo2SoftmaxAttnProcessor]

    def __init__(self, hidden_size: int, head_dim: int, *, qk_norm: bool = True, norm_eps: float = 1e-5,
                 fp32_attention: bool = True) -> None:
        super().__init__(hidden_size, head_dim, qk_norm=qk_norm, norm_eps=norm_eps, fp32_attention=fp32_attention,
                         processor=SanaVideo2SoftmaxAttnProcessor())


class SanaVideo2LinearAttention(_GatedSelfAttention):
    """Gated linear self-attention (head dim ``linear_head_dim``, 128 in the release)."""

    _default_processor_cls = SanaVideo2LinearAttnProcessor
    _available_processors = [SanaVideo2LinearAttnProcessor]

    def __init__(self, hidden_size: int, head_dim: int, *, qk_norm: bool = True, norm_eps: float = 1e-5,
                 fp32_attention: bool = True) -> None:
        super().__init__(hidden_size, head_dim, qk_norm=qk_norm, norm_eps=norm_eps, fp32_attention=fp32_attention,
                         processor=SanaVideo2LinearAttnProcessor())
        #: the normaliser's epsilon (release value)
        self.eps = 1e-8
        self.beta_proj = nn.Linear(hidden_size, self.heads, bias=True)
        self.o_norm = RMSNorm(head_dim, eps=norm_eps, dim=-2)


class SanaVideo2CrossAttention(nn.Module):
    """Text cross-attention (no modulation, no RoPE): q from the video tokens, k/v from the caption, q/k RMSNorm
    (eps 1e-6) over the full width, an additive (1 - mask)·(-10000) text mask, as the release."""

    def __init__(self, hidden_size: int, num_heads: int, *, qk_norm: bool = True) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
        self.heads = num_heads
        self.q_linear = nn.Linear(hidden_size, hidden_size)
        self.kv_linear = nn.Linear(hidden_size, 2 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)
        self.q_norm = RMSNorm(hidden_size, eps=1e-6) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hidden_size, eps=1e-6) if qk_norm else nn.Identity()

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        query = self.q_norm(self.q_linear(hidden_states)).unflatten(-1, (self.heads, -1))
        key, value = self.kv_linear(encoder_hidden_states).chunk(2, dim=-1)
        key = self.k_norm(key).unflatten(-1, (self.heads, -1))
        value = value.unflatten(-1, (self.heads, -1))
        mask = None
        if encoder_attention_mask is not None:
            mask = ((1 - encoder_attention_mask.to(query.dtype)) * -10000.0)[:, None, None, :]
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        return self.proj(out.flatten(2, 3))
