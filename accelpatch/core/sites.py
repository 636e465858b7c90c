"""The machinery shared by every fast path: the per-site state and the call routing (the gated subclass that calls
it is :mod:`accelpatch.core.gated_class`).

A patched module keeps its parameters, its module path and its processor; only its ``__class__`` changes to a
gated subclass of its own class. The subclass's ``forward`` asks the site whether the fast path may run in the
calling context; when it may not (tier, mount decision, guard, error) the original class's ``forward`` runs
unchanged and the reason is counted.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from accelpatch.core import call_context
from accelpatch.core.errors import FastPathUnavailableError, is_fatal
from accelpatch.core.gate import QualityGatedFusion, SiteCounters, WorkWatch
from accelpatch.core.tiers import Tier, effective_tier
from accelpatch.core.outcomes import Declined, NotApplicable, Outcome


SITE_ATTR = "_accelpatch_site"

def runs_cuda_fast_paths(device_type: str) -> bool:
    """Whether the CUDA-only fast paths run on devices of type ``device_type``: on CUDA only. Their guards
    (:func:`device_reject_reason`, and :meth:`FastPath.mount_reject_reason`'s kernel check, which is moot where
    the CPU runs them) ask this one question; the suite replaces it from outside (``tests/_cpu_fast_paths.py``) to
    run their exact CPU emulations where no GPU is."""
    return device_type == "cuda"


def cuda_reject_reason() -> Optional[str]:
    """Why CUDA cannot run here (None when a CUDA device is visible)."""
    if torch.version.cuda is None:
        return "CUDA is unavailable: this torch build has no CUDA"
    if not torch.cuda.is_available():
        return "CUDA is unavailable: no CUDA device is visible"
    return None


#: words of the reasons that are about this machine rather than the model or the call: no CUDA (or no Triton)
_MACHINE_WORDS = ("CUDA is unavailable", "needs CUDA", "no CUDA device")


def expected_here(reason: str) -> bool:
    """Whether ``reason`` says this machine cannot run the path (no CUDA): expected there, not a fault to
    report."""
    return any(word in reason for word in _MACHINE_WORDS)


def device_reject_reason(device: torch.device, what: str = "the fast path") -> Optional[str]:
    """Why a CUDA-only fast path (``what``) cannot run on ``device`` (None where :func:`runs_cuda_fast_paths`
    says it runs: on CUDA)."""
    if runs_cuda_fast_paths(device.type):
        return None
    return f"input on {device.type}: {what} needs CUDA"


#: the names of the two outcomes before the one vocabulary (accelpatch.core.outcomes): kept for one release
Decline, Dense = Declined, NotApplicable


def step_layer_policy(site: "Site", *, first_steps: Any, step_reason: str, layer_reason: str, unknown_reason: str,
                      last_steps: Any = 0, last_reason: str = "", total_reason: str = "") -> Optional[Outcome]:
    """A policy keeping the reference for the first ``first_steps`` and the last ``last_steps`` denoising steps of the
    call (counts or fractions: :func:`accelpatch.core.steps.step_policy_reason`; a step or a number of steps no
    source knows declines, since the policy cannot apply) and for the site's layer when the fast path's
    :meth:`FastPath.keeps_reference_layer` said so at ``apply``; None when the fast path may run."""
    from accelpatch.core import steps

    reason = steps.step_policy_reason(first_steps, step_reason, unknown_reason, last=last_steps,
                                      last_reason=last_reason, total_reason=total_reason)
    if reason is not None:
        if reason in (step_reason, last_reason):
            site.model.step_sources.note_dense(reason)  # report(): the call's dense steps, in its own numbers
            return NotApplicable(reason)
        return Declined(reason)
    if site.keeps_reference_layer:
        site.model.step_sources.note_dense(layer_reason)
        return NotApplicable(layer_reason)
    return None


def bind_call(args: tuple, kwargs: dict, names: tuple[str, ...]) -> dict:
    """Map a module call's positional and keyword arguments onto ``names`` (absent ones are None); other keyword
    arguments are kept under their own names."""
    bound = dict(zip(names, args))
    bound.update(kwargs)
    for name in names:
        bound.setdefault(name, None)
    return bound


#: every FastPath subclass defined so far (accelpatch.tools.fingerprints lists the restated functions from them)
FAST_PATH_CLASSES: list = []


class FastPath:
    """One kind of fast path. Subclasses set ``fusion`` and implement the guards and the math.

    ``mount_reject_reason`` answers once per model (at ``apply`` time) whether the path can ever run there;
    ``run`` answers per call with its output, a :class:`Declined` or a :class:`NotApplicable` (see
    :mod:`accelpatch.core.outcomes`).
    """

    fusion: QualityGatedFusion
    description: str = ""
    #: the fixed reasons this path counts (policy outcomes) and the statistics it adds, so that their tallies exist
    #: before compiled code counts them
    policy_reasons: tuple[str, ...] = ()
    stat_names: tuple[str, ...] = ()
    #: the lossless fused ops (accelpatch.lossless.verify.FusedOp) the restated forward calls, for counters and the report
    fused_ops: tuple = ()
    #: what a fast call of this path does (report().fast_calls_by_kind): "approximate" (a lower-precision or
    #: restated computation that runs whenever the path does), "fused" (bit-exact fused ops) or "sparse" (skipped
    #: attention blocks)
    work: str = "approximate"
    #: the reasons a call that ran counts when it did no fast work (a fused forward whose ops all ran eagerly)
    work_reasons: tuple[str, ...] = ()
    #: the diffusers functions whose code this path restates, as ``"module:Qualified.name"`` (accelpatch.core.restated):
    #: at ``apply`` a function whose fingerprint is not one recorded for a tested diffusers declines the path
    restates: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        FAST_PATH_CLASSES.append(cls)

    def restated_code_mismatch(self) -> Optional[str]:
        """Why the diffusers code this path restates is not the code recorded for a tested diffusers version
        (None when it is, or when the path restates none); asked at ``apply`` before the per-site guards."""
        if not self.restates:
            return None
        from accelpatch.core.restated import restated_code_mismatch

        return restated_code_mismatch(self.restates)

    @property
    def tier(self) -> Tier:
        return self.fusion.tier

    def expected_processor(self) -> Optional[type]:
        """The diffusers processor class whose math the fast path restates (None: any processor)."""
        return None

    def processor_mismatch(self, module: torch.nn.Module) -> Optional[str]:
        """Why ``module``'s processor is not the one the fast path restates (None when it is): a processor
        swapped in by the user is never bypassed."""
        expected = self.expected_processor()
        processor = getattr(module, "processor", None)
        if expected is None or type(processor) is expected:
            return None
        found = type(processor)
        if found.__name__ == expected.__name__:  # a same-named class of another module (a diffusers copy)
            return f"processor is {found.__module__}.{found.__qualname__}, expected {expected.__module__}.{expected.__qualname__}"
        return f"processor is {found.__name__}, expected {expected.__name__}"

    def keeps_reference_layer(self, site: "Site") -> bool:
        """Whether this site's layer always runs the reference under the model's settings (decided once, at
        ``apply``: compiled code reading a per-layer int would compile once per layer)."""
        return False

    def kernel_reject_reason(self) -> Optional[str]:
        """Why this path's kernels cannot run in this process at all (None when they can). Not asked where the
        CPU runs the CUDA-only paths (:func:`runs_cuda_fast_paths`): there their CPU emulations run."""
        return None

    def mount_reject_reason(self, module: torch.nn.Module, site: "Site") -> Optional[str]:
        """Asked once per model at ``apply``: the processor being the one restated, then the kernels."""
        mismatch = self.processor_mismatch(module)
        if mismatch is not None or runs_cuda_fast_paths("cpu"):
            return mismatch
        return self.kernel_reject_reason()

    def run(self, module: torch.nn.Module, site: "Site", args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def run_counted(self, module: torch.nn.Module, site: "Site", args: tuple, kwargs: dict) -> Any:
        """``run``, then count the call as fast when it did this path's fast work (a :class:`Declined` or
        :class:`NotApplicable` is counted by the site). Here every call that ran did; paths whose work is decided further
        in (fused ops, sparse routing) count it there."""
        out = self.run(module, site, args, kwargs)
        if not isinstance(out, Outcome) and not call_context.recomputing():
            site.counters.count_fast()
        return out

    #: whether an exception raised inside ``run`` is taken for kernel trouble (counted, warned, the reference runs)
    catches_errors: bool = True


def restated_class_mismatch(site: "Site", expected: type, owner: str = "diffusers' ") -> Optional[str]:
    """Why a fast path that restates ``expected.forward`` cannot mount on ``site`` (its module is another class),
    or None: a subclass may override the forward the path restates."""
    if site.original_class is not expected:
        return (f"{site.original_class.__name__} is not {owner}{expected.__name__}, whose forward this fast path "
                "restates")
    return None


NO_FUSED_OP = ("no fused op fused in this call: each ran its eager chain, or on fake tensors was only planned (why: "
               "the report's lossless fusions)")
NO_FUSED_OP_COMPILED = "inside torch.compile: the fused ops stand aside (the compiler fuses the chain itself)"


def _min_elements() -> int:
    """The fused paths' floor (``ACCELPATCH_FUSE_MIN_ELEMENTS``, default 65,536; 0 fuses every call)."""
    text = os.environ.get(MIN_ELEMENTS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MIN_ELEMENTS
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{MIN_ELEMENTS_VARIABLE}={text!r} is not a number of elements: give an integer >= 0 "
                         f"(0 fuses every call; unset: {DEFAULT_MIN_ELEMENTS})")
    return value


#: the environment variable that sets the lossless paths' size floor
MIN_ELEMENTS_VARIABLE = "ACCELPATCH_FUSE_MIN_ELEMENTS"
#: a lossless site call whose largest tensor holds fewer elements runs the original forward: there a fused op saves
#: less than its call costs (measured on CPU: a fused modulate breaks even near 16-32 k elements, 1.8x faster at
#: 131 k; the gate's routing adds about as much again), so the tiny pipelines ran ~8 % slower patched
DEFAULT_MIN_ELEMENTS = 65_536
MIN_ELEMENTS = _min_elements()


@functools.lru_cache(maxsize=8)
def small_call_reason(floor: int) -> str:
    return (f"small call: its largest tensor holds fewer than {floor:,} elements, where fusing costs more than it "
            f"saves ({MIN_ELEMENTS_VARIABLE}=0 fuses every call)")


def _small(args: tuple, kwargs: dict) -> bool:
    """Whether no tensor of the call holds :data:`MIN_ELEMENTS` elements (on every lossless call: kept cheap)."""
    for values in (args, kwargs.values()):
        for value in values:
            if isinstance(value, torch.Tensor) and value.numel() >= MIN_ELEMENTS:
                return False
    return True


class FusedOpsPath(FastPath):
    """A fast path that restates a forward around verified fused ops (accelpatch.lossless.verify): the ops handle their own
    trouble (a failing or mismatching kernel declines its signature and runs the eager chain), so an exception that
    reaches ``run`` is the user's (a hook on a layer the path calls) or diffusers' own, and it propagates as it
    would from the original forward — once, not again from a fallback. A call whose largest tensor is under
    :data:`MIN_ELEMENTS` runs the original forward, counted as not applicable (a policy)."""

    catches_errors = False
    work = "fused"
    work_reasons = (NO_FUSED_OP, NO_FUSED_OP_COMPILED)

    def run_counted(self, module: torch.nn.Module, site: "Site", args: tuple, kwargs: dict) -> Any:
        """``run``, counted as fast only when one of its fused ops fused: a restated forward whose every op ran
        its eager chain (a declined signature, another CPU, threads, compiled code) did nothing fast."""
        if torch.compiler.is_compiling():  # the ops stand aside in compiled code (the compiler fuses)
            out = self.run(module, site, args, kwargs)
            if not call_context.recomputing() and not isinstance(out, Outcome):
                site.counters.count_reference(NO_FUSED_OP_COMPILED)
            return out
        if MIN_ELEMENTS and _small(args, kwargs):
            return NotApplicable(small_call_reason(MIN_ELEMENTS))
        counting = not call_context.recomputing()
        with WorkWatch(site.counters) as watch:
            out = self.run(module, site, args, kwargs)
        if counting and not isinstance(out, Outcome):
            if watch.did_work:
                site.counters.count_fast()
            else:
                site.counters.count_reference(NO_FUSED_OP)
        return out


@dataclass(eq=False)
class Site:
    """The state of one patched module: where it is, which fast path it carries, whether it mounted, counters."""

    path: str
    fast_path: FastPath
    original_class: type
    #: the model's accelpatch.core.patcher.ModelPatch (a back-reference, kept out of repr: its sites point back here; not
    #: imported, as the patcher sits above the sites)
    model: Any = field(repr=False)
    #: the site's one mount state (see accelpatch.core.gate): set when the fusion mounts, read everywhere
    mounted: bool = False
    #: why the site is not mounted (None when it is, or before apply decides)
    reject_reason: Optional[str] = None
    counters: SiteCounters = field(default_factory=SiteCounters)
    layer_index: Optional[int] = None
    #: instance slots (hooks' captured forwards) re-pointed at the gated forward, with their previous values
    captured_forwards: list = field(default_factory=list, repr=False)
    #: the fast path's layer policy for this site, decided at apply (FastPath.keeps_reference_layer)
    keeps_reference_layer: bool = False
    #: the next site on the same module, one tier lower (a lossless fusion below a high fast path): a call this
    #: site does not take goes there, and from the last one to the original forward
    below: Optional["Site"] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # The original forward as a plain function: torch.compile treats diffusers' Attention class as an in-graph
        # callable and cannot trace ``original_class.forward`` through it (a graph break per call).
        self.original_forward = self.original_class.forward

    def prepare_counters(self) -> None:
        """Create the tallies compiled code will bump (see SiteCounters.prepare)."""
        reasons = [reason for row in _TIER_REASONS for reason in row] + list(self.fast_path.policy_reasons) + list(
            self.fast_path.work_reasons)
        keys = [("fast", "")] + [("reference", r) for r in reasons]
        keys += [(field, r) for r in (self.model.unmounted_reason(self.kind),) + self.fast_path.policy_reasons
                 for field in ("reference", "fallbacks")]
        keys += [(field, name) for name in self.fast_path.stat_names for field in ("stat_sums", "stat_counts")]
        keys += [("chains", f"{op.name}|{outcome}") for op in self.fast_path.fused_ops
                 for outcome in op.policy_outcomes()]
        self.counters.prepare(keys)

    @property
    def kind(self) -> str:
        return self.fast_path.fusion.name

    @property
    def tier(self) -> Tier:
        return self.fast_path.tier

    def reference(self, module: torch.nn.Module, args: tuple, kwargs: dict, reason: str, *, fallback: bool = False):
        """Count why this site's fast path did not run (not again while recomputing for backward), then run the
        next lower site on the module, or the original class's forward."""
        if not call_context.recomputing():
            self.counters.count_reference(reason, fallback=fallback)
        if self.below is not None:
            return self.below.call(module, args, kwargs)
        return self.original_forward(module, *args, **kwargs)

    def fallback(self, module: torch.nn.Module, args: tuple, kwargs: dict, reason: str,
                 error: Optional[BaseException] = None):
        """A requested fast path could not run: raise in strict mode, else warn once per model and reason and run
        the reference."""
        if self.model.strict:
            raise FastPathUnavailableError(
                f"{self.kind} at {self.path} could not run: {reason}. "
                "Patch with strict=False to fall back to the reference path instead.") from error
        self.model.warn_once(self.kind, reason)
        return self.reference(module, args, kwargs, reason, fallback=True)

    def call(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        tier = effective_tier(self.model.default_tier)
        if not tier.admits(self.tier):
            return self.reference(module, args, kwargs, _TIER_REASONS[tier.value][self.tier.value])
        if not self.mounted:
            return self.fallback(module, args, kwargs, self.model.unmounted_reason(self.kind))
        try:
            out = self.fast_path.run_counted(module, self, args, kwargs)
        except FastPathUnavailableError:
            raise  # strict mode, raised by a fused op the path called: already says where and why
        except Exception as error:  # noqa: BLE001 - any kernel trouble falls back unless fatal or strict
            if is_fatal(error) or not self.fast_path.catches_errors:
                raise
            return self.fallback(module, args, kwargs, f"error: {type(error).__name__}: {error}", error)
        if isinstance(out, Declined):
            return self.fallback(module, args, kwargs, out.reason)
        if isinstance(out, NotApplicable):
            return self.reference(module, args, kwargs, out.reason)
        return out


_TIER_REASONS = [[f"tier {have} does not admit {need}" for need in Tier] for have in Tier]
