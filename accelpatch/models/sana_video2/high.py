"""SANA-Video 2.0's ``high``-tier fast paths (see :mod:`.adapter` for where they sit): the anchors on BF16 operands
(:class:`AnchorAttentionBF16`, with the options :class:`SanaVideo2Options` that keep FP32 for some steps and layers),
the linear attention's first GEMM on BF16 operands (:class:`LinearAttentionBF16GEMM`), and Sol-Attn on the anchors with
``backend="sol_attn"`` (:class:`AnchorSolAttention`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

import torch

from accelpatch.sol_attn.config import parse_layers
from accelpatch.core.steps import normalize_step_count
from accelpatch.core.gate import SGLANG_PREFIX, QualityGatedFusion
from accelpatch.models.sana_video.gemm import bmm_bf16_fp32_reject_reason, key_value_state_bf16
from accelpatch.core.outcomes import Declined, NotApplicable
from accelpatch.core.sites import (FastPath, Site, bind_call, cuda_reject_reason, device_reject_reason, step_layer_policy)
from accelpatch.sol_attn.sites import SolAttnFastPath, SparseCall
from accelpatch.core.tiers import Tier
from accelpatch.lossless.ops import ROTARY_COMPLEX_PAIR, SIGMOID_GATE
from accelpatch.models.sana_video2.lossless import anchor_attention, rope_pair, sigmoid_gate

#: sglang's anchor site, by its marker names: _sgl_sana_video2_softmax_attention_site / _enabled
SOFTMAX_FUSION = QualityGatedFusion.named("sana_video2_softmax_attention", Tier.HIGH, prefix=SGLANG_PREFIX)
LINEAR_FUSION = QualityGatedFusion.named("sana_video2_linear_attention", Tier.HIGH)
SOL_FUSION = QualityGatedFusion(
    name="sana_video2_sol_attn",
    marker_attr="_accelpatch_sana_video2_sol_attn_site",
    enabled_attr="_accelpatch_sana_video2_sol_attn_enabled",
    tier=Tier.HIGH,
)

FP32_ANCHOR_STEP = "FP32 anchor step (step < anchor_fp32_steps)"
FP32_ANCHOR_LAYER = "FP32 anchor layer (in anchor_fp32_layers)"
ANCHOR_STEP_UNKNOWN = ("no denoising step is known, so anchor_fp32_steps cannot apply and the anchor keeps FP32; run "
                       "it through a diffusers pipeline, pass a timestep, wrap it in accelpatch.denoising_step(i), or "
                       "set anchor_fp32_steps=0")
ANCHOR_TOTAL_UNKNOWN = ("this call's number of denoising steps is unknown, so anchor_fp32_steps as a fraction cannot "
                        "apply and the anchor keeps FP32: apply() the pipeline, wrap the call in "
                        "accelpatch.denoising_step(i, total=N), or give anchor_fp32_steps as a count")
FP32_ATTENTION_OFF = "fp32_attention is off: the reference already runs this attention in the activations' dtype"


@dataclass(frozen=True)
class SanaVideo2Options:
    """Options of ``apply(model, ...)`` for SANA-Video 2.0: where the BF16 anchor path keeps the release's FP32.

    ``anchor_fp32_steps``: the first steps of each call keep FP32 anchors (the step clock of accelpatch.core.steps): a
    count, or a fraction of the call's steps (``0.2``, ``"20%"``); default 0.2, the first 20 %: 10 of the release's 50, 1 of
    the 4-step sampler's 4, by analogy with the sol_attn backend's ``dense_steps`` (unmeasured on the
    released weights: see docs/models/sana-video2.md). ``anchor_fp32_layers``: anchor layers that always keep FP32
    (``"3,7"``, an iterable; a range such as ``"3-11"`` only where every layer in it is an anchor).
    ``anchor_fp32_steps=0, anchor_fp32_layers=""`` is the prior art's full-speed setting.
    """

    anchor_fp32_steps: Union[int, float] = 0.2
    anchor_fp32_layers: frozenset = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "anchor_fp32_steps", normalize_step_count(self.anchor_fp32_steps, "anchor_fp32_steps"))
        object.__setattr__(self, "anchor_fp32_layers", parse_layers(self.anchor_fp32_layers, "anchor_fp32_layers"))

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_options(cls, **options: Any) -> "SanaVideo2Options":
        return cls(**options)


def _anchor_processor_class() -> type:
    from accelpatch.models.sana_video2.modeling.attention import SanaVideo2SoftmaxAttnProcessor

    return SanaVideo2SoftmaxAttnProcessor


def _linear_processor_class() -> type:
    from accelpatch.models.sana_video2.modeling.attention import SanaVideo2LinearAttnProcessor

    return SanaVideo2LinearAttnProcessor


def _bf16_guards(attn: torch.nn.Module, hidden_states: torch.Tensor, what: str) -> Optional[Union[Declined, NotApplicable]]:
    """The guards both BF16 paths share: CUDA, bf16 activations, and something to gain (``fp32_attention`` set)."""
    device_reason = device_reject_reason(hidden_states.device, what)
    if device_reason is not None:
        return Declined(device_reason)
    if hidden_states.dtype != torch.bfloat16:
        return Declined(f"activations are {hidden_states.dtype}: {what} needs bfloat16")
    if not attn.fp32_attention:
        return NotApplicable(FP32_ATTENTION_OFF)
    return None


def _bf16_call(fast_path: FastPath, attn: torch.nn.Module, args: tuple, kwargs: dict,
               what: str) -> tuple[Optional[dict], Optional[Union[Declined, NotApplicable]]]:
    """(the call's ``hidden_states`` and ``rotary_emb``, None) when the processor is the one ``apply()`` found and
    the shared BF16 guards pass; else (None, the verdict)."""
    mismatch = fast_path.processor_mismatch(attn)
    if mismatch is not None:
        return None, Declined(mismatch)
    call = bind_call(args, kwargs, ("hidden_states", "rotary_emb"))
    verdict = _bf16_guards(attn, call["hidden_states"], what)
    return (None, verdict) if verdict is not None else (call, None)


class AnchorAttentionBF16(FastPath):
    """SDPA on the anchors' BF16 q, k, v instead of the FP32 upcast."""

    fusion = SOFTMAX_FUSION
    description = "anchor attention on BF16 operands (SDPA without the FP32 upcast)"
    policy_reasons = (FP32_ANCHOR_STEP, FP32_ANCHOR_LAYER, ANCHOR_STEP_UNKNOWN, ANCHOR_TOTAL_UNKNOWN, FP32_ATTENTION_OFF)
    fused_ops = (ROTARY_COMPLEX_PAIR, SIGMOID_GATE)  # through rope_pair(site), sigmoid_gate(site)

    def expected_processor(self) -> type:
        return _anchor_processor_class()

    def kernel_reject_reason(self) -> Optional[str]:
        return cuda_reject_reason()

    def keeps_reference_layer(self, site: Site) -> bool:
        return site.layer_index in site.model.options.anchor_fp32_layers

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.attention import anchor_qkv

        options: SanaVideo2Options = site.model.options
        verdict = step_layer_policy(site, first_steps=options.anchor_fp32_steps, step_reason=FP32_ANCHOR_STEP,
                                    layer_reason=FP32_ANCHOR_LAYER, unknown_reason=ANCHOR_STEP_UNKNOWN,
                                    total_reason=ANCHOR_TOTAL_UNKNOWN)
        if verdict is not None:
            return verdict
        call, verdict = _bf16_call(self, attn, args, kwargs, "the BF16 anchor path")
        if verdict is not None:
            return verdict
        hidden_states = call["hidden_states"]
        query, key, value = anchor_qkv(attn, hidden_states, call["rotary_emb"], rope_pair(site))
        if not (query.dim() == 4 and query.shape == key.shape == value.shape):
            return Declined(f"q/k/v shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}: the BF16 "
                           "anchor path takes 4-D q/k/v of equal shape")
        return anchor_attention(site, attn, hidden_states, query, key, value, upcast=False)


class LinearAttentionBF16GEMM(FastPath):
    """The gated linear attention with its first GEMM on BF16 operands and FP32 accumulation."""

    fusion = LINEAR_FUSION
    description = "gated linear attention, first GEMM (v·k̃ᵀ) on BF16 operands with FP32 accumulation"
    policy_reasons = (FP32_ATTENTION_OFF,)
    fused_ops = (ROTARY_COMPLEX_PAIR, SIGMOID_GATE)  # through rope_pair(site), sigmoid_gate(site)

    def expected_processor(self) -> type:
        return _linear_processor_class()

    def kernel_reject_reason(self) -> Optional[str]:
        return bmm_bf16_fp32_reject_reason()

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.attention import gated_linear_attention
        from accelpatch.parallel.sequence import processor_shards

        call, verdict = _bf16_call(self, attn, args, kwargs, "the BF16-input GEMM")
        if verdict is not None:
            return verdict
        return gated_linear_attention(attn, call["hidden_states"], call["rotary_emb"], first_gemm=key_value_state_bf16,
                                      rope_pair=rope_pair(site), gate=sigmoid_gate(site),
                                      shards=processor_shards(attn.processor))


class AnchorSolAttention(SolAttnFastPath):
    """Sol-Attn on the anchors (head dim 256), on the q, k, v in the activations' dtype; no sink."""

    fusion = SOL_FUSION
    description = "block-sparse Sol-Attn on the anchors (head dim 256, no sink)"
    fused_ops = (ROTARY_COMPLEX_PAIR, SIGMOID_GATE)  # through rope_pair(site), sigmoid_gate(site)

    def expected_processor(self) -> type:
        return _anchor_processor_class()

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.attention import anchor_output, anchor_qkv

        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb"))
        hidden_states = call["hidden_states"]
        query, key, value = anchor_qkv(attn, hidden_states, call["rotary_emb"], rope_pair(site))
        return SparseCall(query, key, value, functools.partial(anchor_output, attn, hidden_states=hidden_states,
                                                               gate=sigmoid_gate(site)))


ANCHOR_BF16 = AnchorAttentionBF16()
LINEAR_BF16_GEMM = LinearAttentionBF16GEMM()
ANCHOR_SOL_ATTN = AnchorSolAttention()
