"""The ``sol_attn`` backend's policy, one implementation for every model that runs Sol-Attn in place of a dense
softmax attention (MiniMax-H3's packed attention, SANA-Video 2.0's anchors).

A model's fast path subclasses :class:`SolAttnFastPath` and says only how its attention splits around the
attention core (:meth:`SolAttnFastPath.prepare`: q, k, v and what to do with the result, plus any sink the model
derives itself). Everything else is here, in this order: the dense policy (the first ``dense_steps`` steps by the
step clock, an unknown step declining; the layers in ``dense_layers``), the processor it restates, context
parallelism, float activations, a configured sink inside the sequence; then the op with per-call exact-fraction
statistics and ``impl="upstream"`` notes, and the dense recomputation of the sink's own query rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from .. import call_context
from ..backends.sol_attn import SolAttnConfig
from .base import Decline, Dense, FastPath, Site, step_layer_policy

DENSE_STEP = "dense step (step < dense_steps)"
DENSE_LAYER = "dense layer (in dense_layers)"
STEP_UNKNOWN = ("no denoising step is known, so dense_steps cannot apply and the call runs dense; run it through a "
                "diffusers pipeline, pass a timestep, wrap it in accelpatch.denoising_step(i), or set dense_steps=0 "
                "(inside a whole-model torch.compile graph only denoising_step() is seen: compile the blocks instead)")
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class SparseCall:
    """One call's attention, split around its core: q, k, v [B, T, H, D]; ``finish`` maps the core's output
    [B, T, H, D] to the module's output. A model may bring its own sink (``sink_tokens``/``sink_start``) and the
    query rows to recompute densely (``dense_rows``, with ``dense_attention(q_rows, k, v)``: the model's own dense
    attention call)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    finish: Callable[[torch.Tensor], torch.Tensor]
    sink_tokens: int = 0
    sink_start: Optional[int] = None
    dense_rows: Optional[slice] = None
    dense_attention: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = None


def dense_policy(config: SolAttnConfig, site: Site) -> Optional[Union[Dense, Decline]]:
    """The policy's verdict for this call, or None when it may run sparse."""
    return step_layer_policy(site, first_steps=config.dense_steps, step_reason=DENSE_STEP, layer_reason=DENSE_LAYER,
                             unknown_reason=STEP_UNKNOWN)


def configured_sink_reason(config: SolAttnConfig, seq_len: int) -> Optional[str]:
    """Why the configured sink does not fit a sequence of ``seq_len`` rows (None when it does, or when the model
    derives its own)."""
    if config.sink_tokens is None:
        return None
    start = seq_len - config.sink_tokens if config.sink_start is None else config.sink_start
    if config.sink_tokens > seq_len or start + config.sink_tokens > seq_len:
        return (f"the sink (sink_start={config.sink_start}, sink_tokens={config.sink_tokens}) reaches past the "
                f"sequence of {seq_len} rows; valid: sink_tokens <= {seq_len} and sink_start + sink_tokens <= "
                f"{seq_len}")
    return None


class SolAttnFastPath(FastPath):
    """Sol-Attn with the ``sol_attn`` backend's policy in front; subclasses implement :meth:`prepare`."""

    policy_reasons = (DENSE_STEP, DENSE_LAYER, STEP_UNKNOWN)
    stat_names = ("exact_fraction",)

    def keeps_reference_layer(self, site: Site) -> bool:
        return site.layer_index in site.model.backend.dense_layers

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Decline]:
        raise NotImplementedError

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        config: SolAttnConfig = site.model.backend
        verdict = dense_policy(config, site)
        if verdict is not None:
            return verdict
        mismatch = self.processor_mismatch(attn)
        if mismatch is not None:
            return Decline(mismatch)
        if getattr(attn.processor, "_parallel_config", None) is not None:
            return Decline("context parallelism is configured: the sparse path does not shard the sequence")
        call = self.prepare(attn, site, args, kwargs)
        if isinstance(call, Decline):
            return call
        q, k, v = call.query, call.key, call.value
        if not (q.dtype == k.dtype == v.dtype) or q.dtype not in FLOAT_DTYPES:
            return Decline(f"q/k/v are {q.dtype}, {k.dtype}, {v.dtype}: the sparse path takes one of fp32, bf16, fp16")
        sink_reason = configured_sink_reason(config, q.shape[1])
        if sink_reason is not None:
            return Decline(sink_reason)
        if config.sink_tokens is not None:
            call.sink_tokens, call.sink_start, call.dense_rows = config.sink_tokens, config.sink_start, None
        return call.finish(sparse_attention(config, site, call))


def sparse_attention(config: SolAttnConfig, site: Site, call: SparseCall) -> torch.Tensor:
    """The op on ``call`` (statistics and notes counted, except while recomputing for backward), then the dense
    recomputation of ``call.dense_rows``."""
    from ..ops import sol_attn

    query, key, value = call.query, call.key, call.value
    kv_splits = config.resolve_kv_splits(query.device, query.shape[1])
    counting = not call_context.recomputing()
    if config.impl == "upstream" and counting:
        from ..ops.sol_attn import upstream

        reason = upstream.unsupported_reason(query, kv_splits, call.sink_tokens, call.sink_start, contiguous=True)
        if reason is not None:  # the op runs our own kernel instead (and warns once)
            site.counters.count_note(f"impl='upstream' ran our own kernel: {reason}")
    out, stats = sol_attn(query, key, value, tau=config.tau, thresh_type=config.thresh_type, kv_splits=kv_splits,
                          sink_tokens=call.sink_tokens, sink_start=call.sink_start, impl=config.impl,
                          return_stats=True)
    if counting:
        site.counters.add_stat("exact_fraction",
                               stats.exact_pairs.detach().sum() / (stats.total_pairs * stats.exact_pairs.numel()))
    if call.dense_rows is not None:
        # The sink's own query rows attend densely to every key, the model's way; the op's output is a fresh
        # tensor, so it is written in place.
        rows = call.dense_rows
        out[:, rows] = call.dense_attention(query[:, rows], key, value).to(out.dtype)
    return out
