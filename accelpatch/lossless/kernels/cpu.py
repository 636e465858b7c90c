"""CPU implementations of the lossless fused ops: one pass of compiled C++ (cpu_kernels.cpp) per chain, called as
the typed torch.library ops of cpu_ops.cpp (``torch.ops.accelpatch_cpu``, built by :mod:`.cpu_build`).

Each op has the signature and the outputs of its reference chain in :mod:`.reference` (values bit for bit, dtypes,
shapes and strides: outputs are allocated in the layouts :func:`.layout.eager_layouts` gives). bf16 SiLU, sigmoid and
ReLU come from :func:`.tables.unary_table`, eager's own results on all 65,536 inputs (relu_rope_pair uses a
vectorisable ReLU formula instead once it was found equal to that table on every input). :func:`unsupported` says
why an op cannot run given inputs (None when it can); calling an op on such inputs raises ``ValueError`` with that
reason. A call with a signature seen before (dtypes, shapes, strides, grad mode) reuses its checks, layouts and
plan. Whether a result is trusted is not decided here (that is the first-sight check's job).
"""
from __future__ import annotations

import functools
import threading
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu_build, onednn_bf16, split_rope
from accelpatch.lossless.kernels.operands import foreign_operand
from accelpatch.lossless.kernels.addcmul import FMA, addcmul_form
from accelpatch.lossless.kernels import reference as ref
from accelpatch.lossless.kernels.layout import eager_layouts
from accelpatch.lossless.kernels.tables import unary_table

_CPU = torch.device("cpu")
_ELEMENTWISE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

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


def _elementwise_plan(out_shape, out_strides, inputs: Sequence[torch.Tensor]):
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


def _cached_plan(name: str, args: Sequence, make: Callable[[], object]):
    key = _key(name, args)
    with _PLANS_LOCK:
        if key in _PLANS:
            return _PLANS[key]
    plan = make()
    with _PLANS_LOCK:
        return _PLANS.setdefault(key, plan)


def _flat_plan(plan):
    """A plan as the ops take it: the sizes, and every tensor's strides one after the other."""
    sizes, strides = plan
    return list(sizes), [st for per in strides for st in per]


# ---- what each op accepts --------------------------------------------------------------------------------------

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


_SELF_CHECK: list = []


def _split_reference(fused: bool) -> Callable:
    """rope_split_pair's chain with the second product added in a stated form (the self-check runs both kernels,
    whichever form this CPU's eager addcmul_ has): rounded then added by two eager float32 ops, or an fma (in
    float64: the product exact, the sum rounded to double then to float, which differs from one rounding with a
    probability ~2^-29 per element; the fixed inputs here are not such a case)."""
    def rotate(x, cos, sin):
        b, h, t, r = cos.shape
        x = x.reshape(b, t, h, 2, r).float()
        c, s = cos.transpose(1, 2).unsqueeze(-2), sin.transpose(1, 2).unsqueeze(-2)
        x1, x2 = x[..., :1, :], x[..., 1:, :]
        if fused:
            first = ((x1 * c).double() + (-s).double() * x2.double()).float()
            second = ((x2 * c).double() + s.double() * x1.double()).float()
        else:
            first, second = x1 * c + (-s) * x2, x2 * c + s * x1
        return torch.cat([first, second], dim=-2).reshape(b, t, -1)

    def reference(query, key, cos, sin):
        return tuple(rotate(x, cos, sin).to(x.dtype) for x in (query, key))
    return reference


def _self_check(library) -> Optional[str]:
    """A known-answer run of the float32 RoPEs (with and without the ReLU, paired and per-channel tables, and the
    per-channel one of bf16 activations, whose chain is float32 too), modulate and rotate-half kernels and
    the float64/float32 complex RoPE against their references, once per process: a compiler that contracts
    multiply-adds despite -ffp-contract=off (gcc's vectoriser does it for interleaved mul/sub/add groups) changes a
    few per cent of these outputs, and the library is then refused with a reason rather than left to fail every
    first-sight check."""
    if _SELF_CHECK:
        return _SELF_CHECK[0]
    g = torch.Generator().manual_seed(0)
    q, cos, sin = (torch.randn(shape, generator=g) for shape in ((1, 64, 2, 32), (1, 64, 1, 32), (1, 64, 1, 32)))
    x, scale, shift = (torch.randn(8, 512, generator=g) for _ in range(3))
    half_cos, half_sin = torch.randn(64, 24, generator=g), torch.randn(64, 24, generator=g)
    freqs = torch.randn(64, 16, 2, generator=g, dtype=torch.float64)
    freqs = torch.view_as_complex(freqs)
    flat = q.flatten(2)  # [1, 64, 64] with [1, 2, 64, 16] tables: two heads of 32 channels
    split_cos, split_sin = (torch.randn(1, 64, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    def pair(policy=None, per_channel=None):  # a q/k pair op's call: tensors, outputs, plan, then its switch
        if per_channel is not None:
            return lambda lib, a, o, size, st: lib.rope(*a, *o, size, st, per_channel)
        return lambda lib, a, o, size, st: lib.rotate_half(*a, *o, size, st, policy)

    complex_pair = lambda lib, a, o, size, st: lib.rotary_complex(*a, *o, size, st)  # noqa: E731
    runs = [  # (reference, args, plan, the library's op called on args, outputs and the plan)
        (ref.relu_rope_pair, (q, q.flip(1), cos, sin), _rope_plan,
         lambda lib, a, o, size, st: lib.relu_rope(*a, *o, None, size, st)),  # float32: no ReLU table
        (ref.rope_pair, (q, q.flip(1), cos, sin), lambda a: _rope_plan(a, ref.rope_pair), pair(per_channel=False)),
        (ref.rope_pair_per_channel, (q, q.flip(1), cos, sin), lambda a: _rope_plan(a, ref.rope_pair_per_channel),
         pair(per_channel=True)),
        (ref.rope_pair_per_channel, (q.bfloat16(), q.flip(1).bfloat16(), cos, sin),
         lambda a: _rope_plan(a, ref.rope_pair_per_channel), pair(per_channel=True)),
        (ref.modulate, (x, scale, shift), lambda a: _plan_for("modulate", ref.modulate, a),
         lambda lib, a, o, size, st: lib.modulate(*o, *a, size, st)),
        (ref.rotate_half_pair, (q, q.flip(1), half_cos, half_sin), _rotate_half_plan, pair(ROTATE_HALF_IN_Q)),
        (_split_reference(False), (flat, flat.flip(1), split_cos, split_sin), _split_plan, pair(SPLIT_MUL_ADD)),
        (_split_reference(True), (flat, flat.flip(1), split_cos, split_sin), _split_plan, pair(SPLIT_FMA)),
        (_split_reference(True), (flat.bfloat16(), flat.flip(1).bfloat16(), split_cos, split_sin), _split_plan,
         pair(SPLIT_FMA)),
        (ref.rotary_complex_pair, (q.double(), q.flip(1).double(), freqs), _complex_plan, complex_pair),
        (ref.rotary_complex_pair, (q, q.flip(1), freqs), _complex_plan, complex_pair),
    ]
    differ = 0
    with torch.no_grad():
        for reference, args, plan, call in runs:
            outs = tuple(torch.empty_strided(shape, strides, dtype=dtype)
                         for shape, strides, dtype in eager_layouts(reference, args))
            try:
                call(library, args, outs, *_flat_plan(plan(args)))
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


def _table(name: str):
    fn = {"silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid}[name]
    return unary_table(name, fn, _CPU)


_WIDE: dict[str, torch.Tensor] = {}


def _wide_table(name: str) -> torch.Tensor:
    """The bf16 table's 16-bit results zero-extended to int32, the layout the kernels' vectorised gathers read."""
    wide = _WIDE.get(name)
    if wide is None:
        table, reason = _table(name)
        if table is None:
            raise ValueError(reason)
        wide = _WIDE.setdefault(name, table.view(torch.int16).to(torch.int32) & 0xFFFF)
    return wide


_RELU_FORMULA: list = []


def relu_formula_matches() -> bool:
    """Whether the kernels' vectorisable bf16 ReLU formula gives eager's table on all 65,536 inputs (NaN as NaN);
    only then does relu_rope_pair use it instead of the table lookup. Checked once per process."""
    if not _RELU_FORMULA:
        library, _ = cpu_build.load()
        table, _ = _table("relu")
        ok = False
        if library is not None and table is not None:
            formula = torch.empty(65536, dtype=torch.int16)
            library.relu_bf16_formula(formula)
            mine, eager = formula.view(torch.bfloat16), table
            both_nan = mine.isnan() & eager.isnan()
            ok = bool(((formula == eager.view(torch.int16)) | both_nan).all())
        _RELU_FORMULA.append(ok)
    return _RELU_FORMULA[0]


def _relu_table_arg(query: torch.Tensor) -> Optional[torch.Tensor]:
    """The ReLU table relu_rope_pair's kernel takes: None (null) for float32, or for bf16 when the formula matched."""
    if query.dtype != torch.bfloat16 or relu_formula_matches():
        return None
    return _table("relu")[0]


def _why_rope(query, key, freqs_cos, freqs_sin, name: str = "relu_rope_pair") -> Optional[str]:
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
    if name == "relu_rope_pair" and query.dtype == torch.bfloat16:
        _, reason = _table("relu")
        return reason
    return None


def _why_same_dtype(name: str, tensors: Sequence[torch.Tensor], dtypes) -> Optional[str]:
    kinds = {t.dtype for t in tensors}
    if len(kinds) != 1 or tensors[0].dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{name} takes inputs of one dtype among {allowed}, not {[str(t.dtype) for t in tensors]}"
    return None


def _why_elementwise(name: str, reference: Callable, args: Sequence, dtypes, table: Optional[str] = None):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    reason = _why_same_dtype(name, tensors, dtypes)
    if reason:
        return reason
    if table is not None:
        _, reason = _table(table)
        if reason:
            return reason
    if _plan_for(name, reference, args) is None:
        return f"{name}: the broadcast layout does not reduce to 4 strided dims"
    return None


def _why_scale(x, z, dtype) -> Optional[str]:
    if dtype == torch.float32:
        return "scale_to_tokens to float32 has nothing to fuse (the product is the output)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"scale_to_tokens casts to bf16 or fp16, not {dtype}"
    if x.dtype != torch.float32 or z.dtype not in _ELEMENTWISE_DTYPES or x.dim() != 4:
        return ("scale_to_tokens takes a float32 [B, H, D, N] x and a bf16, fp16 or float32 z, "
                f"not {x.dtype} {tuple(x.shape)} / {z.dtype}")
    if _scale_plan(x, z, dtype) is None:
        return "scale_to_tokens: this layout of x and z does not reduce to 4 strided dims"
    return None


def _why_rotate_half(query, key, cos, sin) -> Optional[str]:
    if query.dtype not in _ELEMENTWISE_DTYPES or key.dtype != query.dtype:
        return ("rotate_half_pair takes bf16, fp16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if cos.dtype not in (torch.float32, torch.bfloat16) or sin.dtype != cos.dtype:
        return f"rotate_half_pair takes float32 or bf16 tables of one dtype, not {cos.dtype}/{sin.dtype}"
    if query.dim() != 4 or tuple(key.shape) != tuple(query.shape):
        return ("rotate_half_pair takes [B, S, H, D] query and key of one shape, "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    if cos.dim() != 2 or tuple(sin.shape) != tuple(cos.shape):
        return f"rotate_half_pair takes [S, R] tables of one shape, not {tuple(cos.shape)}/{tuple(sin.shape)}"
    rows, rotary = cos.shape
    if rotary == 0 or rotary % 2 or rotary > query.shape[-1]:
        return f"rotate_half_pair needs an even rotary dim R with 0 < R <= D = {query.shape[-1]}, not {rotary}"
    if rows not in (1, query.shape[1]):
        return f"tables of {rows} rows do not broadcast to {query.shape[1]} positions"
    if not _unit_inner_outputs(ref.rotate_half_pair, (query, key, cos, sin)):
        return "rotate_half_pair: eager's outputs are not unit-stride along the head dim here"
    return None


def _why_split(query, key, cos, sin) -> Optional[str]:
    return split_rope.mismatch(query, key, cos, sin) or addcmul_form(_CPU)[1]


def _why_complex(query, key, freqs) -> Optional[str]:
    if query.dtype == torch.float64:
        return ("rotary_complex_pair does not take float64 query and key: eager's float64 product gives other bits "
                "in its scalar loop (vector tails, strided tables) than in its vector loop (measured), so no single "
                "kernel reproduces it")
    if query.dtype not in (torch.bfloat16, torch.float32) or key.dtype != query.dtype:
        return ("rotary_complex_pair takes bf16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if freqs.dtype != torch.complex128:
        return f"rotary_complex_pair takes a complex128 table, not {freqs.dtype}"
    if freqs.is_conj():
        return "rotary_complex_pair reads the table's storage as it is: a lazily conjugated view is not"
    if query.dim() != 4 or tuple(key.shape) != tuple(query.shape) or query.shape[-1] % 2:
        return ("rotary_complex_pair takes [B, N, H, D] query and key of one shape with an even D, "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    if freqs.dim() != 2:
        return f"rotary_complex_pair takes a [N, D/2] table, not {tuple(freqs.shape)}"
    # Eager's complex multiply rounds each product in its vector loop but contracts them (an FMA) in its scalar
    # loop, which runs on row tails, strided rows, and partial rows where several threads split the work; the
    # difference reaches a float32 result rarely (one double ulp), so a first-sight check would seldom see it.
    # Take only what runs the vector loop everywhere.
    if torch.get_num_threads() != 1:
        return (f"rotary_complex_pair runs with one CPU thread only: with {torch.get_num_threads()} threads eager "
                "splits rows, and its scalar loop rounds the complex product differently (an FMA)")
    if query.shape[-1] // 2 % 8 or query.stride(-1) != 1 or key.stride(-1) != 1 or freqs.stride(-1) != 1:
        return ("rotary_complex_pair takes unit-stride pairs in rows of a multiple of 8 (eager's vector loop; its "
                f"scalar loop rounds the complex product differently), not D={query.shape[-1]} with strides "
                f"{query.stride()}/{freqs.stride()}")
    try:
        freqs[None, :, None, :].expand(*query.shape[:-1], query.shape[-1] // 2)
    except RuntimeError:
        return f"a table of shape {tuple(freqs.shape)} does not broadcast to {tuple(query.shape[:-1])} pairs"
    eager_layouts(ref.rotary_complex_pair, (query, key, freqs))  # raises where eager raises (a float64 x strided
    return None                                                    # along D cannot be viewed as complex)


def _unit_inner_outputs(reference: Callable, args) -> bool:
    return all(strides[-1] == 1 or shape[-1] == 1 for shape, strides, _ in eager_layouts(reference, args))


_COMPLEX_OK = {"rotary_complex_pair": (False, False, True)}

_WHY = {
    "rotate_half_pair": lambda *a: _why_rotate_half(*a),
    "rotary_complex_pair": lambda *a: _why_complex(*a),
    "rope_split_pair": lambda *a: _why_split(*a),
    "relu_rope_pair": lambda *a: _why_rope(*a),
    "rope_pair": lambda *a: _why_rope(*a, name="rope_pair"),
    "rope_pair_per_channel": lambda *a: _why_rope(*a, name="rope_pair_per_channel"),
    "modulate": lambda *a: _why_elementwise("modulate", ref.modulate, a, _ELEMENTWISE_DTYPES),
    "gated_residual": lambda *a: _why_elementwise("gated_residual", ref.gated_residual, a, _ELEMENTWISE_DTYPES),
    "silu": lambda *a: _why_elementwise("silu", ref.silu, a, (torch.bfloat16,), "silu"),
    "glu_gate": lambda *a: _why_elementwise("glu_gate", ref.glu_gate, a, (torch.bfloat16,), "silu"),
    "sigmoid_gate": lambda *a: _why_elementwise("sigmoid_gate", ref.sigmoid_gate, a, (torch.bfloat16,), "sigmoid"),
    "scale_to_tokens": lambda *a: _why_scale(*a),
    "pointwise_conv": lambda *a: onednn_bf16.why_pointwise_conv(*a),
    "linear": lambda *a: onednn_bf16.why_linear(*a),
}


def unavailable() -> Optional[str]:
    """Why no CPU kernel can run in this process ("switched off (...)", "unavailable: <build failure>"), None when
    they can. Builds the library on first need (announced on stderr)."""
    _, reason = cpu_build.load()
    if reason is None or reason.startswith("switched off"):
        return reason
    return f"unavailable: {reason}"


def unsupported(op_name: str, *args) -> Optional[str]:
    """Why this implementation cannot run ``op_name`` on these arguments (the reference's), None when it can.
    The library is built here on first use."""
    if op_name not in _WHY:
        return f"no CPU kernel for {op_name!r}"
    reason = _common(args, _COMPLEX_OK.get(op_name, ()))
    if reason:
        return reason
    try:
        return _WHY[op_name](*args)
    except (TypeError, AttributeError, IndexError, RuntimeError) as exc:
        return f"{op_name}: arguments the CPU kernel does not take ({type(exc).__name__}: {exc})"


class _Prepared:
    """Everything a call of one op needs for one signature: the library's op, eager's output layouts, whether they
    hold any element, the iteration plan as the op takes it (sizes; every tensor's strides) and the lookup table
    (None for none)."""

    __slots__ = ("op", "layouts", "nonempty", "size", "strides", "table")

    def __init__(self, op, layouts, plan, table):
        self.op, self.layouts, self.table = op, layouts, table
        self.nonempty = all(0 not in shape for shape, _, _ in layouts)
        self.size, self.strides = _flat_plan(plan) if plan is not None else ([], [])


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


def _prepare(op_name: str, args, reference: Callable, op: Callable, plan: Callable[[], object],
             table: Optional[str] = None) -> _Prepared:
    """Prepares (and caches) a signature not seen before; raises ValueError with the reason when unsupported. The
    ops look their signature up in ``_PREPARED`` themselves first (the path of every later call). ``op(library)``
    is the library's op that runs it."""
    key = _signature(op_name, args)
    known = _PREPARED.get(key)
    if known is not None:
        return known
    reason = unsupported(op_name, *args)
    if reason:
        raise ValueError(reason)
    library, _ = cpu_build.load()
    made = _Prepared(op(library), eager_layouts(reference, args), plan(), _wide_table(table) if table else None)
    if key is None:
        return made
    with _PLANS_LOCK:
        return _PREPARED.setdefault(key, made)


def _outputs(prep: _Prepared) -> tuple[torch.Tensor, ...]:
    return tuple(torch.empty_strided(shape, strides, dtype=dtype) for shape, strides, dtype in prep.layouts)


def _output(prep: _Prepared) -> torch.Tensor:
    (shape, strides, dtype), = prep.layouts
    return torch.empty_strided(shape, strides, dtype=dtype)


# ---- plans -----------------------------------------------------------------------------------------------------

def _plan_for(name: str, reference: Callable, args: Sequence):
    def make():
        (shape, strides, _), = eager_layouts(reference, args)
        return _elementwise_plan(shape, strides, [a for a in args if isinstance(a, torch.Tensor)])
    return _cached_plan(name, args, make)


def _tokens_view(out: torch.Tensor, h: int, d: int) -> torch.Tensor:
    """The [B, H, D, N] view of scale_to_tokens' [B, N, H*D] output."""
    return out.transpose(1, 2).unflatten(1, (h, d))


def _scale_plan(x, z, dtype):
    def make():
        (shape, strides, _), = eager_layouts(ref.scale_to_tokens, (x, z, dtype))
        try:
            view = _tokens_view(torch.empty_strided(shape, strides, device="meta"), x.shape[1], x.shape[2])
        except RuntimeError:
            return None
        if tuple(view.shape) != tuple(x.shape):
            return None
        return _elementwise_plan(tuple(view.shape), view.stride(), [x, z])
    return _cached_plan("scale_to_tokens", (x, z, dtype), make)


def _rope_plan(args, reference: Callable = ref.relu_rope_pair):
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
    return _cached_plan(reference.__name__, args, make)


def _rotate_half_plan(args):
    """size (B, S, H, D, R, table rows), strides (4 each) of query, key, cos, sin (along B, S, H, entry: 0 along B
    and H, and along S for one row), outputs."""
    query, key, cos, sin = args

    def make():
        layouts = eager_layouts(ref.rotate_half_pair, args)
        rows, rotary = cos.shape
        tables = [[0, 0 if rows == 1 else t.stride(0), 0, t.stride(1)] for t in (cos, sin)]
        strides = [list(query.stride()), list(key.stride())] + tables + [list(lay[1]) for lay in layouts]
        return [*query.shape, rotary, rows], strides
    return _cached_plan("rotate_half_pair", args, make)


def _split_plan(args):
    """rotate_half's plan for rope_split_pair: size (B, T, H, D, R = D, no table rows) and split_rope's strides."""
    def make():
        h, d = split_rope.heads(args[0], args[2])
        return [*args[0].shape[:2], h, d, d, 0], split_rope.strides(*args)
    return _cached_plan("rope_split_pair", args, make)


def _complex_plan(args):
    """The rope-style plan (outer dims in the outputs' memory order, D/2 pairs) with the complex table's strides in
    doubles (its last one per pair, the imaginary part at +1)."""
    query, key, freqs = args

    def make():
        layouts = eager_layouts(ref.rotary_complex_pair, args)
        table = freqs[None, :, None, :].expand(*query.shape[:-1], query.shape[-1] // 2)
        tensors = [query.stride(), key.stride(), tuple(2 * s for s in table.stride())] + [lay[1] for lay in layouts]
        out_strides = layouts[0][1]
        order = sorted(range(3), key=lambda d: -out_strides[d])
        sizes = [query.shape[d] for d in order] + [query.shape[3] // 2]
        return sizes, [[st[d] for d in order] + [st[3]] for st in tensors]
    return _cached_plan("rotary_complex_pair", args, make)


# ---- the ops ---------------------------------------------------------------------------------------------------

def relu_rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """:func:`.reference.relu_rope_pair` in one pass over query and key, sharing each table load."""
    args = (query, key, freqs_cos, freqs_sin)
    prep = _PREPARED.get(_signature("relu_rope_pair", args)) or _prepare(
        "relu_rope_pair", args, ref.relu_rope_pair, lambda lib: lib.relu_rope.default, lambda: _rope_plan(args))
    outs = _outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, _relu_table_arg(query), prep.size, prep.strides)
    return outs


def _plain_rope(name: str, reference: Callable, per_channel: bool, args):
    prep = _PREPARED.get(_signature(name, args)) or _prepare(
        name, args, reference, lambda lib: lib.rope.default, lambda: _rope_plan(args, reference))
    outs = _outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides, per_channel)
    return outs


def rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """:func:`.reference.rope_pair` in one pass over query and key: relu_rope_pair's rotation loops without the
    ReLU, stored in the query's dtype."""
    return _plain_rope("rope_pair", ref.rope_pair, False, (query, key, freqs_cos, freqs_sin))


def rope_pair_per_channel(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`.reference.rope_pair_per_channel` in one pass over query and key: rope_pair's loops reading each
    channel's own table entries, the chain in float32 (float64 with float64 tables), stored in the query's dtype."""
    return _plain_rope("rope_pair_per_channel", ref.rope_pair_per_channel, True, (query, key, cos, sin))


def _elementwise(op: str, reference: Callable, args, library_op: Callable, table: Optional[str] = None):
    """An element-wise op's output, written by ``library_op(library)`` (output first, then ``args``, the table
    where there is one, the plan)."""
    prep = _PREPARED.get(_signature(op, args)) or _prepare(
        op, args, reference, library_op, lambda: _plan_for(op, reference, args), table)
    out = _output(prep)
    if prep.nonempty:
        tensors = (*args, prep.table) if table else args
        prep.op(out, *tensors, prep.size, prep.strides)
    return out


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """:func:`.reference.modulate`: ``x * (1 + scale) + shift`` in one pass, rounded after each op."""
    return _elementwise("modulate", ref.modulate, (x, scale, shift), lambda lib: lib.modulate.default)


def gated_residual(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`.reference.gated_residual`: ``residual + gate * x`` in one pass, the product rounded."""
    return _elementwise("gated_residual", ref.gated_residual, (residual, gate, x),
                        lambda lib: lib.gated_residual.default)


def silu(x: torch.Tensor) -> torch.Tensor:
    """:func:`.reference.silu` of bf16 by eager's own table."""
    return _elementwise("silu", ref.silu, (x,), lambda lib: lib.table_bf16.default, "silu")


def glu_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`.reference.glu_gate` of bf16: ``x * silu(gate)``, the SiLU from eager's table, in one pass."""
    return _elementwise("glu_gate", ref.glu_gate, (x, gate), lambda lib: lib.glu_gate_bf16.default, "silu")


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`.reference.sigmoid_gate` of bf16: ``x * sigmoid(gate)`` in one pass, by glu_gate's kernel with eager's
    sigmoid table in place of the SiLU one (the kernel only gathers ``table[bits(gate)]`` and rounds the product)."""
    return _elementwise("sigmoid_gate", ref.sigmoid_gate, (x, gate), lambda lib: lib.glu_gate_bf16.default,
                        "sigmoid")


def scale_to_tokens(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`.reference.scale_to_tokens`: ``x * z`` (z widened exactly to float32, as eager promotes) rounded
    once to ``dtype``, written straight into eager's N-minor ``[B, N, H*D]`` layout."""
    args = (x, z, dtype)
    prep = _PREPARED.get(_signature("scale_to_tokens", args)) or _prepare(
        "scale_to_tokens", args, ref.scale_to_tokens, lambda lib: lib.scale_to.default,
        lambda: _scale_plan(x, z, dtype))
    out = _output(prep)
    if prep.nonempty:
        prep.op(out, x, z, prep.size, prep.strides)
    return out


def _rotate_half_call(name: str, reference: Callable, plan: Callable, policy: Callable[[], int], args):
    prep = _PREPARED.get(_signature(name, args)) or _prepare(
        name, args, reference, lambda lib: functools.partial(lib.rotate_half.default, policy=policy()),
        lambda: plan(args))
    outs = _outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides)
    return outs


def rotate_half_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`.reference.rotate_half_pair` in one pass over query and key: the tables rounded to the queries'
    dtype once per call, each product and the sum rounded as eager's ops do, channels past R copied."""
    return _rotate_half_call("rotate_half_pair", ref.rotate_half_pair, _rotate_half_plan, lambda: ROTATE_HALF_IN_Q,
                             (query, key, cos, sin))


def _split_policy() -> int:
    return SPLIT_FMA if addcmul_form(_CPU)[0] == FMA else SPLIT_MUL_ADD


def rope_split_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`.reference.rope_split_pair` of [B, T, C] query and key in one pass: rotate_half_pair's loops with a
    split policy (one float32 table entry per pair for both halves, the product rounded to float, the second one
    added as this CPU's eager ``addcmul_`` adds it, probed: an fma here), stored in the query's dtype."""
    return _rotate_half_call("rope_split_pair", ref.rope_split_pair, _split_plan, _split_policy,
                             (query, key, cos, sin))


def rotary_complex_pair(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """:func:`.reference.rotary_complex_pair` of bf16 or float32 query and key in one pass (any strides): the
    complex128 product as eager's vector loop computes it (four double products, the difference and the sum each
    rounded), then double -> float (-> bf16) as ``type_as`` converts. Eager's scalar loop (vector tails, strided
    tables) differs from its vector loop by a double ulp (a contracted multiply-add, it seems), which the rounding
    to float hides unless the exact result lies within that ulp of a float rounding boundary (the first-sight check
    is the guard there)."""
    args = (query, key, freqs)
    prep = _PREPARED.get(_signature("rotary_complex_pair", args)) or _prepare(
        "rotary_complex_pair", args, ref.rotary_complex_pair, lambda lib: lib.rotary_complex.default,
        lambda: _complex_plan(args))
    outs = _outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides)
    return outs


pointwise_conv = onednn_bf16.pointwise_conv
linear = onednn_bf16.linear


#: The ops by name (the names :func:`unsupported` takes, the same as the reference functions').
OPS: dict[str, Callable] = {
    "relu_rope_pair": relu_rope_pair,
    "rope_pair": rope_pair,
    "rope_pair_per_channel": rope_pair_per_channel,
    "modulate": modulate,
    "gated_residual": gated_residual,
    "silu": silu,
    "glu_gate": glu_gate,
    "sigmoid_gate": sigmoid_gate,
    "scale_to_tokens": scale_to_tokens,
    "rotate_half_pair": rotate_half_pair,
    "rotary_complex_pair": rotary_complex_pair,
    "rope_split_pair": rope_split_pair,
    "pointwise_conv": pointwise_conv,
    "linear": linear,
}
