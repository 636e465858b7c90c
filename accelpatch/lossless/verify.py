"""First-sight verification: a lossless fused op runs only for input signatures where it matched its reference.

A :class:`FusedOp` pairs an eager reference chain with its fused kernel per device type (a
:class:`~accelpatch.lossless.kernels.library.Kernel`, registered on the op by its ``kernel`` decorator in the op's
file, ``accelpatch/lossless/ops/<name>.py``). The first call
with a new *signature* (device and capability; every tensor's dtype, shape, strides, 16-byte alignment; the other
arguments) runs both and compares them bit for bit: dtype, shape, strides and raw bits must agree; NaN must sit at
the same places (eager itself stores different NaN payloads in its vectorised and scalar loops, so payloads are not
compared). The verdict is kept for the process: verified signatures run the fused op from then on; a mismatch or an
error declines the signature for good, warns once with the largest difference and counts the reason
(``strict=True`` raises instead). Arguments the kernel does not take by design (its op's own check: a dtype, a
layout, a thread count it does not reproduce) are not a decline: those calls count ``not applicable: <reason>``,
like every other policy, and are never warned or raised. The first call always returns the reference's outputs.

Checks happen in eager code only: inside ``torch.compile`` (tracing or export) the reference chain runs, so a
compiled patched model equals the unpatched one compiled the same way (the compiler fuses the chain itself); an
unverified signature met during CUDA graph capture runs the reference uncounted as verified. Under autograd the
reference runs (the kernels have no backward). All three are counted with their reason, never warned about.

On fake operands (a memory plan, :mod:`accelpatch.memory`) nothing is computed or checked: an op the kernel would
take allocates what the kernel allocates (:meth:`FusedOp._traced`), and inside :func:`traced_first_call` what a
first sight holds. An op made with ``inplace=True`` writes its result over its first argument, which its caller
never reads again (one tensor less); its first sight runs the out-of-place reference before the kernel. Any other
op's first sight hashes the reference's result (:func:`digest`) and frees it before its kernel runs, so a first
call holds no more than the eager chain; the reference runs again only where the hashes differ.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

from accelpatch.core import call_context
from accelpatch.core.errors import FastPathUnavailableError, is_fatal
from accelpatch.core.gate import note_work
from accelpatch.core.outcomes import RAN, declined, not_applicable
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.library import Kernel, KernelLibrary, kernel_kind
from accelpatch.lossless.kernels.operands import FAKE_OPERAND, foreign_operand

FUSED = RAN  # a fused op that ran its kernel
IN_COMPILE = not_applicable("inside torch.compile (the compiler fuses the chain itself)")
IN_AUTOGRAD = not_applicable("inputs require grad (the fused kernel has no backward)")
IN_CAPTURE = not_applicable("first sight inside CUDA graph capture (verification needs an eager run)")
CPU_KERNELS_OFF = not_applicable("the CPU kernels are switched off for this model (apply(..., cpu_kernels=False))")
TRACED = not_applicable("fake operands (a memory trace): planned as the kernel holds it, its outputs only, no values")
#: outcomes counted without a signature's verdict, whose tallies compiled code may bump
POLICY_OUTCOMES = (FUSED, IN_COMPILE, IN_AUTOGRAD, IN_CAPTURE)


@dataclass
class Verdict:
    """What the first sight of one signature decided, and what the check cost."""

    verified: bool
    #: why the fused op does not run this signature (None when verified)
    reason: Optional[str]
    #: wall time of the check: the reference, the fused op and the comparison
    cost_s: float
    #: the signature, readable: "cpu bfloat16[1,320,448]/(143360,448,1) ..."
    described: str
    #: the site whose call made the check
    first_site: str
    #: the kernel does not take these arguments by design (its own check, or no kernel for the device): the calls
    #: count ``not applicable: <reason>``, never warned or raised; otherwise an unverified signature is declined
    #: (a mismatch or an error: warned once, strict raises)
    policy: bool = False

    @property
    def declined(self) -> bool:
        return not self.verified and not self.policy


_CAPABILITY: dict[int, tuple[int, int]] = {}


#: apply()'s option that keeps one model's fused ops off the CPU kernels (the feature in accelpatch.lossless.feature)
CPU_KERNELS = "cpu_kernels"


def cpu_kernels_allowed(patch: Any) -> bool:
    """Whether a model's fused ops may run their CPU kernels (``apply(..., cpu_kernels=...)``; True unpatched)."""
    configs = getattr(patch, "configs", None)
    return True if configs is None else bool(configs.get(CPU_KERNELS, True))


def _device_key(device: torch.device) -> tuple:
    if device.type != "cuda":
        # eager's CPU results can depend on both: subnormals, and where threads split the work
        return (device.type, denormals_flushed(), torch.get_num_threads()) if device.type == "cpu" else (device.type,)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    return ("cuda", index, _CAPABILITY[index])


def denormals_flushed() -> bool:
    """Whether this thread's CPU flushes subnormals (``torch.set_flush_denormal(True)`` sets the FTZ/DAZ bits, which
    Python's own float arithmetic obeys too): eager results on subnormals, and the SiLU tables, depend on it."""
    return 5e-324 * 1.0 == 0.0


def signature(args: tuple) -> tuple:
    """Everything that can change the eager dispatch or the fused variant: device (and capability; on CPU whether
    subnormals are flushed and the thread count), and per argument its dtype, shape, strides and 16-byte alignment
    (tensors) or its value. Computed on every call: kept to plain attribute reads."""
    device = None
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if device is None:
                device = a.device
            parts.append((a.dtype, a.shape, a.stride(), not a.data_ptr() & 15))
        else:
            parts.append(("value", a))
    parts.append(_device_key(device) if device is not None else ("none",))
    return tuple(parts)


def planned_signature(args: tuple) -> tuple:
    """:func:`signature` of fake operands (a memory plan), whose tensors have no address: taken as 16-byte aligned,
    as the allocator's are. A plan looks up with it what this process decided for real operands of those shapes."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    parts = [(a.dtype, a.shape, a.stride(), True) if isinstance(a, torch.Tensor) else ("value", a) for a in args]
    parts.append(_device_key(device) if device is not None else ("none",))
    return tuple(parts)


def describe(args: tuple) -> str:
    """A signature as a reader sees it."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dims = ",".join(map(str, a.shape))
            strides = ",".join(map(str, a.stride()))
            parts.append(f"{str(a.dtype).removeprefix('torch.')}[{dims}]/({strides})")
        else:
            parts.append(repr(a))
    device = next((str(a.device) for a in args if isinstance(a, torch.Tensor)), "")
    return f"{device} " + " ".join(parts)


def _bits(t: torch.Tensor) -> torch.Tensor:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width) if t.is_floating_point() else t


def _layout(t: torch.Tensor) -> tuple:
    """The strides that matter: those of dimensions longer than one (a size-1 dimension's stride never addresses
    memory, and eager and meta kernels set it differently)."""
    return tuple(stride for size, stride in zip(t.shape, t.stride()) if size > 1)


def mismatch(reference: tuple, fused: tuple) -> Optional[str]:
    """Why ``fused`` is not ``reference`` bit for bit (None when it is): count, dtype, shape, strides, then raw bits
    with NaN compared by position only. The reason names how many elements differ and the largest difference."""
    if len(reference) != len(fused):
        return f"the fused op returned {len(fused)} tensors, the reference {len(reference)}"
    for i, (ref, out) in enumerate(zip(reference, fused)):
        which = f"output {i}" if len(reference) > 1 else "the output"
        for what in ("dtype", "shape"):
            if getattr(ref, what) != getattr(out, what):
                return f"{which} has {what} {getattr(out, what)}, the reference {getattr(ref, what)}"
        if _layout(ref) != _layout(out):
            return f"{which} has strides {out.stride()}, the reference {ref.stride()}"
        if torch.equal(_bits(ref), _bits(out)):
            continue  # the common verdict, without the elementwise temporaries below (memory on a first call)
        if not ref.is_floating_point():
            if not torch.equal(ref, out):
                return f"{which} differs in {int((ref != out).sum())} of {ref.numel()} elements"
            continue
        ref_nan, out_nan = ref.isnan(), out.isnan()
        differ = (_bits(ref) != _bits(out)) & ~(ref_nan & out_nan)
        count = int(differ.sum())
        if count:
            both = differ & ~ref_nan & ~out_nan
            largest = float((ref[both].double() - out[both].double()).abs().max()) if bool(both.any()) else None
            nan_note = "" if largest is not None else " (NaN where the reference has a number, or the reverse)"
            size = f", largest difference {largest:.3g}" if largest is not None else nan_note
            return f"{which} differs from the reference in {count} of {ref.numel()} elements{size}"
    return None


def digest(outputs: Iterable[torch.Tensor]) -> tuple:
    """Each output's dtype, shape, the strides that matter and a SHA-256 of its bytes: what a first sight compares,
    so that the reference's result is freed before the kernel's is made. A non-contiguous output is hashed from a
    contiguous copy, one output at a time; an iterator's outputs (:attr:`FusedOp.parts`) are dropped as hashed."""
    found = []
    for t in outputs:
        data = t.detach()
        data = data if data.is_contiguous() else data.contiguous()
        raw = data.reshape(-1).view(torch.uint8).cpu().numpy()
        found.append((t.dtype, tuple(t.shape), _layout(t), hashlib.sha256(raw).hexdigest()))
        del t, data, raw  # before the iterator makes the next output
    return tuple(found)


class FusedOp:
    """One fused op: its reference chain, verified per signature against its kernel for the device.

    Called from a fast path's restated forward as ``op(site, *args)``; returns what ``reference(*args)`` returns,
    bit for bit. ``site`` (an :class:`accelpatch.core.sites.Site`) receives the counts, warnings and strictness.
    Its kernels are registered on it by :meth:`kernel`, one per device type."""

    def __init__(self, name: str, reference: Callable, description: str,
                 dtypes: Optional[tuple[torch.dtype, ...]] = None, devices: Optional[tuple[str, ...]] = None,
                 inplace: bool = False, parts: Optional[Callable[..., Iterator[torch.Tensor]]] = None) -> None:
        self.name = name
        #: the reference's outputs one at a time, each made after the one before is dropped (a pair op's query
        #: rotated, then its key, as diffusers' forward does them): a first sight hashes them as they come, so it
        #: holds one output at a time as the unpatched forward does, not the pair; None: the reference's tuple.
        #: Equal to ``reference`` output for output (tests compare them)
        self.parts = parts
        #: the kernels write the result over the first argument and return it (a memory saving): the caller passes
        #: a tensor nothing reads again. The reference stays out of place; first sight runs it before the kernel,
        #: and a kernel must check its arguments before it writes, so a failure leaves the input whole for the
        #: reference
        self.inplace = inplace
        self.reference = reference
        self.description = description
        #: the activation dtypes the op is fused for (None: any the kernels take); a call in another dtype runs the
        #: reference, counted with :meth:`other_dtype_outcome` (a policy, not a decline: never warned)
        self.dtypes = dtypes
        #: the device types the op is fused on (None: every type with an implementation); elsewhere the reference
        #: runs, counted with :meth:`other_device_outcome` (a policy, not a decline)
        self.devices = devices
        self._verdicts: dict[tuple, Verdict] = {}
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        self._verifying = threading.Lock()  # one first sight at a time per op; others wait, then reuse the verdict

    def __repr__(self) -> str:
        return f"FusedOp({self.name!r})"

    # -- what tests and reports read -------------------------------------------------------------------------------
    def verdicts(self) -> list[Verdict]:
        with self._lock:
            return list(self._verdicts.values())

    def forget(self) -> None:
        """Drop every verdict (tests; a process normally keeps them for its lifetime)."""
        with self._lock:
            self._verdicts.clear()

    # -- kernels ----------------------------------------------------------------------------------------------------
    def kernel(self, library: KernelLibrary, unsupported: Callable[..., Optional[str]],
               keeps: Optional[Callable[[torch.device, torch.dtype], Any]] = None, **options: Any):
        """Decorator: ``run`` is this op's kernel in ``library`` (one per device type). ``unsupported(*args)`` is the
        op's own check of the arguments (None when ``run`` takes them), asked after the library's shared checks,
        which ``options`` tune (see the library's ``admits``); ``keeps`` builds what the kernel keeps for the process
        (:attr:`Kernel.keeps`). Returns ``run`` unchanged."""
        def register_kernel(run: Callable) -> Callable:
            if library.device_type in self._kernels:
                raise ValueError(f"{self.name} already has a {library.device_type} kernel "
                                 f"({self._kernels[library.device_type].run.__qualname__})")
            self._kernels[library.device_type] = Kernel(self.name, library, run, unsupported, dict(options), keeps)
            return run
        return register_kernel

    @property
    def kernels(self) -> Mapping[str, Kernel]:
        """The op's kernels by device type (read-only)."""
        return MappingProxyType(self._kernels)

    @contextlib.contextmanager
    def substituted(self, kernel: Kernel) -> Iterator[Kernel]:
        """Run ``kernel`` in place of the op's kernel for its library's device type inside the block (tests'
        stand-in kernels); the verdicts are dropped on entry and exit, since they judged another kernel."""
        device_type = kernel.library.device_type
        before = self._kernels.get(device_type)
        self._kernels[device_type] = kernel
        self.forget()
        try:
            yield kernel
        finally:
            if before is None:
                del self._kernels[device_type]
            else:
                self._kernels[device_type] = before
            self.forget()

    def implementation(self, device: torch.device) -> tuple[Optional[Kernel], Optional[str]]:
        """``(kernel, None)`` for ``device``, or ``(None, reason)`` where the op has no kernel there."""
        kernel = self._kernels.get(device.type)
        if kernel is None:
            return None, self._no_kernel(device.type)
        return kernel, None

    def unsupported(self, device_type: str, *args: Any) -> Optional[str]:
        """Why the op's ``device_type`` kernel cannot run these arguments (None when it can)."""
        kernel = self._kernels.get(device_type)
        return self._no_kernel(device_type) if kernel is None else kernel.unsupported(*args)

    def _no_kernel(self, device_type: str) -> str:
        return f"no {kernel_kind(device_type)} kernel for {self.name!r} in this version of accelpatch"

    def _unavailable(self, site: Any, device: torch.device) -> Optional[str]:
        """A policy outcome where no kernel of ``device`` can run for this model or process: the CPU kernels
        switched off (``apply(..., cpu_kernels=False)``, ``ACCELPATCH_CPU_KERNELS=0``) or not buildable here (the
        kernel's library says). Counted with the reason, not warned per op: a failed build warns once per process
        where it fails."""
        if device.type == "cpu" and not cpu_kernels_allowed(site.model):
            return CPU_KERNELS_OFF
        kernel = self._kernels.get(device.type)
        reason = kernel.library.unavailable() if kernel is not None else None
        return not_applicable(f"{kernel.library.kind} kernels {reason}") if reason else None

    def prepare_for(self, site: Any, device: torch.device, dtype: torch.dtype) -> None:
        """At apply(), for a model of ``dtype`` on ``device``: build what the op's kernel there keeps for the process
        (its lookup tables), so that the model's first call does not allocate it and holds no more than diffusers'
        (issue #44). Nothing where the op is not fused for that dtype or device or its kernels cannot run here."""
        if (self.dtypes is not None and dtype not in self.dtypes) or (
                self.devices is not None and device.type not in self.devices):
            return
        kernel = self._kernels.get(device.type)
        if kernel is None or kernel.keeps is None or self._unavailable(site, device):
            return
        kernel.keeps(device, dtype)

    def other_dtype_outcome(self, dtype: torch.dtype) -> str:
        names = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
        return not_applicable(f"{str(dtype).removeprefix('torch.')} activations (fused for {names} only)")

    def other_device_outcome(self, device_type: str) -> str:
        return not_applicable(f"{device_type} tensors (fused on {', '.join(self.devices)} only)")

    def policy_outcomes(self) -> tuple[str, ...]:
        """Every outcome a call can count without a verdict (for compiled code's tallies, prepared at apply)."""
        others = () if self.dtypes is None else tuple(
            self.other_dtype_outcome(d) for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
            if d not in self.dtypes)
        if self.devices is not None:
            others += tuple(self.other_device_outcome(d) for d in ("cpu", "cuda") if d not in self.devices)
        return POLICY_OUTCOMES + others

    # -- the call ---------------------------------------------------------------------------------------------------
    def outside_policy(self, site: Any, tensor: torch.Tensor) -> bool:
        """Whether a call whose first tensor is like ``tensor`` is outside the op's dtypes or devices (it would run
        the reference): counted as such, so the site can run the model's own code in its own order instead of
        computing the op's arguments first (which can hold more memory than the original chain)."""
        outcome = self._policy_outcome(tensor)
        if outcome is not None:
            _count(site, self.name, outcome)
        return outcome is not None

    def _policy_outcome(self, tensor: torch.Tensor) -> Optional[str]:
        if self.dtypes is not None and tensor.dtype not in self.dtypes:
            return self.other_dtype_outcome(tensor.dtype)
        if self.devices is not None and tensor.device.type not in self.devices:
            return self.other_device_outcome(tensor.device.type)
        return None

    def __call__(self, site: Any, *args: Any):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        outcome = self._policy_outcome(tensors[0])
        if outcome is not None:
            return self._reference(site, args, outcome)
        if torch.compiler.is_compiling():
            return self._reference(site, args, IN_COMPILE)
        foreign = foreign_operand(tensors, tensors[0].device.type)
        if foreign == FAKE_OPERAND:  # a memory trace: plan what the kernel would hold
            return self._traced(site, args, tensors[0].device)
        if foreign:  # before anything reads an address: a subclass's data_ptr() may be 0 or not its values
            return self._reference(site, args, not_applicable(foreign))
        unavailable = self._unavailable(site, tensors[0].device)
        if unavailable:
            return self._reference(site, args, unavailable)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._reference(site, args, IN_AUTOGRAD)
        key = signature(args)
        verdict = self._verdicts.get(key)  # a dict read is atomic; writers hold the lock
        if verdict is None:
            device = tensors[0].device
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return self._reference(site, args, IN_CAPTURE)
            with self._verifying:
                with self._lock:
                    verdict = self._verdicts.get(key)
                if verdict is None:
                    return self._first_sight(site, key, args, device)
        if not verdict.verified:
            if verdict.policy:
                return self._reference(site, args, not_applicable(verdict.reason))
            return self._declined(site, args, verdict.reason)
        kernel, _ = self.implementation(tensors[0].device)
        try:
            out = kernel.run(*args)
        except Exception as error:  # noqa: BLE001 - a kernel failing later declines for good, like a mismatch
            if is_fatal(error):
                raise
            reason = f"error: {type(error).__name__}: {error}"
            with self._lock:
                self._verdicts[key] = Verdict(False, reason, 0.0, describe(args), site.path)
            return self._declined(site, args, reason)
        _count(site, self.name, FUSED)
        return out

    def _traced(self, site: Any, args: tuple, device: torch.device):
        """A memory trace (fake operands, :mod:`accelpatch.memory`): where the kernel would take these arguments,
        allocate only what it allocates, its outputs in eager's layouts, so a plan holds what the fused step holds
        rather than the eager chain's intermediates. Nothing is computed or verified (fake tensors have no values);
        where the kernel would not run (switched off, not built here, its own check declines, autograd) the eager
        chain runs, as it would for real."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # availability may build and self-check the library on real tensors
            reason = self._unavailable(site, device)
        kernel, missing = self.implementation(device)
        if reason is None and missing is not None:
            reason = not_applicable(missing)
        if reason is None and records_autograd(args):
            reason = IN_AUTOGRAD
        if reason is None:
            try:
                with unset_fake_temporarily():  # the check reads shapes and strides; a lookup table it builds is real
                    why = kernel.check(*args)
            except (TypeError, AttributeError, IndexError, RuntimeError) as exc:
                why = f"{self.name}: arguments the kernel does not take ({type(exc).__name__}: {exc})"
            reason = not_applicable(why) if why else None
        if reason is not None:
            return self._reference(site, args, reason)
        _count(site, self.name, TRACED)
        first = traced_first_sight(args)
        if first and self.inplace:  # a first call: the check holds the reference's result beside the input
            return self.reference(*args)
        if first:
            self._traced_reference_hash(args)
        if self.inplace:
            return args[0]
        outs = empty_like_eager(self.reference, args, device)
        return outs if len(outs) > 1 else outs[0]

    def _traced_reference_hash(self, args: tuple) -> None:
        """On fake operands, what a first sight's hash of the reference holds: its outputs, each hashed as
        digest() does (a non-contiguous one copied), then freed."""
        for out in self.reference_outputs(args):
            if not out.is_contiguous():
                copy = torch.empty(out.shape, dtype=out.dtype, device=out.device)
                del copy
            del out

    def reference_outputs(self, args: tuple) -> Iterator[torch.Tensor]:
        """The reference's outputs on ``args`` for a first sight's hash: one at a time where :attr:`parts` makes them
        so, else the reference's tuple (held until the last is hashed)."""
        if self.parts is not None:
            return iter(self.parts(*args))
        return iter(_as_tuple(self.reference(*args)))

    def count(self, site: Any, outcome: str) -> None:
        """Count one call of this op on ``site`` and how it went (a subclass's own outcomes)."""
        _count(site, self.name, outcome)

    def _reference(self, site: Any, args: tuple, outcome: str):
        _count(site, self.name, outcome)
        return self.reference(*args)

    def _declined(self, site: Any, args: tuple, reason: str):
        self._refuse(site, reason)
        return self.reference(*args)

    def _refuse(self, site: Any, reason: str) -> None:
        """A declined signature met: raise under strict mode, else warn once per model and reason, and count it."""
        outcome = declined(reason)
        if site.model.strict:
            raise FastPathUnavailableError(
                f"lossless fusion {self.name} at {site.path} could not run: {reason}. "
                "Patch with strict=False to run the reference chain instead.")
        site.model.warn_once(f"lossless {self.name}", outcome)
        _count(site, self.name, outcome)

    def _compare(self, kernel: Any, args: tuple, reference_out: Any) -> Optional[str]:
        """A first sight's comparison: why ``kernel``'s result on ``args`` is not ``reference_out`` (None when it
        is, bit for bit; see :func:`mismatch`)."""
        return mismatch(_as_tuple(reference_out), _as_tuple(kernel.run(*args)))

    def _first_sight(self, site: Any, key: tuple, args: tuple, device: torch.device):
        kernel, reason = self.implementation(device)
        if reason is None:
            reason = kernel.unsupported(*args)  # builds the kernels if need be: a one-off, reported apart
        policy = reason is not None  # arguments the kernel does not cover by design: not applicable, not declined
        start = time.perf_counter()  # the check's cost: the reference, the fused op, the comparison
        reference_out = fused = None
        if reason is None and not self.inplace:
            # the reference's result hashed and freed before the kernel runs, so a first call holds no more than the
            # eager chain; only where the hashes differ does the reference run again for mismatch()'s reason (which
            # lets NaN payloads differ)
            expected = digest(self.reference_outputs(args))
            try:
                fused = kernel.run(*args)
                if digest(_as_tuple(fused)) != expected:
                    reference_out = self.reference(*args)
                    reason = mismatch(_as_tuple(reference_out), _as_tuple(fused))
            except Exception as error:  # noqa: BLE001 - a kernel that fails on first sight is declined
                if is_fatal(error):
                    raise
                reason = f"error: {type(error).__name__}: {error}"
            if reason is not None and reference_out is None:
                fused, reference_out = None, self.reference(*args)
        else:  # an in-place op (its input is overwritten, so the reference's result is held), or no kernel here
            reference_out = self.reference(*args)
            if reason is None:
                try:
                    reason = self._compare(kernel, args, reference_out)
                except Exception as error:  # noqa: BLE001 - a kernel that fails on first sight is declined
                    if is_fatal(error):
                        raise
                    reason = f"error: {type(error).__name__}: {error}"
        verdict = Verdict(reason is None, reason, time.perf_counter() - start, describe(args), site.path,
                          policy=policy)
        with self._lock:
            self._verdicts[key] = verdict
        if reason is None:
            _count(site, self.name, FUSED)
        elif policy:
            _count(site, self.name, not_applicable(reason))
        else:
            self._refuse(site, reason)
        return fused if reason is None and fused is not None else reference_out


class ComposedOp(FusedOp):
    """A verified op whose "kernel" is other torch code that runs on any device: the model's own computation done
    another way (in chunks of tokens, with a smaller mask), verified per signature against the reference like a
    fused kernel. ``alternative`` has ``run(*args)`` and ``unsupported(*args)`` (why it cannot take them, or
    None); there is no library to build or switch off. On fake operands (a memory plan) the alternative runs as it
    is, after the reference's hash on a first call. Each is kept by name (:func:`composed_ops`), apart from the
    kernel ops' registry, whose ops have kernels per device.

    ``unverified_at_high``: at a tier that admits ``high`` the alternative runs from the first call without the check
    (counted :data:`UNVERIFIED`), so a first call holds no more than the later ones; ``compiles``: whether it may run
    so inside ``torch.compile`` (an alternative that reads values, such as which tokens are valid, may not: the
    reference runs there)."""

    def __init__(self, name: str, reference: Callable, description: str, alternative: Any, *,
                 unverified_at_high: bool = False, compiles: bool = True, **options: Any) -> None:
        super().__init__(name, reference, description, **options)
        self.alternative = alternative
        self.unverified_at_high, self.compiles = unverified_at_high, compiles
        _COMPOSED.setdefault(name, self)

    def __call__(self, site: Any, *args: Any):
        if self.unverified_at_high and effective_tier(site.model.default_tier).admits(Tier.HIGH) and (
                self.compiles or not torch.compiler.is_compiling()):
            self.count(site, UNVERIFIED)
            return self.alternative.run(*args)
        return super().__call__(site, *args)

    def policy_outcomes(self) -> tuple[str, ...]:
        return super().policy_outcomes() + ((UNVERIFIED,) if self.unverified_at_high else ())

    def implementation(self, device: torch.device):
        return self.alternative, None

    def unsupported(self, device_type: str, *args: Any) -> Optional[str]:
        return self.alternative.unsupported(*args)

    def _unavailable(self, site: Any, device: torch.device) -> Optional[str]:
        return None  # no kernel to build or switch off: the alternative is torch code

    def _traced(self, site: Any, args: tuple, device: torch.device):
        if records_autograd(args):
            return self._reference(site, args, IN_AUTOGRAD)
        reason = self.alternative.unsupported(*args)
        if reason is not None:
            return self._reference(site, args, not_applicable(reason))
        _count(site, self.name, TRACED_COMPOSED)
        if traced_first_sight(args):
            self._traced_reference_hash(args)
        return self.alternative.run(*args)


def records_autograd(args: tuple) -> bool:
    """Whether a call on ``args`` would be recorded for backward: a memory trace then plans the eager chain, which
    is what runs for real (:data:`IN_AUTOGRAD`)."""
    return torch.is_grad_enabled() and any(a.requires_grad for a in args if isinstance(a, torch.Tensor))


UNVERIFIED = "ran unverified (the tier in force admits high: no first-sight check)"
TRACED_COMPOSED = not_applicable("fake operands (a memory trace): planned as it runs, no values")


def prepare_kept(model: torch.nn.Module, sites: Iterable[Any]) -> None:
    """At apply(): each fused op of ``sites`` builds what its kernels keep for the process on each (device, dtype)
    of the model's floating-point parameters (:meth:`FusedOp.prepare_for`). On fake parameters (a memory plan) the
    tables are built real, as the kernels' checks build them."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    kinds = {(p.device, p.dtype) for p in model.parameters() if p.is_floating_point()}
    by_op: dict[str, tuple[FusedOp, Any]] = {}
    for site in sites:
        for op in site.fast_path.fused_ops:
            if isinstance(op, FusedOp):
                by_op.setdefault(op.name, (op, site))
    with unset_fake_temporarily():
        for op, site in by_op.values():
            for device, dtype in sorted(kinds, key=str):
                op.prepare_for(site, device, dtype)


def one_at_a_time(rotate: Callable[..., torch.Tensor]) -> Callable[..., Iterator[torch.Tensor]]:
    """:attr:`FusedOp.parts` for a pair op whose outputs are ``rotate(query, *tables)`` and ``rotate(key, *tables)``:
    the key's made after the query's is hashed and dropped."""
    def parts(query: torch.Tensor, key: torch.Tensor, *tables: Any) -> Iterator[torch.Tensor]:
        yield rotate(query, *tables)
        yield rotate(key, *tables)
    return parts


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


#: the signatures a memory trace of a first call has met (None: a trace of a later call, where every signature is
#: verified and only kernels run)
_TRACED_FIRST_SIGHTS: contextvars.ContextVar[Optional[set]] = contextvars.ContextVar("traced_first_sights",
                                                                                    default=None)


def _trace_key(args: tuple) -> tuple:
    return tuple((a.dtype, tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else ("value", a)
                 for a in args)


def traced_first_sight(args: tuple) -> bool:
    """Inside :func:`traced_first_call`: whether ``args`` (their dtypes, shapes, strides and other values) are met
    for the first time, so the trace holds what a first sight's check holds (they are remembered as met)."""
    seen = _TRACED_FIRST_SIGHTS.get()
    if seen is None or _trace_key(args) in seen:
        return False
    seen.add(_trace_key(args))
    return True


@contextlib.contextmanager
def traced_first_call() -> Iterator[None]:
    """Trace the block on fake tensors as a process's first call: each signature's first sight runs the eager
    chain and holds the kernel's outputs beside its results, as the real check does (:meth:`FusedOp._first_sight`),
    instead of the kernel alone. What a memory plan of step 0 of a fresh process needs."""
    token = _TRACED_FIRST_SIGHTS.set(set())
    try:
        yield
    finally:
        _TRACED_FIRST_SIGHTS.reset(token)


def _count(site: Any, op: str, outcome: str) -> None:
    """Count one call of ``op`` on ``site``, unless it is a recomputation for backward (gradient checkpointing
    runs the forward again: that is not a call, as the sites' own counts hold)."""
    if outcome == FUSED:  # the site's call did fast work (see FusedOpsPath.run_counted)
        note_work(site.counters)
    if not call_context.recomputing():
        site.counters.count_chain(op, outcome)


_OPS: dict[str, FusedOp] = {}
_COMPOSED: dict[str, FusedOp] = {}


def register(op: FusedOp) -> FusedOp:
    """Make ``op`` findable by name (pickles of sites name their ops; nothing else finds an op or its kernels by
    name)."""
    _OPS.setdefault(op.name, op)
    return _OPS[op.name]


def composed_ops() -> Mapping[str, "ComposedOp"]:
    """Every :class:`ComposedOp` made so far, by name (the chunked computations of ``memory="low"``, HunyuanVideo
    1.5's key-mask attention): verified ops without kernels."""
    return dict(_COMPOSED)


def ops() -> Mapping[str, FusedOp]:
    """Every fused op registered so far, by name (importing accelpatch.lossless.ops registers the package's own, one
    module per op)."""
    return dict(_OPS)
