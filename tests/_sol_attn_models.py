"""What every model that gets Sol-Attn through a diffusers ``dispatch_attention_fn`` adapter must survive (Wan,
HunyuanVideo 1.5, LTX-2): the checks their test files share, given a :class:`ModelCase` and the test's
``model`` fixture ``(model, inputs, unpatched outputs)``.

Bit identity is raw bits with dtype, shape and stride (fp32 viewed as int32). A model's forward may return several
outputs (LTX-2: video and audio): every output is compared.
"""
from __future__ import annotations

import copy
import io
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import accelpatch

#: sparse from the first step and layer on, at every sequence length (the tiny models' sequences are far below the
#: default ``min_tokens`` floor, under which every call runs dense)
SPARSE = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)


@dataclass(frozen=True)
class ModelCase:
    """One model: how to build it (``build(num_layers=None)``) and its inputs, which outputs its forward has, the
    report kind of its Sol-Attn sites, and a weight that the sparse path's gradient reaches."""

    build: Callable[..., torch.nn.Module]
    inputs: Callable[[torch.nn.Module], dict]
    outputs: Callable[[object], tuple]
    sol_kind: str
    weight: Callable[[torch.nn.Module], torch.Tensor]


def forward(case: ModelCase, model: torch.nn.Module, inputs: dict) -> tuple:
    with torch.no_grad():
        return case.outputs(model(**inputs))


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


def all_equal(outs: tuple, reference: tuple) -> bool:
    return all(bits_equal(o, r) for o, r in zip(outs, reference, strict=True))


def sol_sites(case: ModelCase, report) -> list:
    return [s for s in report.sites if s.kind == case.sol_kind]


def _as_tuple(outputs) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def model_fixtures(case: ModelCase, forward_of: Callable):
    """The module-scoped ``model_and_reference`` (the model, its inputs and ``forward_of``'s unpatched outputs) and
    the per-test ``model`` (the same, removed after the test): assign both in the test module."""

    @pytest.fixture(scope="module")
    def model_and_reference():
        torch.set_num_threads(1)
        m = case.build()
        inputs = case.inputs(m)
        return m, inputs, forward_of(m, inputs)

    @pytest.fixture
    def model(model_and_reference):
        m, inputs, reference = model_and_reference
        yield m, inputs, reference
        accelpatch.remove(m)

    return model_and_reference, model


def check_exact_lossless_and_default_dense_layers(case: ModelCase, model, sol_paths: list) -> None:
    """Patched with ``sol_attn``: the default tier becomes high, exact and lossless are the unpatched bits, and the
    default dense layers (0, 1: every layer of the tiny model) warn that nothing runs sparse, give the unpatched
    bits and count each Sol-Attn site (``sol_paths``) once as a dense layer."""
    from accelpatch.sol_attn import sites as sol_attention

    m, inputs, reference = model
    reference = _as_tuple(reference)
    accelpatch.apply(m, **SPARSE)
    assert accelpatch.report(m).models[0].default_tier == "high"
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert all_equal(forward(case, m, inputs), reference)
    with pytest.warns(RuntimeWarning, match="never runs sparse"):
        accelpatch.apply(m, backend="sol_attn", dense_steps=0, tau=3.0)
    assert all_equal(forward(case, m, inputs), reference)
    assert {s.path: s.reference_calls for s in sol_sites(case, accelpatch.report(m))} == {
        path: {sol_attention.DENSE_LAYER: 1} for path in sol_paths}


def check_pickle_and_deepcopy(case: ModelCase, model) -> None:
    """A deepcopy and a torch.save/load round trip of a sparse-patched model keep the sparse path (same bits, their
    counts) and remove() to the unpatched bits."""
    m, inputs, reference = model
    reference = _as_tuple(reference)
    accelpatch.apply(m, **SPARSE, tau=2.0)
    sparse = forward(case, m, inputs)
    twin = copy.deepcopy(m)
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, loaded):
        assert all_equal(forward(case, other, inputs), sparse)
        assert sum(s.fast_calls for s in sol_sites(case, accelpatch.report(other))) >= 2  # its own and the copied
        accelpatch.remove(other)
        assert all_equal(forward(case, other, inputs), reference)


def sol_attn_runs(sites) -> int:
    """Calls of ``sites`` that ran the Sol-Attn op: the fast ones (blocks skipped) and those that skipped nothing (a
    dense stand-in kernel's, whose statistics say every pair was exact)."""
    from accelpatch.sol_attn.config import NOTHING_SKIPPED

    return sum(s.fast_calls + s.reference_calls.get(NOTHING_SKIPPED, 0) for s in sites)
