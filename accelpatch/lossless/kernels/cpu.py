"""The CPU kernel library of the lossless fused ops: one pass of compiled C++ (cpu_kernels.cpp) per chain, called as
the typed torch.library ops of cpu_ops.cpp (``torch.ops.accelpatch_cpu``, built by :mod:`.cpu_build`).

What every op's CPU kernel shares lives here: :data:`LIBRARY` (the checks all kernels make, and whether the library
can be built), the iteration plans, the per-signature preparation, the known-answer self-check and the exact bf16
tables. The kernels themselves are in the ops' files (``accelpatch/lossless/ops/<name>.py``), registered on their
op with ``@OP.kernel(cpu.LIBRARY, unsupported=...)``.

Each kernel has the signature and the outputs of its op's reference chain (values bit for bit, dtypes, shapes and
strides: outputs are allocated in the layouts :func:`.layout.eager_layouts` gives). bf16 SiLU, sigmoid and ReLU come
from :func:`.tables.unary_table`, eager's own results on all 65,536 inputs (relu_rope_pair uses a vectorisable ReLU
formula instead once it was found equal to that table on every input). A kernel's ``unsupported`` says why it
cannot run given inputs (None when it can); calling it on such inputs raises ``ValueError`` with that reason. A call
with a signature seen before (dtypes, shapes, strides, grad mode) reuses its checks, layouts and plan. Whether a
result is trusted is not decided here (that is the first-sight check's job).
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu_build
from accelpatch.lossless.kernels.layout import eager_layouts
from accelpatch.lossless.kernels.library import KernelLibrary
from accelpatch.lossless.kernels.operands import foreign_operand
from accelpatch.lossless.kernels.tables import unary_table

CPU = torch.device("cpu")
ELEMENTWISE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: rotate_half's policies (cpu_kernels.h's RotateHalf): MiniMax-H3's rounding in the activations' dtype, and LTX-2.3's
#: split RoPE with the second product added by a rounded multiply and an add, or by an fma
ROTATE_HALF_IN_Q, SPLIT_MUL_ADD, SPLIT_FMA = 0, 1, 2

_PLANS: dict[tuple, tuple] = {}
_PLANS_LOCK = threading.Lock()


# ---- iteration plans -------------------------------------------------------------------------------------------

def _coalesce(shape: Sequence[int], strides: Sequence[Sequence[int]], order: Sequence[int]):
    """Dims in ``order`` (outer to inner), size-1 dims dropped, neighbours merged where every tensor allows it;
    ``(sizes, per-tensor strides)`` padded to 4 dims, or None when more than 4 remain."""
    sizes: list[int] = []
    kept: list[list[int]] = [[] for _ in strides]
    for d in order:
        if shape[d] == 1:
            continue
        if sizes and all(s[-1] == st[d] * shape[d] for s, st in zip(kept, strides)):
            sizes[-1] *= shape[d]
            for s, st in zip(kept, strides):
                s[-1] = st[d]
            continue
        sizes.append(shape[d])
        for s, st in zip(kept, strides):
            s.append(st[d])
    if len(sizes) > 4:
        return None
    pad = 4 - len(sizes)
    return [1] * pad + sizes, [[0] * pad + s for s in kept]


def elementwise_plan(out_shape, out_strides, inputs: Sequence[torch.Tensor]):
    """The 4-D plan of an element-wise op writing ``out_strides``, walked in the output's memory order."""
    try:
        views = [t.expand(out_shape) for t in inputs]
    except RuntimeError:
        return None
    strides = [tuple(out_strides)] + [v.stride() for v in views]
    order = sorted(range(len(out_shape)), key=lambda d: -out_strides[d])
    return _coalesce(out_shape, strides, order)


def _key(name, args):
    return (name,) + tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                           for a in args)


def cached_plan(name: str, args: Sequence, make: Callable[[], object]):
    """``make()``'s plan for ``name`` on arguments of these shapes, strides and dtypes, made once."""
    key = _key(name, args)
    with _PLANS_LOCK:
        if key in _PLANS:
            return _PLANS[key]
    plan = make()
    with _PLANS_LOCK:
        return _PLANS.setdefault(key, plan)


def flat_plan(plan):
    """A plan as the ops take it: the sizes, and every tensor's strides one after the other."""
    sizes, strides = plan
    return list(sizes), [st for per in strides for st in per]


# ---- what every kernel accepts ---------------------------------------------------------------------------------

def _common(args: Sequence, complex_ok: Sequence[bool] = ()) -> Optional[str]:
    """Reasons shared by every op; ``complex_ok[i]`` allows a complex tensor as argument ``i``."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    allowed = [isinstance(a, torch.Tensor) and i < len(complex_ok) and complex_ok[i] for i, a in enumerate(args)]
    allowed = [ok for ok, a in zip(allowed, args) if isinstance(a, torch.Tensor)]
    reason = foreign_operand(tensors, "cpu")
    if reason:
        return reason
    for t, ok in zip(tensors, allowed):
        if t.is_complex() and not ok:
            return f"the CPU kernels take dense real tensors, not {t.dtype}"
        if t.is_neg() or t.is_conj():
            return "the CPU kernels read storage as it is: a lazily negated or conjugated view is not"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd: an input requires grad and the fused CPU kernels have no backward"
    library, reason = cpu_build.load()
    return reason or _self_check(library)


def _admits(name: str, check: Callable[..., Optional[str]], args: Sequence,
            complex_ok: Sequence[bool] = ()) -> Optional[str]:
    """:data:`LIBRARY`'s check of a kernel's arguments: the reasons every kernel shares (``complex_ok[i]`` allows a
    complex tensor as argument ``i``), which build the library on first use, then the op's own ``check``; a check
    that raises on arguments it did not foresee answers with the error."""
    reason = _common(args, complex_ok)
    if reason:
        return reason
    try:
        return check(*args)
    except (TypeError, AttributeError, IndexError, RuntimeError) as exc:
        return f"{name}: arguments the CPU kernel does not take ({type(exc).__name__}: {exc})"


def unavailable() -> Optional[str]:
    """Why no CPU kernel can run in this process ("switched off (...)", "unavailable: <build failure>"), None when
    they can. Builds the library on first need (announced on stderr)."""
    _, reason = cpu_build.load()
    if reason is None or reason.startswith("switched off"):
        return reason
    return f"unavailable: {reason}"


#: the CPU kernels' library: ``@OP.kernel(LIBRARY, unsupported=..., complex_ok=(...))`` in an op's file
LIBRARY = KernelLibrary("cpu", "CPU", _admits, unavailable)


# ---- the known-answer self-check -------------------------------------------------------------------------------

_SELF_CHECK: list = []
#: the ops' known-answer runs (:func:`known_answers`)
_KNOWN_ANSWERS: list[Callable[[dict], list]] = []


def known_answers(make: Callable[[dict], list]) -> Callable[[dict], list]:
    """Decorator in an op's file: ``make(inputs)`` gives the op's known-answer runs for :func:`_self_check`, each
    ``(reference, args, plan, call)``: the chain, its arguments built from the fixed ``inputs`` (see
    :func:`_known_inputs`), ``plan(args)`` and ``call(library, args, outputs, sizes, strides)`` running the library
    op. For kernels whose float arithmetic a contracting compiler would change."""
    _KNOWN_ANSWERS.append(make)
    return make


def _known_inputs() -> dict:
    """The self-check's fixed float32/float64 operands, drawn in one order from one seed (the split-RoPE runs rely
    on these very values: see ops/rope_split_pair.py's ``_split_reference``)."""
    g = torch.Generator().manual_seed(0)
    q, cos, sin = (torch.randn(shape, generator=g) for shape in ((1, 64, 2, 32), (1, 64, 1, 32), (1, 64, 1, 32)))
    x, scale, shift = (torch.randn(8, 512, generator=g) for _ in range(3))
    half_cos, half_sin = torch.randn(64, 24, generator=g), torch.randn(64, 24, generator=g)
    freqs = torch.view_as_complex(torch.randn(64, 16, 2, generator=g, dtype=torch.float64))
    split_cos, split_sin = (torch.randn(1, 64, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    return dict(q=q, cos=cos, sin=sin, x=x, scale=scale, shift=shift, half_cos=half_cos, half_sin=half_sin,
                freqs=freqs, flat=q.flatten(2),  # [1, 64, 64] with [1, 2, 64, 16] tables: two heads of 32 channels
                split_cos=split_cos, split_sin=split_sin)


def _self_check(library) -> Optional[str]:
    """The ops' known-answer runs (:func:`known_answers`: the float32 RoPEs with and without the ReLU, paired and
    per-channel tables, and the per-channel one of bf16 activations, whose chain is float32 too; modulate;
    rotate-half and split RoPE; the float64/float32 complex RoPE) against their references, once per process: a
    compiler that contracts multiply-adds despite -ffp-contract=off (gcc's vectoriser does it for interleaved
    mul/sub/add groups) changes a few per cent of these outputs, and the library is then refused with a reason
    rather than left to fail every first-sight check."""
    if _SELF_CHECK:
        return _SELF_CHECK[0]
    inputs = _known_inputs()
    runs = [run for make in _KNOWN_ANSWERS for run in make(inputs)]
    differ = 0
    with torch.no_grad():
        for reference, args, plan, call in runs:
            outs = tuple(torch.empty_strided(shape, strides, dtype=dtype)
                         for shape, strides, dtype in eager_layouts(reference, args))
            try:
                call(library, args, outs, *flat_plan(plan(args)))
            except RuntimeError as error:  # the op refused its arguments: as wrong as wrong bits
                first = str(error).splitlines()[0]
                _SELF_CHECK.append(f"the compiled CPU kernels failed a known-answer check ({first}); they are not used")
                return _SELF_CHECK[0]
            expected = reference(*args)
            expected = expected if isinstance(expected, tuple) else (expected,)
            differ += sum(int((a != e).sum()) for a, e in zip(outs, expected))
    reason = None
    if differ:
        reason = (f"the compiled CPU kernels differ from eager in {differ} elements of a known-answer float32/float64 "
                  "check (a compiler that contracts multiply-adds?); they are not used")
    _SELF_CHECK.append(reason)
    return _SELF_CHECK[0]


def table(name: str):
    """``(eager's bf16 table of the unary op name, None)`` on this CPU, or ``(None, reason)``."""
    fn = {"silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}[name]
    return unary_table(name, fn, CPU)


_WIDE: dict[str, torch.Tensor] = {}


def wide_table(name: str) -> torch.Tensor:
    """The bf16 table's 16-bit results zero-extended to int32, the layout the kernels' vectorised gathers read."""
    wide = _WIDE.get(name)
    if wide is None:
        values, reason = table(name)
        if values is None:
            raise ValueError(reason)
        wide = _WIDE.setdefault(name, values.view(torch.int16).to(torch.int32) & 0xFFFF)
    return wide


def keeps_table(name: str) -> Callable[[torch.device, torch.dtype], None]:
    """A CPU kernel's ``keeps`` (:attr:`~accelpatch.lossless.kernels.library.Kernel.keeps`) where it gathers from
    eager's bf16 table of ``name``: for a bf16 model, the table and its int32 widening (384 KiB) built at apply()."""
    def keeps(device: torch.device, dtype: torch.dtype) -> None:
        if dtype == torch.bfloat16 and table(name)[0] is not None:
            wide_table(name)
    return keeps


_RELU_FORMULA: list = []


def relu_formula_matches() -> bool:
    """Whether the kernels' vectorisable bf16 ReLU formula gives eager's table on all 65,536 inputs (NaN as NaN);
    only then does relu_rope_pair use it instead of the table lookup. Checked once per process."""
    if not _RELU_FORMULA:
        library, _ = cpu_build.load()
        eager, _ = table("relu")
        ok = False
        if library is not None and eager is not None:
            formula = torch.empty(65536, dtype=torch.int16)
            library.relu_bf16_formula(formula)
            both_nan = formula.view(torch.bfloat16).isnan() & eager.isnan()
            ok = bool(((formula == eager.view(torch.int16)) | both_nan).all())
        _RELU_FORMULA.append(ok)
    return _RELU_FORMULA[0]


# ---- checks several ops share ----------------------------------------------------------------------------------

def why_rope(name: str, query, key, freqs_cos, freqs_sin) -> Optional[str]:
    """Why the interleaved-RoPE kernels (relu_rope_pair, rope_pair, rope_pair_per_channel) cannot take these."""
    if query.dtype not in (torch.bfloat16, torch.float32) or key.dtype != query.dtype:
        return f"{name} takes bf16 or float32 query and key of one dtype, not {query.dtype}/{key.dtype}"
    if freqs_cos.dtype not in (torch.bfloat16, torch.float32, torch.float64) or freqs_sin.dtype != freqs_cos.dtype:
        return (f"{name} takes bf16, float32 or float64 tables of one dtype, "
                f"not {freqs_cos.dtype}/{freqs_sin.dtype}")
    if query.dim() != 4 or tuple(key.shape) != tuple(query.shape):
        return (f"{name} takes [B, N, H, D] query and key of one shape, "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    if query.shape[-1] % 2:
        return f"{name} needs an even head dim, not {query.shape[-1]}"
    for t in (freqs_cos, freqs_sin):
        if t.dim() > 4 or t.shape[-1] != query.shape[-1]:
            return f"{name} needs tables of last dim {query.shape[-1]} and at most 4 dims, not {tuple(t.shape)}"
        try:
            t.expand(query.shape)
        except RuntimeError:
            return f"tables of shape {tuple(t.shape)} do not broadcast to {tuple(query.shape)}"
    return None


def why_same_dtype(name: str, tensors: Sequence[torch.Tensor], dtypes) -> Optional[str]:
    """Why ``tensors`` are not of one dtype among ``dtypes`` (None when they are)."""
    kinds = {t.dtype for t in tensors}
    if len(kinds) != 1 or tensors[0].dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{name} takes inputs of one dtype among {allowed}, not {[str(t.dtype) for t in tensors]}"
    return None


def why_elementwise(name: str, reference: Callable, args: Sequence, dtypes,
                    table_name: Optional[str] = None) -> Optional[str]:
    """Why an element-wise kernel (:func:`elementwise`) cannot take ``args``: dtypes, the bf16 table where it reads
    one, a broadcast layout of more than 4 strided dims."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    reason = why_same_dtype(name, tensors, dtypes)
    if reason:
        return reason
    if table_name is not None:
        _, reason = table(table_name)
        if reason:
            return reason
    if plan_for(name, reference, args) is None:
        return f"{name}: the broadcast layout does not reduce to 4 strided dims"
    return None


def unit_inner_outputs(reference: Callable, args) -> bool:
    """Whether eager's outputs of ``reference`` are unit-stride along their last dim."""
    return all(strides[-1] == 1 or shape[-1] == 1 for shape, strides, _ in eager_layouts(reference, args))


# ---- preparing a call ------------------------------------------------------------------------------------------

class _Prepared:
    """Everything a call of one op needs for one signature: the library's op, eager's output layouts, whether they
    hold any element, the iteration plan as the op takes it (sizes; every tensor's strides) and the lookup table
    (None for none)."""

    __slots__ = ("op", "layouts", "nonempty", "size", "strides", "table")

    def __init__(self, op, layouts, plan, table):
        self.op, self.layouts, self.table = op, layouts, table
        self.nonempty = all(0 not in shape for shape, _, _ in layouts)
        self.size, self.strides = flat_plan(plan) if plan is not None else ([], [])


_PREPARED: dict[tuple, _Prepared] = {}


def _signature(op_name: str, args) -> Optional[tuple]:
    """What a call's preparation depends on; None for a tensor without strides (never prepared). Only plain CPU
    tensors are ever prepared, so ``type`` and ``is_cpu`` keep a subclass or another device from a plain call's
    preparation."""
    grad = torch.is_grad_enabled()
    try:
        return (op_name, grad) + tuple(
            (type(a), a.dtype, a.shape, a.stride(), a.is_cpu, grad and a.requires_grad, a.is_neg(), a.is_conj())
            if isinstance(a, torch.Tensor) else a for a in args)
    except RuntimeError:
        return None


def prepared(op: Any, args, library_op: Callable, plan: Callable[[], object],
             table_name: Optional[str] = None) -> _Prepared:
    """The preparation of ``op``'s CPU kernel (``op`` a FusedOp: its name, reference and checks) for ``args``:
    looked up first (the path of every later call), else made and cached; raises ValueError with the reason where
    the kernel cannot take ``args``. ``library_op(library)`` is the library's op that runs it, ``plan()`` its
    iteration plan, ``table_name`` the bf16 table it gathers from (if any)."""
    key = _signature(op.name, args)
    known = _PREPARED.get(key)
    if known is not None:
        return known
    reason = op.unsupported("cpu", *args)
    if reason:
        raise ValueError(reason)
    library, _ = cpu_build.load()
    made = _Prepared(library_op(library), eager_layouts(op.reference, args), plan(),
                     wide_table(table_name) if table_name else None)
    if key is None:
        return made
    with _PLANS_LOCK:
        return _PREPARED.setdefault(key, made)


def outputs(prep: _Prepared) -> tuple[torch.Tensor, ...]:
    """Fresh outputs in eager's layouts."""
    return tuple(torch.empty_strided(shape, strides, dtype=dtype) for shape, strides, dtype in prep.layouts)


def output(prep: _Prepared) -> torch.Tensor:
    """The one fresh output in eager's layout."""
    (shape, strides, dtype), = prep.layouts
    return torch.empty_strided(shape, strides, dtype=dtype)


# ---- plans and calls several ops share --------------------------------------------------------------------------

def plan_for(name: str, reference: Callable, args: Sequence):
    """The element-wise plan of ``reference``'s output over ``args`` (None beyond 4 strided dims)."""
    def make():
        (shape, strides, _), = eager_layouts(reference, args)
        return elementwise_plan(shape, strides, [a for a in args if isinstance(a, torch.Tensor)])
    return cached_plan(name, args, make)


def rope_plan(args, reference: Callable):
    """Outer dims (B, N, H) in the outputs' memory order, then D/2 pairs; strides of the inputs, then the outputs
    of ``reference`` (relu_rope_pair's four, rope_pair's two)."""
    query = args[0]

    def make():
        layouts = eager_layouts(reference, args)
        tensors = [t.expand(query.shape).stride() for t in args] + [lay[1] for lay in layouts]
        out_strides = layouts[0][1]
        order = sorted(range(3), key=lambda d: -out_strides[d])
        sizes = [query.shape[d] for d in order] + [query.shape[3] // 2]
        return sizes, [[st[d] for d in order] + [st[3]] for st in tensors]
    return cached_plan(reference.__name__, args, make)


def plain_rope(op: Any, per_channel: bool, args):
    """rope_pair's and rope_pair_per_channel's kernel: the library's ``rope`` op, paired or per-channel tables."""
    prep = _PREPARED.get(_signature(op.name, args)) or prepared(
        op, args, lambda lib: lib.rope.default, lambda: rope_plan(args, op.reference))
    outs = outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides, per_channel)
    return outs


def elementwise(op: Any, args, library_op: Callable, table_name: Optional[str] = None,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """An element-wise op's output, written by ``library_op(library)`` (output first, then ``args``, the table
    where there is one, the plan). ``out``: write there instead, an input of eager's output layout (an in-place op;
    each element is read before it is written)."""
    prep = _PREPARED.get(_signature(op.name, args)) or prepared(
        op, args, library_op, lambda: plan_for(op.name, op.reference, args), table_name)
    out = output(prep) if out is None else out
    if prep.nonempty:
        tensors = (*args, prep.table) if table_name else args
        prep.op(out, *tensors, prep.size, prep.strides)
    return out


def rotate_half_call(op: Any, plan: Callable, policy: Callable[[], int], args):
    """rotate_half_pair's and rope_split_pair's kernel: the library's ``rotate_half`` op with ``policy()``."""
    prep = _PREPARED.get(_signature(op.name, args)) or prepared(
        op, args, lambda lib: functools.partial(lib.rotate_half.default, policy=policy()), lambda: plan(args))
    outs = outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides)
    return outs
