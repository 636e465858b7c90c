"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``) with the ``sol_attn`` backend.

Sites: ``transformer_blocks.N.attn`` (full self-attention over the packed text/audio/video sequence) carry the
Sol-Attn sparse path (``high``); ``token_refiner.refiner_blocks.N.attn`` (text only) are sites that always stay
dense, so the report counts them too. Without a backend MiniMax-H3 has no fast path.

Per call, a pre-forward hook on the transformer captures the packed layout (the text/audio rows become the
always-exact key sink, and their query rows are recomputed densely, as in the prior art for such models) and,
when the model came through a pipeline, the scheduler's step. Dense steps and dense layers, and every call that
does not fit the sparse path, run the original processor unchanged.
"""
from __future__ import annotations

import contextvars
import inspect
import re
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from .. import steps
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
DENSE_LAYER = "dense layer (in dense_layers)"
REFINER_DENSE = "text-only token refiner stays dense"


@dataclass(frozen=True)
class PackedLayout:
    """Where the non-video (text/audio) rows of the packed sequence lie: one contiguous hull used as the sink."""

    seq_len: int
    sink_start: int
    sink_tokens: int


_layout: contextvars.ContextVar[Optional[PackedLayout]] = contextvars.ContextVar("accelpatch_h3_layout",
                                                                                 default=None)


def layout_from_token_tags(token_tags: torch.Tensor) -> PackedLayout:
    """The hull of the rows tagged text (1) or audio (2); video rows inside the hull only make the sink larger,
    which keeps more keys exact and never fewer."""
    seq_len = int(token_tags.shape[0])
    rows = torch.nonzero(token_tags != 0).flatten()
    if rows.numel() == 0:
        return PackedLayout(seq_len, 0, 0)
    start, end = int(rows.min()), int(rows.max()) + 1
    return PackedLayout(seq_len, start, end - start)


#: the context tokens the pre-forward hook set, for the post-forward hook to reset
_hook_tokens: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("accelpatch_h3_hook_tokens",
                                                                               default=None)


def current_layout() -> Optional[PackedLayout]:
    return _layout.get()


class _ForwardHooks:
    """Pre/post forward hooks on the transformer: capture the layout and the pipeline's step for this call."""

    def __init__(self, model: torch.nn.Module, pipeline: Optional[Any]) -> None:
        self._signature = inspect.signature(type(model).forward)
        self._pipeline = weakref.ref(pipeline) if pipeline is not None else None
        self.handles = [model.register_forward_pre_hook(self.pre, with_kwargs=True),
                        model.register_forward_hook(self.post, always_call=True)]

    def pre(self, module, args, kwargs):
        bound = self._signature.bind_partial(module, *args, **kwargs).arguments
        tags = bound.get("token_tags")
        layout_token = _layout.set(layout_from_token_tags(tags) if isinstance(tags, torch.Tensor) else None)
        step_token = None
        pipeline = self._pipeline() if self._pipeline is not None else None
        scheduler = getattr(pipeline, "scheduler", None) if pipeline is not None else None
        if scheduler is not None:
            step_token = steps.enter_pipeline_step(steps.scheduler_step(scheduler))
        _hook_tokens.set((layout_token, step_token))
        return None

    def post(self, module, args, output):
        tokens = _hook_tokens.get()
        if tokens is not None:
            layout_token, step_token = tokens
            _hook_tokens.set(None)
            if step_token is not None:
                steps.exit_pipeline_step(step_token)
            try:
                _layout.reset(layout_token)
            except ValueError:
                pass
        return None

    def __getstate__(self) -> dict:
        # A weak reference cannot be copied or pickled: a copied model keeps its hooks but loses the pipeline's
        # step clock (use accelpatch.denoising_step, or apply() the copy through its pipeline again).
        return dict(self.__dict__, _pipeline=None)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


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
        if steps.current_denoising_step() < config.dense_steps:
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
        out, stats = sol_attn(query, key, value, tau=config.tau, thresh_type=config.thresh_type,
                              kv_splits=config.resolve_kv_splits(query.device, seq_len), sink_tokens=sink_tokens,
                              sink_start=sink_start, impl=config.impl, return_stats=True)
        site.counters.add_stat("exact_fraction",
                               stats.exact_pairs.sum() / (stats.total_pairs * stats.exact_pairs.numel()))
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

    def attach_hooks(self, model, patch, pipeline):
        if patch.backend is None:
            return ()
        hooks = _ForwardHooks(model, pipeline)
        return (hooks.remove,)
