"""The CPU kernels' typed op boundary (cpu_ops.cpp as ``torch.ops.accelpatch_cpu``): a wrong argument raises instead
of corrupting memory, a tensor accelpatch does not understand never reaches a kernel, and compile/export see the ops
like any other (schemas and fake implementations checked by ``torch.library.opcheck``)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from _by_name import CPU, REFERENCE as ref, TRITON
from accelpatch.lossless.kernels import cpu, cpu_build
from accelpatch.lossless.kernels.layout import eager_layouts
from accelpatch.lossless.kernels.operands import foreign_operand

from _wrapped_tensors import Wrapped

from .test_fused_cpu import F32, assert_same, mixed, needs_kernels

pytestmark = needs_kernels


def _ops():
    library, reason = cpu_build.load()
    assert library is not None, reason
    return library


def _modulate_call(n=40):
    x, scale, shift = (mixed((8, n), F32, seed) for seed in (1, 2, 3))
    out = torch.empty_like(x)
    size, strides = cpu.flat_plan(cpu.plan_for("modulate", ref.modulate, (x, scale, shift)))
    return out, x, scale, shift, size, strides


def test_a_plan_reaching_past_a_tensor_raises_and_writes_nothing():
    """A plan one element longer than the tensors (or a stride that walks off them) is refused before the kernel
    runs; the output is untouched."""
    out, x, scale, shift, size, strides = _modulate_call()
    out.fill_(7.0)
    too_long = size[:-1] + [size[-1] + 1]
    with pytest.raises(RuntimeError, match="reaches element"):
        _ops().modulate(out, x, scale, shift, too_long, strides)
    walking = list(strides)
    walking[4 * 1 + 3] *= 3  # input 1's innermost stride
    with pytest.raises(RuntimeError, match="reaches element .* of input 1"):
        _ops().modulate(out, x, scale, shift, size, walking)
    assert bool((out == 7.0).all())
    _ops().modulate(out, x, scale, shift, size, strides)  # the right plan runs
    assert_same(out, ref.modulate(x, scale, shift), "modulate")


@pytest.mark.parametrize("case,match", [
    ("dtype", "must be c10::BFloat16|must be BFloat16"),
    ("range", "float bit patterns are 0"),
    ("plan length", "the plan has 3 sizes"),
    ("negative stride", "negative size or stride"),
    ("table size", "65,536 contiguous"),
])
def test_wrong_arguments_raise(case, match):
    out, x, scale, shift, size, strides = _modulate_call()
    if case == "dtype":
        with pytest.raises(RuntimeError, match=match):
            _ops().glu_gate_bf16(out.bfloat16(), x, x.bfloat16(), torch.zeros(65536, dtype=torch.int32), size,
                                 strides[:12])
    elif case == "range":
        with pytest.raises(RuntimeError, match=match):
            _ops().check_bf16_rounding(-1, 4)
    elif case == "plan length":
        with pytest.raises(RuntimeError, match=match):
            _ops().modulate(out, x, scale, shift, size[:3], strides)
    elif case == "negative stride":
        with pytest.raises(RuntimeError, match=match):
            _ops().modulate(out, x, scale, shift, size, [-s for s in strides])
    elif case == "table size":
        b = x.bfloat16()
        with pytest.raises(RuntimeError, match=match):
            _ops().table_bf16(b, b, torch.zeros(100, dtype=torch.int32), size, strides[:8])


def test_meta_tensors_reach_the_fake_implementation_only():
    """Under meta (and fake) tensors the op does what its kernel does to anything but its outputs: nothing."""
    out, x, scale, shift, size, strides = (t.to("meta") if isinstance(t, torch.Tensor) else t
                                           for t in _modulate_call())
    assert _ops().modulate(out, x, scale, shift, size, strides) is None


def test_schema_types_are_checked():
    out, x, scale, shift, size, strides = _modulate_call()
    with pytest.raises((RuntimeError, TypeError)):
        _ops().modulate(out, x, scale, size, strides)  # one tensor short
    with pytest.raises((RuntimeError, TypeError)):
        _ops().modulate(out, x, scale, shift.data_ptr(), size, strides)  # an address where a tensor goes


class _Recording(TorchDispatchMode):
    """Records every op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_subclass_is_declined_before_any_kernel():
    """Every native op's first check names the subclass; a wrapper's data_ptr() is 0, which a raw-pointer boundary
    read (the torchao crash). Through the typed op it reaches the subclass's own dispatch, never the kernel."""
    out, x, scale, shift, size, strides = _modulate_call()
    scale = Wrapped(scale, opaque=True)
    assert scale.data_ptr() == 0
    assert "tensor subclass" in foreign_operand([x, scale], "cpu")
    assert "tensor subclass" in CPU.unsupported("modulate", x, scale, shift)
    with pytest.raises(NotImplementedError, match="Wrapped does not implement"):
        _ops().modulate(out, x, scale, shift, size, strides)


@pytest.mark.parametrize("kind", ["quantized", "sparse", "meta", "nested-device"])
def test_other_tensors_we_do_not_understand_are_named(kind):
    x = torch.randn(4, 4)
    other = {"quantized": lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
             "sparse": lambda: x.to_sparse(),
             "meta": lambda: x.to("meta"),
             "nested-device": lambda: x.to("meta")}[kind]()
    reason = foreign_operand([x, other], "cpu")
    assert reason is not None and {"quantized": "quantized", "sparse": "sparse_coo", "meta": "meta",
                                   "nested-device": "meta"}[kind] in reason
    assert CPU.unsupported("modulate", x, other, x) is not None


@pytest.mark.parametrize("op", ["modulate", "relu_rope"])
def test_opcheck_schemas_and_fake_implementations(op):
    """torch.library.opcheck: the schema matches what the op mutates, and the fake implementation runs under
    FakeTensorMode (what torch.compile and export trace with)."""
    lib = _ops()
    if op == "modulate":
        out, x, scale, shift, size, strides = _modulate_call()
        args = (out, x, scale, shift, size, strides)
    elif op == "relu_rope":
        q, k = mixed((1, 4, 2, 8), F32, 1), mixed((1, 4, 2, 8), F32, 2)
        c, s = mixed((1, 4, 1, 8), F32, 3), mixed((1, 4, 1, 8), F32, 4)
        outs = tuple(torch.empty_strided(sh, st, dtype=dt) for sh, st, dt in
                     eager_layouts(ref.relu_rope_pair, (q, k, c, s)))
        size, strides = cpu.flat_plan(cpu.rope_plan((q, k, c, s), ref.relu_rope_pair))
        args = (q, k, c, s, *outs, None, size, strides)
    torch.library.opcheck(getattr(lib, op).default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_the_triton_kernels_decline_what_they_do_not_understand_first():
    """The Triton implementations take tensors by address too: a subclass, a quantized tensor and a lazily
    negated view are refused by name before a kernel is launched."""
    x = mixed((4, 8), F32, 1)
    assert "tensor subclass" in TRITON.unsupported("modulate", x, Wrapped(x, opaque=True), x)
    assert "quantized" in TRITON.unsupported("modulate", x, torch.quantize_per_tensor(x, 0.1, 0,
                                                                                           torch.qint8), x)
    assert "negated" in TRITON.unsupported("modulate", x, x._neg_view(), x)
