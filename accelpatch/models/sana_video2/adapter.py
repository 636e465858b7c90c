"""SANA-Video 2.0 (accelpatch's ``SanaVideo2Transformer3DModel``): its sites are the blocks ``blocks.N`` and their
self-attention modules ``blocks.N.attn``, the softmax "anchor" layers (``SanaVideo2SoftmaxAttention``) and the gated
linear-attention layers (``SanaVideo2LinearAttention``), each kind with its own marker pair. The lossless fused
paths of :mod:`.fused` sit on all of them (the attention ones under the ``high`` paths below, stacked); the paths
described here are ``high`` tier.

- **Anchors on BF16 operands**: SDPA on the BF16 q, k, v instead of the release's FP32 upcast, so a flash-class
  kernel runs (the prior art measured one 720p anchor layer 7.1× faster on an H200). The options
  ``anchor_fp32_steps`` (the first N denoising steps keep FP32 anchors; default 10) and ``anchor_fp32_layers``
  (anchors that always keep FP32) are the middle ground between that speed and the release's numerics.
- **Linear attention, first GEMM on BF16 operands with FP32 accumulation** (``ops.gemm.key_value_state_bf16``, as
  SANA-Video's site), the second GEMM in FP32 as the release.
- **``backend="sol_attn"``**: the anchors run Sol-Attn at head dim 256 under the backend's policy
  (:mod:`accelpatch.sol_attn.sites`, shared with MiniMax-H3); no sink (text enters through cross-attention);
  ``dense_layers`` name anchor layers and default to the first one. The linear layers keep their BF16-GEMM path.

Each path restates only what it changes: the processors' own parts (``anchor_qkv``, ``anchor_output``,
``gated_linear_attention``) do the rest. Guards (CUDA, bf16 activations, ``fp32_attention`` set, the processor
being ours) send anything else to the original processor, counted with the reason.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

import torch

from accelpatch.sol_attn.config import _check_int, all_layers_dense_reason, format_layers, parse_layers
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.models.sana_video.gemm import bmm_bf16_fp32_reject_reason, key_value_state_bf16
from accelpatch.core.sites import (Decline, Dense, FastPath, Site, bind_call, cuda_reject_reason, device_reject_reason,
                          step_layer_policy)
from accelpatch.sol_attn.sites import SolAttnFastPath, SparseCall
from accelpatch.core.tiers import Tier
from accelpatch.core.adapter import NO_BACKEND, CacheSupport, ModelAdapter, SiteRule
from accelpatch.lossless.ops import ROTARY_COMPLEX_PAIR, SIGMOID_GATE
from accelpatch.models.sana_video2.lossless import FUSED_ANCHOR, FUSED_BLOCK, FUSED_LINEAR, anchor_attention, rope_pair, sigmoid_gate

SOFTMAX_FUSION = QualityGatedFusion.named("sana_video2_softmax_attention", Tier.HIGH)
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
FP32_ATTENTION_OFF = "fp32_attention is off: the reference already runs this attention in the activations' dtype"



@dataclass(frozen=True)
class SanaVideo2Options:
    """Options of ``apply(model, ...)`` for SANA-Video 2.0: where the BF16 anchor path keeps the release's FP32.

    ``anchor_fp32_steps``: denoising steps with index < N keep FP32 anchors (the step clock of accelpatch.core.steps);
    default 10 of the release's 50, by analogy with the sol_attn backend's ``dense_steps`` (unmeasured on the
    released weights: see docs/models/sana-video2.md). ``anchor_fp32_layers``: anchor layers that always keep FP32
    (``"3,7"``, an iterable; a range such as ``"3-11"`` only where every layer in it is an anchor).
    ``anchor_fp32_steps=0, anchor_fp32_layers=""`` is the prior art's full-speed setting.
    """

    anchor_fp32_steps: int = 10
    anchor_fp32_layers: frozenset = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "anchor_fp32_steps", _check_int("anchor_fp32_steps", self.anchor_fp32_steps, 0))
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


def _bf16_guards(attn: torch.nn.Module, hidden_states: torch.Tensor, what: str) -> Optional[Union[Decline, Dense]]:
    """The guards both BF16 paths share: CUDA, bf16 activations, and something to gain (``fp32_attention`` set)."""
    device_reason = device_reject_reason(hidden_states.device, what)
    if device_reason is not None:
        return Decline(device_reason)
    if hidden_states.dtype != torch.bfloat16:
        return Decline(f"activations are {hidden_states.dtype}: {what} needs bfloat16")
    if not attn.fp32_attention:
        return Dense(FP32_ATTENTION_OFF)
    return None


def _bf16_call(fast_path: FastPath, attn: torch.nn.Module, args: tuple, kwargs: dict,
               what: str) -> tuple[Optional[dict], Optional[Union[Decline, Dense]]]:
    """(the call's ``hidden_states`` and ``rotary_emb``, None) when the processor is the one ``apply()`` found and
    the shared BF16 guards pass; else (None, the verdict)."""
    mismatch = fast_path.processor_mismatch(attn)
    if mismatch is not None:
        return None, Decline(mismatch)
    call = bind_call(args, kwargs, ("hidden_states", "rotary_emb"))
    verdict = _bf16_guards(attn, call["hidden_states"], what)
    return (None, verdict) if verdict is not None else (call, None)


class AnchorAttentionBF16(FastPath):
    """SDPA on the anchors' BF16 q, k, v instead of the FP32 upcast."""

    fusion = SOFTMAX_FUSION
    description = "anchor attention on BF16 operands (SDPA without the FP32 upcast)"
    policy_reasons = (FP32_ANCHOR_STEP, FP32_ANCHOR_LAYER, ANCHOR_STEP_UNKNOWN, FP32_ATTENTION_OFF)
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
                                    layer_reason=FP32_ANCHOR_LAYER, unknown_reason=ANCHOR_STEP_UNKNOWN)
        if verdict is not None:
            return verdict
        call, verdict = _bf16_call(self, attn, args, kwargs, "the BF16 anchor path")
        if verdict is not None:
            return verdict
        hidden_states = call["hidden_states"]
        query, key, value = anchor_qkv(attn, hidden_states, call["rotary_emb"], rope_pair(site))
        if not (query.dim() == 4 and query.shape == key.shape == value.shape):
            return Decline(f"q/k/v shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}: the BF16 "
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


def is_anchor(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a softmax anchor attention (the other ``blocks.N.attn`` are linear attention)."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2SoftmaxAttention

    return isinstance(module, SanaVideo2SoftmaxAttention)


def is_linear(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a gated linear attention."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2LinearAttention

    return isinstance(module, SanaVideo2LinearAttention)


#: which module carries which fast path: every block's fusion and every attention's lossless fusion (any backend or
#: none); the anchors' BF16 path without a backend and their Sol-Attn path with ``sol_attn`` (high, stacked above
#: the anchor fusion by tier); the linear layers' BF16-GEMM path with or without a backend (high, above their fusion).
#: Anchor or linear is the module's class (the model's config says which layers are anchors), not its path.
SITES = (
    SiteRule(r"blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"blocks\.(\d+)\.attn", FUSED_ANCHOR, when=is_anchor),
    SiteRule(r"blocks\.(\d+)\.attn", LINEAR_BF16_GEMM, when=is_linear),
    SiteRule(r"blocks\.(\d+)\.attn", FUSED_LINEAR, when=is_linear),
    SiteRule(r"blocks\.(\d+)\.attn", ANCHOR_BF16, backend=NO_BACKEND, when=is_anchor),
    SiteRule(r"blocks\.(\d+)\.attn", ANCHOR_SOL_ATTN, backend="sol_attn", when=is_anchor),
)


class SanaVideo2Adapter(ModelAdapter):
    family = "SANA-Video 2.0"
    model_classes = (("accelpatch.models.sana_video2.modeling", "SanaVideo2Transformer3DModel"),)
    backends = ("sol_attn",)
    sites = SITES
    options_class = SanaVideo2Options
    # the model's own hook point (its blocks feed Block Attention Residuals, not a chain of hidden states)
    cache = CacheSupport(methods=("first_block",),
                         why_not=("MagCache needs residual blocks that return the next hidden states; SANA-Video "
                                  "2.0's blocks return deltas into Block Attention Residuals"))

    def complete_backend(self, backend_config: Any, model: torch.nn.Module) -> Any:
        if backend_config is not None and backend_config.dense_layers is None:
            return dataclasses.replace(backend_config, dense_layers=frozenset(model.softmax_layer_indices[:1]))
        return backend_config

    @staticmethod
    def _check_anchor_layers(name: str, layers: frozenset, model: torch.nn.Module) -> None:
        anchors = list(model.softmax_layer_indices)
        stray = sorted(set(layers) - set(anchors))
        if stray:
            raise ValueError(f"{name} names layer(s) {stray} that are not anchor layers of {type(model).__name__}: "
                             f"its softmax anchors are {', '.join(map(str, anchors))} (the other layers use linear "
                             "attention)")

    def validate_backend(self, backend_config: Any, model: torch.nn.Module) -> None:
        super().validate_backend(backend_config, model)
        if backend_config is not None:
            self._check_anchor_layers("dense_layers", backend_config.dense_layers, model)

    def validate_options(self, options: Any, model: torch.nn.Module) -> None:
        self._check_anchor_layers("anchor_fp32_layers", options.anchor_fp32_layers, model)

    def static_noops(self, model: torch.nn.Module, backend_config: Any, options: Any,
                     asked: Any = None) -> list[str]:
        from accelpatch.models.sana_video2.modeling import SanaVideo2LinearAttention, SanaVideo2SoftmaxAttention

        name, anchors = type(model).__name__, model.softmax_layer_indices
        if backend_config is not None:
            reason = all_layers_dense_reason(backend_config, anchors, name, what="anchor layers",
                                             defaulted=asked.dense_layers is None)
            return [reason] if reason is not None else []
        reasons = []
        if anchors and set(anchors) <= options.anchor_fp32_layers:
            reasons.append(f"the BF16 anchor path never runs on {name}: anchor_fp32_layers="
                           f"{format_layers(options.anchor_fp32_layers)!r} cover all {len(anchors)} of its anchor "
                           f"layers ({format_layers(anchors)}); pass fewer anchor layers, or '' for none")
        for kind, what in ((SanaVideo2SoftmaxAttention, "BF16 anchor path"),
                           (SanaVideo2LinearAttention, "BF16-GEMM linear-attention path")):
            layers = [m for m in model.modules() if isinstance(m, kind)]
            if layers and not any(m.fp32_attention for m in layers):
                reasons.append(f"the {what} never runs on {name}: fp32_attention is off in all {len(layers)} of "
                               "those layers, so the reference already runs them in the activations' dtype")
        return reasons

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple[int, ...]:
        if backend_config is not None:
            return (backend_config.dense_steps,)
        return (options.anchor_fp32_steps,) if options is not None else ()
