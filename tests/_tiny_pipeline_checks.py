"""Checks shared by the tiny-pipeline tests (HunyuanVideo 1.5, LTX-2): seeded builds are reproducible, the default
and exact tiers give the unpatched pipeline's bits, ``high`` with ``sol_attn`` runs the sparse path into the
pipeline's output, ``remove()`` restores. A :class:`PipelineCase` names how to build, call and read a pipeline."""
from __future__ import annotations

import types
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

import accelpatch
import accelpatch.sol_attn.op as ops
from accelpatch.sol_attn import sites as sol_attention

from _sol_attn_models import SPARSE, all_equal


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


def apply_default(pipe) -> None:
    """``apply(pipe)`` with no backend; tolerates "nothing to patch" (no lossless fusion for the model yet)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no module accelpatch patches.*", category=RuntimeWarning)
        accelpatch.apply(pipe)


def module_bits(pipe) -> dict:
    """Every tensor of every module component, by component and name."""
    return {f"{name}.{key}": tensor for name, component in pipe.components.items()
            if isinstance(component, torch.nn.Module) for key, tensor in component.state_dict().items()}


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x.dtype == b[k].dtype and x.shape == b[k].shape and torch.equal(x, b[k])
                                        for k, x in a.items())


def check_seeded(case: PipelineCase, reference: tuple) -> None:
    """Two builds with one seed are the same pipeline bit for bit (weights and output); another seed is not."""
    first, second = case.build(seed=0), case.build(seed=0)
    assert states_equal(module_bits(first), module_bits(second))
    assert all_equal(run(case, second), reference)
    other = module_bits(case.build(seed=1))
    assert not states_equal(module_bits(first), other)
    diff = {k.split(".")[0] for k, x in module_bits(first).items()
            if x.is_floating_point() and not torch.equal(x, other[k])}
    modules = {name for name, c in first.components.items() if isinstance(c, torch.nn.Module)}
    assert diff == modules, modules - diff  # every random component follows the seed


def check_default_and_exact_tiers(case: PipelineCase, pipe, reference: tuple) -> None:
    """``apply(pipe)`` (default tier) and ``quality("exact")``, also with ``sol_attn`` on, give the reference, and so
    does ``sol_attn`` at ``high`` inside its default dense steps (each call counted as one)."""
    apply_default(pipe)
    try:
        assert all_equal(run(case, pipe), reference)
        with accelpatch.quality("exact"):
            assert all_equal(run(case, pipe), reference)
    finally:
        accelpatch.remove(pipe)
    accelpatch.apply(pipe, **SPARSE)
    try:
        with accelpatch.quality("exact"):
            assert all_equal(run(case, pipe), reference)
        assert all(s.fast_calls == 0 for s in sol_sites(case, accelpatch.report(pipe)))
    finally:
        accelpatch.remove(pipe)
    accelpatch.apply(pipe, backend="sol_attn", dense_layers="")  # the default dense_steps=10 covers both steps
    try:
        assert all_equal(run(case, pipe), reference)  # at high: every call is a counted dense step
        sites = sol_sites(case, accelpatch.report(pipe))
        assert sites and all(s.fast_calls == 0 and s.reference_calls == {sol_attention.DENSE_STEP: case.sol_calls}
                             for s in sites), sites
    finally:
        accelpatch.remove(pipe)
    assert all_equal(run(case, pipe), reference)


def check_high_runs_sparse_and_remove_restores(case: PipelineCase, pipe, reference: tuple) -> None:
    """``high`` with no dense guards runs Sol-Attn on every self-attention site with an exact-block fraction in
    its stats; the output is finite and not the reference; ``remove()`` gives the reference back."""
    accelpatch.apply(pipe, **SPARSE)
    try:
        with accelpatch.quality("high"):
            out = run(case, pipe)
        sites = sol_sites(case, accelpatch.report(pipe))
    finally:
        accelpatch.remove(pipe)
    assert all(torch.isfinite(o).all() for o in out) and not all_equal(out, reference)
    assert sites and all(s.fast_calls == case.sol_calls for s in sites), sites
    assert all(0 < s.stats["exact_fraction"] < 1 for s in sites), sites
    assert all_equal(run(case, pipe), reference)


def dense_kernel(perturb: bool = False):
    """A stand-in for the Sol-Attn op: dense SDPA over its [B, S, H, D] inputs, optionally one element off. Its
    stats say half the block pairs ran exactly, so the sites count each call as sparse work (fast)."""
    def kernel(q, k, v, **kwargs):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        if perturb:
            out = out.clone()
            out[0, 5, 1, 7] += 1e-3
        return out, types.SimpleNamespace(exact_pairs=torch.ones(1), total_pairs=2)
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
