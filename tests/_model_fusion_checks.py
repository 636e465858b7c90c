"""What the per-model lossless fusion tests (Wan, HunyuanVideo 1.5, LTX-2) share: fresh first-sight verdicts for
every test, the stand-in kernels of :mod:`_fused_doubles`, raw-bit comparison and report lookups."""
from __future__ import annotations

import pytest
import torch

import _fused_doubles as doubles
import accelpatch.lossless.ops  # noqa: F401 - registers the ops verify.ops() lists
from accelpatch.lossless import verify

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


@pytest.fixture(autouse=True)
def fresh_verdicts():
    """Every test sees its own first sights (verdicts are otherwise kept for the process), the kernel ops' and the
    composed ones' (HunyuanVideo 1.5's key-mask attention, the chunks of memory="low")."""
    for op in (*verify.ops().values(), *verify.composed_ops().values()):
        op.forget()
    doubles.CALLS.clear(), doubles.WRONG.clear(), doubles.UNSUPPORTED.clear()
    yield
    for op in (*verify.ops().values(), *verify.composed_ops().values()):
        op.forget()
    doubles.WRONG.clear(), doubles.UNSUPPORTED.clear()


@pytest.fixture
def stand_in_kernels():
    """The CPU kernels replaced by :mod:`_fused_doubles` (each op its reference chain, or wrong on purpose)."""
    with doubles.substituted():
        yield


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape, strides and raw bits."""
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype])))


def fusion_of(report, op: str):
    """The report's entry of the fused op ``op`` (first model)."""
    return next(f for f in report.models[0].fusions if f.op == op)


def lossless_warnings(record) -> list[str]:
    """The messages of the lossless tier's warnings among the ``record``ed ones."""
    return [str(w.message) for w in record if "accelpatch: lossless" in str(w.message)]

