"""MiniMax-H3's ``high``-tier fast paths (see :mod:`.adapter` for where they sit and why): the Sol-Attn sparse path over
the packed sequence (:class:`MiniMaxH3SolAttention`) with the per-call packed layout it reads (:class:`PackedLayout`,
captured by the adapter from ``token_tags``), and the always-dense token refiner attention of the ``sol_attn``
backend.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from accelpatch.core import call_context
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import Declined
from accelpatch.core.sites import Site, bind_call
from accelpatch.sol_attn.sites import (DENSE_LAYER, DENSE_STEP, STEP_UNKNOWN, AlwaysDense, SolAttnFastPath,  # noqa: F401
                                     SparseCall)
from accelpatch.core.tiers import Tier
from accelpatch.lossless.ops import ROTATE_HALF_PAIR
from accelpatch.models.minimax_h3.lossless import H3_ATTENTION_RESTATES, project_qkv

SOL_FUSION = QualityGatedFusion(name="sol_attn", marker_attr="_accelpatch_sol_attn_site",
                                enabled_attr="_accelpatch_sol_attn_enabled", tier=Tier.HIGH)
REFINER_FUSION = QualityGatedFusion(name="sol_attn_refiner", marker_attr="_accelpatch_sol_attn_refiner_site",
                                    enabled_attr="_accelpatch_sol_attn_refiner_enabled", tier=Tier.HIGH)

REFINER_DENSE = "text-only token refiner stays dense"
LAYOUT_IN_COMPILED_REGION = ("the packed layout (the text/audio sink and dense rows) cannot be read inside a "
                             "compiled region: the call runs dense; compile the transformer blocks instead of the "
                             "whole model, or pass sink_tokens/sink_start with dense_rows='none'")
NO_LAYOUT_ROWS = ("dense_rows='text_audio': no packed layout fits this call (no token_tags reached the model's "
                  "forward, or they describe another sequence length), so every query row ran sparse; call the model "
                  "with token_tags, or set dense_rows='none' to say so")
GATHERED_ROWS = ("dense_rows='text_audio': the text/audio rows are not one contiguous range, so they were gathered "
                 "and recomputed densely (exact); the sink covers their hull, video rows inside it included")


@dataclass(frozen=True)
class PackedLayout:
    """Where the non-video (text/audio) rows of the packed sequence lie: one contiguous hull used as the sink, and
    ``rows``, their sorted indices when they do not fill the hull (None when the hull is exactly those rows)."""

    seq_len: int
    sink_start: int
    sink_tokens: int
    rows: Optional[tuple[int, ...]] = None

    def dense_rows(self):
        """The text/audio query rows: a slice when contiguous, else their indices (None when there are none)."""
        if self.sink_tokens == 0:
            return None
        return slice(self.sink_start, self.sink_start + self.sink_tokens) if self.rows is None else self.rows


_layout: contextvars.ContextVar[Optional[PackedLayout]] = call_context.register(
    contextvars.ContextVar("accelpatch_h3_layout", default=None))


_LAYOUTS: dict[tuple, PackedLayout] = {}


def layout_from_token_tags(token_tags: torch.Tensor) -> PackedLayout:
    """The hull of the rows tagged text (1) or audio (2); video rows inside the hull only make the sink larger,
    which keeps more keys exact and never fewer. Interned: compiled code guards on the object it reads, and the
    layout of a generation does not change from step to step."""
    seq_len = int(token_tags.shape[0])
    rows = torch.nonzero(token_tags != 0).flatten()
    if rows.numel() == 0:
        key = (seq_len, 0, 0, None)
    else:
        start, end = int(rows.min()), int(rows.max()) + 1
        key = (seq_len, start, end - start, None if rows.numel() == end - start else tuple(rows.tolist()))
    return _LAYOUTS.setdefault(key, PackedLayout(*key))


_read_layout = call_context.ContextReader(_layout)


def current_layout() -> Optional[PackedLayout]:
    return _read_layout()


def capture_layout(arguments: Mapping[str, Any]) -> tuple:
    """The packed layout of one forward's ``token_tags`` (None without them, or when their values cannot be read:
    fake or meta tensors in a memory plan, where the rows then run as without a layout), set for the duration of the
    forward (the adapter's ``capture_for`` with a backend)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    tags = arguments.get("token_tags")
    layout = None
    if isinstance(tags, torch.Tensor) and tags.device.type != "meta":
        try:
            layout = layout_from_token_tags(tags)
        except (DataDependentOutputException, DynamicOutputShapeException):
            pass  # a fake tensor without values (accelpatch.memory's traces give the inputs theirs)
    return ((_layout, layout),)


def _processor_class() -> type:
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

    return MiniMaxH3AttnProcessor


class MiniMaxH3SolAttention(SolAttnFastPath):
    """Sol-Attn over the packed sequence; the text/audio hull of the layout is the always-exact key sink, and with
    ``dense_rows="text_audio"`` the text/audio query rows are recomputed densely through diffusers' dispatcher."""

    fusion = SOL_FUSION
    description = "block-sparse Sol-Attn with rank-1 correction; text/audio rows as exact sink (and dense queries)"
    policy_reasons = SolAttnFastPath.policy_reasons + (LAYOUT_IN_COMPILED_REGION,)
    fused_ops = (ROTATE_HALF_PAIR,)  # through project_qkv
    restates = H3_ATTENTION_RESTATES

    def expected_processor(self) -> type:
        return _processor_class()

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb", "attention_mask"))
        if call["attention_mask"] is not None:
            return Declined("an attention_mask was given: the sparse path covers unmasked attention only")
        config = site.model.backend
        layout = current_layout()
        if layout is None and torch.compiler.is_compiling() and (config.sink_tokens is None
                                                                 or config.dense_rows != "none"):
            return Declined(LAYOUT_IN_COMPILED_REGION)
        query, key, value = project_qkv(attn, site, call["hidden_states"], call["rotary_emb"])

        def finish(out: torch.Tensor) -> torch.Tensor:
            out = out.flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))

        return SparseCall(query, key, value, finish, dense_backend=attn.processor._attention_backend)

    def localize(self, call: SparseCall, site: Site) -> SparseCall:
        """The layout's text/audio hull as the sink and, with ``dense_rows="text_audio"``, the text/audio query rows
        to recompute densely, once q/k/v cover the whole packed sequence (at once, or after Ulysses' exchange: the
        heads are split across ranks, the rows are not, so the layout's rows hold on every rank)."""
        layout = current_layout()
        wants_rows = site.model.backend.dense_rows == "text_audio"
        counting = not call_context.recomputing()
        if layout is None or layout.seq_len != call.query.shape[1]:
            if wants_rows and counting:
                site.counters.count_note(NO_LAYOUT_ROWS)
            return call
        if layout.sink_tokens == 0:
            return call  # video rows only: nothing to keep dense, nothing to sink
        call.sink_tokens, call.sink_start = layout.sink_tokens, layout.sink_start
        if not wants_rows:
            return call
        from diffusers.models.transformers import transformer_minimax_h3 as h3

        backend = call.dense_backend
        call.dense_rows = layout.dense_rows()
        call.dense_attention = lambda q, k, v: h3.dispatch_attention_fn(
            q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, backend=backend, parallel_config=None)
        if layout.rows is not None and counting:
            site.counters.count_note(GATHERED_ROWS)
        return call


SOL_ATTENTION = MiniMaxH3SolAttention()
#: the token refiner attends over text only: always dense, counted
REFINER_DENSE_PATH = AlwaysDense(REFINER_FUSION, "text-only token refiner attention (always dense)", REFINER_DENSE)
