"""The ``sol_attn`` backend's policy, one implementation for every model that runs Sol-Attn in place of a dense
softmax attention (MiniMax-H3's packed attention, SANA-Video 2.0's anchors).

A model's fast path subclasses :class:`SolAttnFastPath` and says only how its attention splits around the
attention core (:meth:`SolAttnFastPath.prepare`: q, k, v and what to do with the result, plus any sink the model
derives itself). Everything else is here, in this order: the dense policy (the first ``dense_steps`` steps by the
step clock, an unknown step declining; the layers in ``dense_layers``), the processor it restates, context
parallelism, float activations, a configured sink inside the sequence; then the op with per-call exact-fraction
statistics and ``impl="upstream"`` notes, and the dense recomputation of the query rows the model names
(``dense_rows="text_audio"``: MiniMax-H3's text and audio rows), counted as the ``sparse_row_fraction``.

For the common case of a diffusers processor whose self-attention core is one ``dispatch_attention_fn(q, k, v)``
(Wan, HunyuanVideo 1.5, LTX-2), :class:`DispatchSelfAttention` is that split already: a model names its processor
class and says how q/k/v are projected (accelpatch.models.wan, a dozen lines); :class:`AlwaysDense` marks the
attentions Sol-Attn leaves alone (cross-attention, a text refiner), so the report counts them with their reason.
The adapter side (default dense layers, layer checks, site patterns) is accelpatch.sol_attn.adapter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from accelpatch.core import call_context
from accelpatch.core.outcomes import Declined, NotApplicable
from accelpatch.core.sites import FastPath, Site, bind_call, step_layer_policy
from accelpatch.parallel.sequence import SequenceShards, heads_to_ranks, ranks_to_heads
from accelpatch.sol_attn.config import (DENSE_LAST_STEP, DENSE_LAYER, DENSE_STEP, NOTHING_SKIPPED, SHORT_SEQUENCE,
                                      STEP_UNKNOWN, TOTAL_UNKNOWN, SolAttnConfig)

#: the activation dtypes Sol-Attn runs sparse on (q, k, v all one of them), in both routes (these sites and
#: diffusers' ``set_attention_backend("sol_attn")``)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ULYSSES_ONLY = ("context parallelism with ring attention (ring_degree > 1) splits the sequence across ranks inside "
                "attention: the sparse path needs whole sequences; use ulysses_degree instead")


@dataclass
class SparseCall:
    """One call's attention, split around its core: q, k, v [B, T, H, D]; ``finish`` maps the core's output
    [B, T, H, D] to the module's output. A model may bring its own sink (``sink_tokens``/``sink_start``) and the
    query rows to recompute densely over every key (``dense_rows``: a slice of rows, or the sorted row indices when
    they are not one contiguous range; with ``dense_attention(q_rows, k, v)``: the model's own dense attention
    call)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    finish: Callable[[torch.Tensor], torch.Tensor]
    sink_tokens: int = 0
    sink_start: Optional[int] = None
    dense_rows: Optional[Union[slice, tuple]] = None
    dense_attention: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = None
    dense_backend: object = None


def slice_length(rows: slice, n: int) -> int:
    """``len(range(*rows.indices(n)))`` by arithmetic: Dynamo (torch 2.11) refuses to trace ``slice.indices`` (a
    function it marks as skipped), so a compiled region cannot call it. Same clamping rules as CPython's."""
    step = 1 if rows.step is None else rows.step
    if step == 0:
        raise ValueError("slice step cannot be zero")
    lower, upper = (0, n) if step > 0 else (-1, n - 1)

    def clamp(index, default):
        if index is None:
            return default
        if index < 0:
            index += n
            return lower if index < lower else index
        return upper if index > upper else index

    start = clamp(rows.start, lower if step > 0 else upper)
    stop = clamp(rows.stop, upper if step > 0 else lower)
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


def dense_policy(config: SolAttnConfig, site: Site) -> Optional[Union[NotApplicable, Declined]]:
    """The policy's verdict for this call, or None when it may run sparse."""
    return step_layer_policy(site, first_steps=config.dense_steps, step_reason=DENSE_STEP, layer_reason=DENSE_LAYER,
                             unknown_reason=STEP_UNKNOWN, last_steps=config.dense_last_steps,
                             last_reason=DENSE_LAST_STEP, total_reason=TOTAL_UNKNOWN)


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

    policy_reasons = (DENSE_STEP, DENSE_LAST_STEP, DENSE_LAYER, SHORT_SEQUENCE, STEP_UNKNOWN, TOTAL_UNKNOWN,
                      ULYSSES_ONLY)
    #: exact_fraction: of the (query block, key block) pairs the kernel routed, all query blocks; sparse_row_fraction:
    #: of the query rows, those whose output is the sparse kernel's (the rest were recomputed densely)
    stat_names = ("exact_fraction", "sparse_row_fraction")
    work = "sparse"
    work_reasons = (NOTHING_SKIPPED,)

    def run_counted(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        """``run``; its call is counted where the routing's statistics are (:func:`count_routing`)."""
        return self.run(attn, site, args, kwargs)

    def keeps_reference_layer(self, site: Site) -> bool:
        return site.layer_index in site.model.backend.dense_layers

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        """Also refuses an ``impl`` that cannot run in this process (impl='triton' without triton or CUDA)."""
        from accelpatch.sol_attn.op.dispatch import impl_unavailable_reason

        reason = super().mount_reject_reason(module, site)
        return reason if reason is not None else impl_unavailable_reason(site.model.backend.impl)

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Declined]:
        raise NotImplementedError

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        config: SolAttnConfig = site.model.backend
        verdict = dense_policy(config, site)
        if verdict is not None:
            return verdict
        mismatch = self.processor_mismatch(attn)
        if mismatch is not None:
            return Declined(mismatch)
        ulysses = None
        parallel = getattr(attn.processor, "_parallel_config", None)
        if parallel is not None:
            ulysses = ulysses_group(parallel)
            if isinstance(ulysses, Declined):
                return ulysses
        call = self.prepare(attn, site, args, kwargs)
        if isinstance(call, Declined):
            return call
        q, k, v = call.query, call.key, call.value
        if config.min_tokens and q.shape[1] * (ulysses.world if ulysses is not None else 1) < config.min_tokens:
            site.model.step_sources.note_dense(SHORT_SEQUENCE)
            return NotApplicable(SHORT_SEQUENCE)  # sparse attention loses to dense on short sequences
        if not (q.dtype == k.dtype == v.dtype) or q.dtype not in FLOAT_DTYPES:
            return Declined(f"q/k/v are {q.dtype}, {k.dtype}, {v.dtype}: the sparse path takes one of fp32, bf16, fp16")
        if ulysses is not None:
            if q.shape[2] % ulysses.world:
                return Declined(f"{q.shape[2]} heads do not split over ulysses_degree={ulysses.world}")
            # Each rank trades its sequence shard of all heads for the whole sequence of its share of the heads:
            # Sol-Attn then runs per rank unchanged, over whole sequences.
            call.query, call.key, call.value = (heads_to_ranks(x, ulysses) for x in (q, k, v))
            finish = call.finish
            call.finish = lambda out: finish(ranks_to_heads(out, ulysses))
        call = self.localize(call, site)  # the model's own sink and dense rows refer to the whole sequence
        sink_reason = configured_sink_reason(config, call.query.shape[1])
        if sink_reason is not None:
            return Declined(sink_reason)
        if config.sink_tokens is not None:  # a configured sink replaces the model's; its dense rows stay (dense_rows)
            call.sink_tokens, call.sink_start = config.sink_tokens, config.sink_start
        return call.finish(sparse_attention(config, site, call))

    def localize(self, call: SparseCall, site: Site) -> SparseCall:
        """Add the model's own sink and dense rows to a call whose q/k/v hold whole sequences (after Ulysses'
        exchange, if any); by default as is."""
        return call


def ulysses_group(parallel_config) -> Union[SequenceShards, Declined]:
    """The Ulysses group of a pure Ulysses context-parallel config, the one
    :func:`accelpatch.parallel.sequence.heads_to_ranks` exchanges over; or why the sparse path cannot run under it."""
    cp = getattr(parallel_config, "context_parallel_config", None)
    if cp is None:
        return Declined(f"a parallel config without context parallelism ({type(parallel_config).__name__}): the "
                       "sparse path covers Ulysses context parallelism only")
    if (cp.ring_degree or 1) > 1:
        return Declined(ULYSSES_ONLY)
    if cp.ulysses_anything:
        return Declined("ulysses_anything (uneven shards) is configured: the sparse path takes even Ulysses shards")
    mesh = cp._ulysses_mesh
    return SequenceShards(mesh.get_group(), mesh.get_local_rank(), int(cp.ulysses_degree))


def sparse_attention(config: SolAttnConfig, site: Site, call: SparseCall) -> torch.Tensor:
    """The op on ``call`` (statistics and notes counted, except while recomputing for backward), then the dense
    recomputation of ``call.dense_rows``."""
    from accelpatch.sol_attn.op import sol_attn

    query, key, value = call.query, call.key, call.value
    kv_splits = config.resolve_kv_splits(query.device, query.shape[1])
    counting = not call_context.recomputing()
    if config.impl == "upstream" and counting:
        from accelpatch.sol_attn.op import upstream

        reason = upstream.unsupported_reason(query, kv_splits, call.sink_tokens, call.sink_start, contiguous=True)
        if reason is not None:  # the op runs our own kernel instead (and warns once)
            site.counters.count_note(f"impl='upstream' ran our own kernel: {reason}")
    if config.impl in ("auto", "triton") and counting:
        from accelpatch.sol_attn.op import resources

        reason = resources.unfit_reason(query)
        if reason is not None:  # no Triton tiles fit this GPU: the op runs the PyTorch implementation (warns once)
            site.counters.count_note(f"impl={config.impl!r} ran the PyTorch implementation: {reason}")
    out, stats = sol_attn(query, key, value, tau=config.tau, thresh_type=config.thresh_type, kv_splits=kv_splits,
                          sink_tokens=call.sink_tokens, sink_start=call.sink_start, impl=config.impl,
                          return_stats=True)
    dense = 0
    if call.dense_rows is not None:
        # The model's dense query rows attend to every key, the model's way (all keys, no sink or routing); the
        # op's output is a fresh tensor, so they are written in place.
        rows = call.dense_rows
        if not isinstance(rows, slice):
            rows = torch.tensor(rows, dtype=torch.long, device=query.device)
        out[:, rows] = call.dense_attention(query[:, rows], key, value).to(out.dtype)
        dense = slice_length(call.dense_rows, query.shape[1]) if isinstance(call.dense_rows, slice) \
            else len(call.dense_rows)
    if counting:
        site.counters.add_stat("sparse_row_fraction",
                               torch.tensor(1.0 - dense / query.shape[1], dtype=torch.float64))
        count_routing(site.counters, stats, sparse_rows=dense < query.shape[1])
    return out


def count_routing(counters, stats, *, sparse_rows: bool = True) -> None:
    """Count one Sol-Attn call by what its routing did, on the device (no host sync): fast when it skipped some
    (query block, key block) pair in rows whose output it kept, else with :data:`NOTHING_SKIPPED`; and its
    exact-block fraction."""
    exact = stats.exact_pairs.detach().sum()
    total = stats.total_pairs * stats.exact_pairs.numel()
    counters.add_stat("exact_fraction", exact / total)
    skipped = exact < total if sparse_rows else torch.zeros((), dtype=torch.bool, device=exact.device)
    counters.count_fast(value=skipped)
    counters.count_reference(NOTHING_SKIPPED, value=~skipped)


MASKED_CALL = "an attention_mask was given: the sparse path covers unmasked attention only"
CROSS_CALL = "encoder_hidden_states were given (cross-attention): Sol-Attn covers self-attention (Tq = Tk) only"


class DispatchSelfAttention(SolAttnFastPath):
    """Sol-Attn for a diffusers processor whose self-attention core is one ``dispatch_attention_fn(q, k, v, ...)``
    call on [B, T, H, D] with the RoPE already applied (Wan, HunyuanVideo 1.5, LTX-2). A model says only how its
    processor gets there: :meth:`processor_class` (the processor restated; any other is refused), ``call_names``
    (the module's forward arguments, in order) and :meth:`project` (q, k, v as the processor hands them to the
    dispatcher); :meth:`finish` (flatten heads, ``to_out``) is overridable. Masked calls and calls given
    ``encoder_hidden_states`` decline with a counted reason; dense calls run the processor itself, unchanged."""

    call_names: tuple[str, ...] = ("hidden_states", "encoder_hidden_states", "attention_mask")
    policy_reasons = SolAttnFastPath.policy_reasons + (MASKED_CALL, CROSS_CALL)

    def processor_class(self) -> type:
        raise NotImplementedError

    def expected_processor(self) -> type:
        return self.processor_class()

    def project(self, attn: torch.nn.Module, call: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, T, H, D] of one self-attention call (``call``: the bound forward arguments)."""
        raise NotImplementedError

    def finish(self, attn: torch.nn.Module, out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The core's output [B, T, H, D] → the module's output (diffusers' usual tail: heads flattened, to_out)."""
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    def prepare(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict) -> Union[SparseCall, Declined]:
        call = bind_call(args, kwargs, self.call_names)
        if call.get("attention_mask") is not None:
            return Declined(MASKED_CALL)
        if call.get("encoder_hidden_states") is not None:
            return Declined(CROSS_CALL)
        query, key, value = self.project(attn, call)
        return SparseCall(query, key, value, lambda out: self.finish(attn, out, query),
                          dense_backend=getattr(attn.processor, "_attention_backend", None))


class AlwaysDense(FastPath):
    """A site whose calls always run the original processor, counted with ``reason`` (cross-attention, a
    text-only refiner): the report shows every attention of the model, the ones Sol-Attn leaves alone too."""

    def __init__(self, fusion, description: str, reason: str) -> None:
        self.fusion = fusion
        self.description = description
        self.reason = reason
        self.policy_reasons = (reason,)

    def run(self, attn, site, args, kwargs):
        return NotApplicable(self.reason)
