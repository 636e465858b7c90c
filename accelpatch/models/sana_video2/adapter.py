"""SANA-Video 2.0 (accelpatch's ``SanaVideo2Transformer3DModel``): its sites are the blocks ``blocks.N`` and their
self-attention modules ``blocks.N.attn``, the softmax "anchor" layers (``SanaVideo2SoftmaxAttention``) and the gated
linear-attention layers (``SanaVideo2LinearAttention``), each kind with its own marker pair. The lossless fused
paths of :mod:`.lossless` sit on all of them (the attention ones under the ``high`` paths below, stacked); the paths
described here are ``high`` tier.

- **Anchors on BF16 operands**: SDPA on the BF16 q, k, v instead of the release's FP32 upcast, so a flash-class
  kernel runs (the prior art measured one 720p anchor layer 7.1× faster on an H200). The options
  ``anchor_fp32_steps`` (the first denoising steps keep FP32 anchors; default 0.2, the first 20 % of the call's steps) and ``anchor_fp32_layers``
  (anchors that always keep FP32) are the middle ground between that speed and the release's numerics.
- **Linear attention, first GEMM on BF16 operands with FP32 accumulation** (``ops.gemm.key_value_state_bf16``, as
  SANA-Video's site), the second GEMM in FP32 as the release.
- **``backend="sol_attn"``**: the anchors run Sol-Attn at head dim 256 under the backend's policy
  (:mod:`accelpatch.sol_attn.sites`, shared with MiniMax-H3); no sink (text enters through cross-attention);
  ``dense_layers`` name anchor layers and default to the first one. The linear layers keep their BF16-GEMM path.

Each path restates only what it changes: the processors' own parts (``anchor_qkv``, ``anchor_output``,
``gated_linear_attention``) do the rest. Guards (CUDA, bf16 activations, ``fp32_attention`` set, the processor
being ours) send anything else to the original processor, counted with the reason.

The site table is :data:`SITES` below; the ``high`` fast paths are in :mod:`.high`, the lossless ones in
:mod:`.lossless`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from accelpatch.sol_attn.config import all_layers_dense_reason, format_layers
from accelpatch.core.adapter import NO_BACKEND, CacheSupport, ModelAdapter, SiteRule
from accelpatch.core.steps import from_end, step_count
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.models.sana_video2.lossless import FUSED_ANCHOR, FUSED_BLOCK, FUSED_LINEAR
from accelpatch.models.sana_video2.high import ANCHOR_BF16, ANCHOR_SOL_ATTN, LINEAR_BF16_GEMM, SanaVideo2Options


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
    # memory="low": not the linear attention's o_norm, an RMSNorm over dim -2 of (.., head_dim, tokens), whose
    # reduction rounds differently over a slice of the tokens (measured; its check declines it)
    chunked_rule(r"blocks\.(\d+)\.(?:mlp|norm[12]|attn\.[qk]_norm|cross_attn\.q_norm)"),
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

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple:
        if backend_config is not None:
            return step_count(backend_config.dense_steps), from_end(backend_config.dense_last_steps)  # Sol-Attn's
        return (step_count(options.anchor_fp32_steps),) if options is not None else ()
