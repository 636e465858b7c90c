"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``) with the ``sol_attn`` backend.

Sites: ``transformer_blocks.N.attn`` (full self-attention over the packed text/audio/video sequence) carry the
Sol-Attn sparse path (``high``); ``token_refiner.refiner_blocks.N.attn`` (text only) are sites that always stay
dense, so the report counts them too. Without a backend MiniMax-H3 has no fast path.

Per call, the model's pre-forward hook (accelpatch.model_hooks) captures the packed layout (the text/audio rows
become the always-exact key sink, and their query rows are recomputed densely, as in the prior art for such
models) and the step (accelpatch.steps: the pipeline's scheduler, else the ``timestep`` argument, where 1 means
clean). Dense steps and dense layers, and every call that does not fit the sparse path, run the original processor
unchanged. The op has a backward, so training through the sparse path works (gradients of the sparse function).
"""
from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import torch

from .. import call_context, steps
from ..backends.sol_attn import SolAttnConfig
from ..gate import QualityGatedFusion
from ..sites.base import Decline, Dense, FastPath, Site, bind_call
from ..tiers import DEFAULT_TIER, Tier
from .base import ModelAdapter

SOL_FUSION = QualityGatedFusion(name="sol_attn", marker_attr="_accelpatch_sol_attn_site",
                                enabled_attr="_accelpatch_sol_attn_enabled", tier=Tier.HIGH)
REFINER_FUSION = QualityGatedFusion(name="sol_attn_refiner", marker_attr="_accelpatch_sol_attn_refiner_site",
                                    enabled_attr="_accelpatch_sol_attn_refiner_enabled", tier=Tier.HIGH)

_MAIN_ATTENTION = re.compile(r"transformer_blocks\.(\d+)\.attn")
_REFINER_ATTENTION = re.compile(r"token_refiner\.refiner_blocks\.(\d+)\.attn")

DENSE_STEP = "dense step (step < dense_steps)"
STEP_UNKNOWN = ("no denoising step is known, so dense_steps cannot apply and the call runs dense; run it through a "
                "diffusers pipeline, pass a timestep, wrap it in accelpatch.denoising_step(i), or set dense_steps=0")
DENSE_LAYER = "dense layer (in dense_layers)"
REFINER_DENSE = "text-only token refiner stays dense"


@dataclass(frozen=True)
class PackedLayout:
    """Where the non-video (text/audio) rows of the packed sequence lie: one contiguous hull used as the sink."""

    seq_len: int
    sink_start: int
    sink_tokens: int


_layout: contextvars.ContextVar[Optional[PackedLayout]] = call_context.register(
    contextvars.ContextVar("accelpatch_h3_layout", default=None))


def layout_from_token_tags(token_tags: torch.Tensor) -> PackedLayout:
    """The hull of the rows tagged text (1) or audio (2); video rows inside the hull only make the sink larger,
    which keeps more keys exact and never fewer."""
    seq_len = int(token_tags.shape[0])
    rows = torch.nonzero(token_tags != 0).flatten()
    if rows.numel() == 0:
        return PackedLayout(seq_len, 0, 0)
    start, end = int(rows.min()), int(rows.max()) + 1
    return PackedLayout(seq_len, start, end - start)


def current_layout() -> Optional[PackedLayout]:
    return _layout.get()


def _processor_class() -> type:
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

    return MiniMaxH3AttnProcessor


def _project_qkv(attn, hidden_states, rotary_emb):
    """q, k, v [B, S, H, D] exactly as ``MiniMaxH3AttnProcessor`` builds them before attention."""
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    if attn.fused_projections:
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
    key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
    value = value.unflatten(-1, (attn.heads, -1))
    if rotary_emb is not None:
        query = _apply_rotary_emb(query, *rotary_emb)
        key = _apply_rotary_emb(key, *rotary_emb)
    return query, key, value


class MiniMaxH3SolAttention(FastPath):
    """Sol-Attn over the packed sequence, with the dense policy of :class:`SolAttnConfig` in front."""

    fusion = SOL_FUSION
    description = "block-sparse Sol-Attn with rank-1 correction; text/audio rows as exact sink and dense queries"

    def expected_processor(self) -> type:
        return _processor_class()

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return self.processor_mismatch(module)

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        config: SolAttnConfig = site.model.backend
        if config.dense_steps > 0:
            step = steps.current_step().step
            if step is None:
                return Decline(STEP_UNKNOWN)
            if step < config.dense_steps:
                return Dense(DENSE_STEP)
        if site.layer_index in config.dense_layers:
            return Dense(DENSE_LAYER)
        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb", "attention_mask"))
        hidden_states, rotary_emb, attention_mask = call["hidden_states"], call["rotary_emb"], call["attention_mask"]
        mismatch = self.processor_mismatch(attn)
        if mismatch is not None:
            return Decline(mismatch)
        processor = attn.processor
        if attention_mask is not None:
            return Decline("an attention_mask was given: the sparse path covers unmasked attention only")
        if getattr(processor, "_parallel_config", None) is not None:
            return Decline("context parallelism is configured: the sparse path does not shard the sequence")
        if hidden_states.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return Decline(f"activations are {hidden_states.dtype}: the sparse path takes fp32, bf16 or fp16")

        seq_len = hidden_states.shape[1]
        if config.sink_tokens is not None:
            start = seq_len - config.sink_tokens if config.sink_start is None else config.sink_start
            if config.sink_tokens > seq_len or start + config.sink_tokens > seq_len:
                return Decline(f"the sink (sink_start={config.sink_start}, sink_tokens={config.sink_tokens}) reaches "
                               f"past the packed sequence of {seq_len} rows; valid: sink_tokens <= {seq_len} and "
                               f"sink_start + sink_tokens <= {seq_len}")

        query, key, value = _project_qkv(attn, hidden_states, rotary_emb)
        if not (query.dtype == key.dtype == value.dtype):
            return Decline(f"q/k/v dtypes differ ({query.dtype}, {key.dtype}, {value.dtype})")
        out = self._attention(config, site, processor, query, key, value)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)

    @staticmethod
    def _attention(config: SolAttnConfig, site: Site, processor, query, key, value) -> torch.Tensor:
        from ..ops import sol_attn

        seq_len = query.shape[1]
        layout = current_layout()
        if config.sink_tokens is not None:
            sink_tokens, sink_start, dense_rows = config.sink_tokens, config.sink_start, None
        elif layout is not None and layout.seq_len == seq_len and layout.sink_tokens > 0:
            sink_tokens, sink_start = layout.sink_tokens, layout.sink_start
            dense_rows = slice(layout.sink_start, layout.sink_start + layout.sink_tokens)
        else:
            sink_tokens, sink_start, dense_rows = 0, None, None
        kv_splits = config.resolve_kv_splits(query.device, seq_len)
        if config.impl == "upstream" and not call_context.recomputing():
            from ..ops.sol_attn import upstream

            reason = upstream.unsupported_reason(query, kv_splits, sink_tokens, sink_start, contiguous=True)
            if reason is not None:  # the op runs our own kernel instead (and warns once)
                site.counters.count_note(f"impl='upstream' ran our own kernel: {reason}")
        out, stats = sol_attn(query, key, value, tau=config.tau, thresh_type=config.thresh_type, kv_splits=kv_splits,
                              sink_tokens=sink_tokens, sink_start=sink_start, impl=config.impl, return_stats=True)
        if not call_context.recomputing():
            site.counters.add_stat("exact_fraction",
                                   stats.exact_pairs.detach().sum() / (stats.total_pairs * stats.exact_pairs.numel()))
        if dense_rows is not None:
            # The sink's query rows (text/audio) attend densely to every key, through diffusers' dispatcher and
            # the processor's own backend choice; the op's output is a fresh tensor, so it is written in place.
            from diffusers.models.transformers import transformer_minimax_h3 as h3

            out[:, dense_rows] = h3.dispatch_attention_fn(
                query[:, dense_rows], key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                backend=processor._attention_backend, parallel_config=None).to(out.dtype)
        return out


class MiniMaxH3RefinerDense(FastPath):
    """The token refiner attends over text only: always dense, counted."""

    fusion = REFINER_FUSION
    description = "text-only token refiner attention (always dense)"

    def run(self, attn, site, args, kwargs):
        return Dense(REFINER_DENSE)


SOL_ATTENTION = MiniMaxH3SolAttention()
REFINER_DENSE_PATH = MiniMaxH3RefinerDense()


class MiniMaxH3Adapter(ModelAdapter):
    family = "MiniMax-H3"
    model_classes = (("diffusers", "MiniMaxH3Transformer3DModel"),)
    backends = ("sol_attn",)

    def default_tier(self, backend_config: Any) -> Tier:
        return Tier.HIGH if backend_config is not None else DEFAULT_TIER

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple]:
        if backend_config is None:
            return
        for path, module in model.named_modules():
            match = _MAIN_ATTENTION.fullmatch(path)
            if match is not None:
                yield path, module, SOL_ATTENTION, int(match.group(1))
            elif _REFINER_ATTENTION.fullmatch(path):
                yield path, module, REFINER_DENSE_PATH, None

    def validate_backend(self, backend_config: Any, model: torch.nn.Module) -> None:
        super().validate_backend(backend_config, model)
        if backend_config is None:
            return
        layers = len(model.transformer_blocks)
        missing = sorted(i for i in backend_config.dense_layers if i >= layers)
        if missing:
            raise ValueError(f"dense_layers names layer(s) {missing} that {type(model).__name__} does not have: it "
                             f"has {layers} transformer blocks, valid layer indices are 0-{layers - 1}")

    def uses_steps(self, backend_config: Any) -> bool:
        return backend_config is not None and backend_config.dense_steps > 0

    def noise_level(self, timestep_values: tuple[float, ...]) -> float:
        return 1.0 - min(timestep_values)  # H3 timesteps run from 0 (noise) to 1 (clean); the noisiest rows count

    def captures(self, backend_config: Any) -> bool:
        return backend_config is not None

    def capture(self, arguments: Mapping[str, Any], backend_config: Any):
        tags = arguments.get("token_tags")
        return ((_layout, layout_from_token_tags(tags) if isinstance(tags, torch.Tensor) else None),)
