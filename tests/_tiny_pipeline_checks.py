"""What the tiny-pipeline tests share: a stand-in for the Sol-Attn op run through the whole pipeline at ``high``
(HunyuanVideo 1.5, LTX-2), and :func:`rehome` for pipelines loaded from disk (SANA-Video 2.0). A :class:`PipelineCase` names how to build, call and read a pipeline. What every family's
pipeline keeps (seeded builds, the tiers' bits, sol_attn's dense steps and sparse run, ``remove()``) is
tests/test_family_contract.py's."""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable

import torch

import accelpatch
import accelpatch.sol_attn.op as ops

from _sol_attn_models import SPARSE


@dataclass(frozen=True)
class PipelineCase:
    build: Callable[..., object]  # build(seed=...) -> pipeline
    call_kwargs: Callable[[], dict]  # fresh kwargs (with a fresh generator) for one call
    outputs: Callable[[object], tuple]  # pipeline output -> tuple of tensors
    sol_kind: str  # the report kind of the Sol-Attn sites
    sol_calls: int  # fast calls per Sol-Attn site in one call at high with no dense guards


def run(case: PipelineCase, pipe) -> tuple:
    return case.outputs(pipe(**case.call_kwargs()))


def sol_sites(case: PipelineCase, report) -> list:
    return [s for s in report.sites if s.kind == case.sol_kind]


def dense_kernel(perturb: bool = False, total_pairs: int = 2):
    """A stand-in for the Sol-Attn op: dense SDPA over its [B, S, H, D] inputs, the way diffusers' native dispatch
    runs it (so a sparse path's restated projection, RoPE and gates must give the reference bit for bit), optionally
    one element off. Its stats say one of ``total_pairs`` block pairs ran exactly (2: the sites count each call as
    sparse work; 1: every pair exact)."""
    def kernel(q, k, v, **kwargs):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        if perturb:
            out = out.clone()
            out[0, 5, 1, 7] += 1e-3
        return out, types.SimpleNamespace(exact_pairs=torch.ones(1), total_pairs=total_pairs)
    return kernel


def high_with_kernel(case: PipelineCase, pipe, monkeypatch, kernel) -> tuple:
    """The pipeline's output at ``high`` (no dense guards) with ``kernel`` in place of the Sol-Attn op."""
    monkeypatch.setattr(ops, "sol_attn", kernel)
    accelpatch.apply(pipe, **SPARSE)
    try:
        with accelpatch.quality("high"):
            out = run(case, pipe)
        assert all(s.fast_calls == case.sol_calls for s in sol_sites(case, accelpatch.report(pipe)))
    finally:
        accelpatch.remove(pipe)
        monkeypatch.undo()
    return out


def rehome(pipeline):
    """Move a loaded pipeline's tensors out of the safetensors file's memory map into fresh memory: from_pretrained
    leaves them at offsets only 8-byte aligned, where CPU kernels round differently at some shapes (same weights,
    ~1e-6 apart); any ``.to(device)`` or dtype cast does the same move."""
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            for tensor in [*component.parameters(), *component.buffers()]:
                tensor.data = tensor.data.clone()
    return pipeline
