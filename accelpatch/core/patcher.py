"""``apply`` and ``remove``: find the model adapter, swap site classes, attach hooks and the hosted features
(:mod:`accelpatch.core.features`), and undo all of it."""
from __future__ import annotations

import functools
import itertools
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from accelpatch.core import captured_forwards, features
from accelpatch.core.apply_options import split_options
from accelpatch.core.backends import resolve_backend
from accelpatch.core.block_registry import Registrations
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.core.gate import logger
from accelpatch.core.model_hooks import ModelForwardHooks, StepSources
from accelpatch.core.adapter import ModelAdapter
from accelpatch.core.sites import SITE_ATTR, Site, expected_here
from accelpatch.core.gated_class import gated_class, is_gated
from accelpatch.core.tiers import Tier, offers_high, parse_tier

from accelpatch.core.reporting import MODEL_REJECTED
from accelpatch.core.model_state import STATE_ATTR, patch_of  # noqa: F401 - patch_of is part of this module's API

#: patches by token, for warnings raised while Dynamo traces (see ModelPatch.warn_once)
_PATCHES: "weakref.WeakValueDictionary[int, ModelPatch]" = weakref.WeakValueDictionary()
_TOKENS = itertools.count()
#: per model, the (fast-path kind, reason) pairs warned about: each is said once per model, however often the model is
#: patched again (bench, validate and tune re-apply one model per candidate); the report keeps the full tally. Keyed
#: by the model itself (weakly), or by the patch where the model is not known (a patch copied or unpickled)
_WARNED: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()
_WARNED_LOCK = threading.Lock()


#: why a call under quality("high") ran nothing approximate on a model with no high fast path
NO_HIGH_PATH = ("tier high was asked, but this model has no high fast path without backend= or cache= (it runs the "
                "lossless path, bit-identical to diffusers): apply(..., backend='sol_attn') or apply(..., cache=...) "
                "adds one")

#: why a site accelpatch mounted is off: another caller set its enabled attribute to False (sglang's unmount)
UNMOUNTED_AFTER_APPLY = "unmounted after apply() (its enabled attribute was set to False by another caller)"


def forget_warnings() -> None:
    """Let every (model, kind, reason) warn again (tests: each test starts as a fresh process would)."""
    with _WARNED_LOCK:
        _WARNED.clear()


@dataclass(eq=False)
class ModelPatch:
    """Everything ``apply`` did to one transformer, kept on it as ``_accelpatch_state`` until ``remove``."""

    model_class: str
    adapter: ModelAdapter
    backend: Any
    strict: bool
    default_tier: Tier
    #: the family's own options (adapter.options_class), or None
    options: Any = None
    #: what apply() was asked for (backend config before defaults, strict, options): applying it again is a no-op
    requested: tuple = ()
    sites: list[Site] = field(default_factory=list, repr=False)
    detach: list[Callable[[], None]] = field(default_factory=list)
    #: each hosted feature's config for this model (accelpatch.core.features), and what it attached
    configs: dict[str, Any] = field(default_factory=dict)
    attached: dict[str, Any] = field(default_factory=dict, repr=False)
    step_sources: StepSources = field(default_factory=StepSources, repr=False)
    #: the model's checkpoint name or folder (its config's ``_name_or_path``), named in warnings; "" when unknown
    name_or_path: str = ""
    #: the patched model, weakly (warnings are per model); None in a copy or an unpickled patch
    model_ref: Optional[Callable[[], Any]] = field(default=None, repr=False)
    _token: int = field(default=-1, repr=False)

    def __post_init__(self) -> None:
        self._register()

    def _register(self) -> None:
        self._token = next(_TOKENS)
        _PATCHES[self._token] = self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "model_ref": None}  # a weak reference neither pickles nor belongs to a copy

    def __setstate__(self, state: dict) -> None:
        state.pop("_warned", None), state.pop("_lock", None)  # a pickle from before warnings were per process
        self.__dict__.update(state)
        self._register()  # a copy or an unpickled patch can warn from compiled code too

    @property
    def model_name(self) -> str:
        """The model as warnings name it: its class, and its checkpoint where known."""
        return self.model_class + (f" ({self.name_or_path})" if self.name_or_path else "")

    def warn_once(self, kind: str, reason: str, *, at_apply: bool = False) -> None:
        """One warning per model, fast-path kind and reason (at ``apply`` or at a call, whichever comes first): a
        second model of the process hears it too, as docs/contract.md promises; worded as expected where the reason
        is this machine (no CUDA); the counters keep the full tally. Inside code Dynamo traces, the warning is given while tracing (through
        ``comptime``, no graph break): a decision made there is baked into the graph, so every run of that graph
        takes the same path, and the user hears of it once, as in eager code."""
        if torch.compiler.is_dynamo_compiling():
            from torch._dynamo.comptime import comptime

            token = self._token  # noqa: F841 - read by _warn_while_tracing through the frame's locals
            comptime(_warn_while_tracing)
            return
        owner = self.model_ref() if self.model_ref is not None else None
        with _WARNED_LOCK:
            said = _WARNED.setdefault(owner if owner is not None else self, set())
            if (kind, reason) in said:
                return
            said.add((kind, reason))
        expected = " (expected on this machine, not a fault)" if expected_here(reason) else ""
        if reason == NO_HIGH_PATH:  # nothing fails: the call runs the lossless path, and says what would add one
            message = f"accelpatch: {self.model_name}: {reason}."
        elif at_apply:
            then = ("will raise FastPathUnavailableError (strict=True)" if self.strict else
                    "will run the reference path (see accelpatch.report(model); strict=True raises)")
            message = (f"accelpatch: the {kind} fast path was not mounted on {self.model_name}: "
                       f"{reason.removeprefix('not mounted: ')}{expected}. Calls that request it {then}.")
        else:
            message = (f"accelpatch: {kind} fast path did not run on {self.model_name}: {reason}{expected}. "
                       "The reference path runs instead (see accelpatch.report(model); strict=True raises).")
        warnings.warn(message, RuntimeWarning, stacklevel=5 if at_apply else 2)  # apply: the user's line
        logger.debug(message)

    @property
    def has_high_path(self) -> bool:
        """Whether ``high`` can do anything here: a high-tier site, or a feature such as the step cache."""
        return offers_high((site.tier for site in self.sites), self.features_offer_high())

    def features_offer_high(self) -> bool:
        return any(f.offers_high(self.configs.get(f.name)) for f in features.registered())

    def features_use_steps(self) -> bool:
        return any(f.uses_steps(self.configs.get(f.name)) for f in features.registered())

    def say_high_does_nothing(self, *, at_apply: bool = False) -> None:
        """``high`` was asked of a model with no high fast path: say so once per process (it runs the lossless
        path, bit for bit)."""
        self.warn_once("high", NO_HIGH_PATH, at_apply=at_apply)

    @functools.cached_property
    def rejections(self) -> dict[str, str]:
        """Fusion name -> why its sites did not mount: the reason of the site that kept them all off, read once,
        after ``apply`` mounted, from the sites' own mount state (a summary for messages, not a second state)."""
        found: dict[str, str] = {}
        for site in self.sites:
            if not site.mounted and site.reject_reason and not site.reject_reason.startswith(MODEL_REJECTED):
                found.setdefault(site.kind, f"{site.reject_reason} (at {site.path})")
        return found

    def unmounted_reason(self, kind: str) -> str:
        """The fallback reason of a call to an unmounted site of ``kind`` (the same for all of the model's sites)."""
        return f"not mounted: {self.rejections.get(kind, UNMOUNTED_AFTER_APPLY)}"

    def key(self) -> tuple:
        return self.requested

    def reapply_arguments(self) -> dict:
        """Keyword arguments of :func:`apply` that patch a model again exactly as this patch was asked for."""
        backend, strict, options, tier, arguments = self.requested
        return {"backend": backend, "strict": strict, "tier": tier, **dict(arguments), **dict(options)}


def _name_or_path(model: torch.nn.Module) -> str:
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else ""


def _warn_while_tracing(ctx) -> None:
    """Run by Dynamo at trace time (comptime) from :meth:`ModelPatch.warn_once`: warn for real, once."""
    def local(name):
        return ctx.get_local(name).as_python_constant()

    patch = _PATCHES.get(local("token"))
    if patch is not None:
        patch.warn_once(local("kind"), local("reason"), at_apply=local("at_apply"))


def transformers_of(target: Any, *, verb: str = "apply") -> list[torch.nn.Module]:
    """The transformer modules behind ``target``: a transformer itself, or a pipeline's ``transformer`` and
    ``transformer_2``. ``verb`` names the public function in the error message."""
    if isinstance(target, torch.nn.Module):
        return [target]
    found = []
    for name in ("transformer", "transformer_2"):
        module = getattr(target, name, None)
        if isinstance(module, torch.nn.Module):
            found.append(module)
    if not found:
        raise TypeError(
            f"{verb}() expects a diffusers pipeline with a `transformer` (and optionally `transformer_2`) or a "
            f"transformer module; got {type(target).__name__}")
    return found


def apply(target: Any, *, backend: Any = None, strict: bool = False, tier: Any = None, **options: Any):
    """Patch ``target`` in place (see :func:`accelpatch.apply`); a hosted feature's argument (``cache=``,
    ``cpu_kernels=``) comes among ``options``. Returns the report of what was patched."""
    from accelpatch.core.reporting import build_report

    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")
    default_tier = None if tier is None else parse_tier(tier)
    models = transformers_of(target)
    adapters = [features.find_adapter(model) for model in models]  # raises before anything is touched
    hosted = features.registered()
    arguments = {f.argument: options.pop(f.argument, f.default) for f in hosted if f.argument}
    split = split_options(options, backend, adapters, models)  # every option has an owner in this call
    configs = {f.name: f.resolve(arguments.get(f.argument) if f.argument else None, split.features.get(f.name, {}))
               for f in hosted}
    requested_backend = resolve_backend(backend, split.backend)
    model_options = split.family
    strict = strict or bool(getattr(requested_backend, "strict", False))
    requested = (requested_backend, strict, tuple(sorted(model_options.items(), key=lambda kv: kv[0])),
                 default_tier, tuple((f.argument, configs[f.name]) for f in hosted if f.argument))
    plans = []
    for model, adapter in zip(models, adapters):  # validate everything before touching any model
        backend_config = adapter.complete_backend(requested_backend, model)
        adapter.validate_backend(backend_config, model)
        family_options = adapter.resolve_options(model_options)
        adapter.validate_options(family_options, model)
        existing = model.__dict__.get(STATE_ATTR)
        for f in hosted:
            f.validate(model, adapter, configs[f.name], existing, requested)
        noops = adapter.static_noops(model, backend_config, family_options, requested_backend)
        if noops and strict:
            raise FastPathUnavailableError(f"{noops[0]} (strict=True refuses a fast path that can never run)")
        plans.append((model, adapter, backend_config, family_options, noops))
    pipeline = None if isinstance(target, torch.nn.Module) else target
    for model, adapter, backend_config, family_options, noops in plans:
        existing = model.__dict__.get(STATE_ATTR)
        if existing is not None:
            if existing.key() == requested:
                continue  # applying twice is the same as applying once
            _remove_one(model, reapplying=True)
        _apply_one(model, adapter, backend_config, family_options, strict, requested, pipeline, default_tier,
                   configs)
        for noop in noops:  # said once, at apply(): the report counts each call's reason too
            warnings.warn(f"accelpatch: {noop}", RuntimeWarning, stacklevel=3)  # the user's line
    return build_report(models)


def _apply_one(model, adapter: ModelAdapter, backend_config, options, strict: bool, requested: tuple,
               pipeline, default_tier: Optional[Tier], configs: dict) -> None:
    if default_tier is None:
        default_tier = adapter.default_tier(backend_config)
    patch = ModelPatch(model_class=type(model).__name__, adapter=adapter, backend=backend_config, strict=strict,
                       default_tier=default_tier, options=options, requested=requested, configs=dict(configs),
                       name_or_path=_name_or_path(model), model_ref=weakref.ref(model))
    model.__dict__[STATE_ATTR] = patch
    try:
        by_fusion: dict[str, list[Site]] = {}
        for path, module, stack in _stacks(adapter.iter_sites(model, backend_config, configs)):
            if is_gated(module):
                raise RuntimeError(f"{path} is already patched by accelpatch; call accelpatch.remove() first")
            original = type(module)
            sites = [Site(path=path, fast_path=fast_path, model=patch, original_class=original,
                          layer_index=layer_index) for fast_path, layer_index in stack]
            for upper, lower in zip(sites, sites[1:]):
                upper.below = lower
            module.__class__ = gated_class(original, tuple(s.fast_path.fusion for s in sites))
            module.__dict__[SITE_ATTR] = sites[0]
            captured, follow_reason = captured_forwards.follow(module)
            sites[0].captured_forwards = captured
            for site in sites:
                site.fast_path.fusion.mark(module, site)
                site.reject_reason = follow_reason
                site.keeps_reference_layer = site.fast_path.keeps_reference_layer(site)
                patch.sites.append(site)
                by_fusion.setdefault(site.fast_path.fusion.name, []).append(site)
        if not patch.sites:
            backends = f" (backends: {', '.join(adapter.backends)})" if adapter.backends else ""
            warnings.warn(f"accelpatch: this {patch.model_class} has no module accelpatch patches{backends}; it runs "
                          "unchanged", RuntimeWarning, stacklevel=3)
        _mount(model, patch, by_fusion)
        _name_gated_repeated_blocks(model, patch)
        for site in patch.sites:
            site.prepare_counters()
        hooks = ModelForwardHooks(model, patch, pipeline)
        patch.detach.append(hooks.remove)
        registrations = Registrations(model)  # diffusers' block registry knows the gated classes as their originals
        registrations.mirror_modules(model)
        patch.detach.append(registrations.release)
        for f in features.registered():  # after the model's hooks: a feature's pre-hooks read the step they set
            state = f.attach(model, patch, patch.configs.get(f.name), pipeline)
            if state is not None:
                patch.attached[f.name] = state
    except BaseException:
        _remove_one(model, reapplying=True)  # a failed apply leaves the rest as it was
        raise
    for kind in patch.rejections:
        patch.warn_once(kind, patch.unmounted_reason(kind), at_apply=True)
    if patch.default_tier is Tier.HIGH and patch.sites and not patch.has_high_path:
        patch.say_high_does_nothing(at_apply=True)


def _name_gated_repeated_blocks(model: torch.nn.Module, patch: ModelPatch) -> None:
    """diffusers' ``compile_repeated_blocks`` finds blocks by class name in ``_repeated_blocks``: list the gated
    classes of those blocks too (on the instance, until ``remove()``), so regional compilation still finds them."""
    repeated = getattr(model, "_repeated_blocks", None)
    if not repeated:
        return
    gated = sorted({type(m).__name__ for m in model.modules() if is_gated(m)
                    and type(m).__dict__.get("_accelpatch_original_class", type(m)).__name__ in repeated})
    if gated:
        model._repeated_blocks = list(repeated) + gated
        patch.detach.append(functools.partial(_drop_instance_attribute, model, "_repeated_blocks"))


def _drop_instance_attribute(model: torch.nn.Module, name: str) -> None:
    model.__dict__.pop(name, None)


def _stacks(found) -> list[tuple[str, torch.nn.Module, list]]:
    """The adapter's ``(path, module, fast path, layer)`` rows grouped per module, in the order modules first
    appear: ``(path, module, [(fast path, layer), ...])`` with the highest tier first (that site is asked first)."""
    grouped: dict[int, tuple[str, torch.nn.Module, list]] = {}
    for path, module, fast_path, layer_index in found:
        grouped.setdefault(id(module), (path, module, []))[2].append((fast_path, layer_index))
    for _, _, stack in grouped.values():
        stack.sort(key=lambda row: -int(row[0].tier))  # stable: the adapter's order among equal tiers
    return list(grouped.values())


def _mount(model: torch.nn.Module, patch: ModelPatch, by_fusion: dict[str, list[Site]]) -> None:
    """Decide each fusion's sites all together: every one mounted, or none, each unmounted one with its reason (the
    first rejected site's, which the others name). The site is the one record of this decision."""
    for name, sites in by_fusion.items():
        for site in sites:
            if site.reject_reason is None:  # diffusers' restated code first: it decides for every site alike
                site.reject_reason = (site.fast_path.restated_code_mismatch()
                                      or site.fast_path.mount_reject_reason(model.get_submodule(site.path), site))
        rejected = next((s for s in sites if s.reject_reason is not None), None)
        if rejected is not None:
            logger.info("%s: site %s rejected (%s); the whole model stays on the reference path", name,
                        rejected.path, rejected.reject_reason)
        for site in sites:
            if rejected is not None and site.reject_reason is None:
                site.reject_reason = f"{MODEL_REJECTED}{rejected.path}: {rejected.reject_reason}"
            site.mounted = rejected is None


def remove(target: Any) -> None:
    """Undo :func:`apply` on ``target`` (a no-op on a model that was never patched)."""
    for model in transformers_of(target, verb="remove"):
        _remove_one(model)


def _remove_one(model: torch.nn.Module, *, reapplying: bool = False) -> None:
    """Undo one model's patch (``reapplying``: ``apply()`` removes it to apply other arguments)."""
    hosted = features.registered()
    for f in hosted:
        f.forget(model, reapplying=reapplying)
    patch = model.__dict__.pop(STATE_ATTR, None)
    if patch is None:
        return
    for f in reversed(hosted):  # features first (the last attached first), while the gated classes are in place
        if f.name in patch.attached:
            f.detach(model, patch.attached.pop(f.name))
    while patch.detach:
        patch.detach.pop()()
    for site in reversed(patch.sites):  # a module's stacked sites: the top one (SITE_ATTR) comes last
        module = model.get_submodule(site.path)
        site.fast_path.fusion.unmark(module)
        if module.__dict__.get(SITE_ATTR) is site:
            module.__dict__.pop(SITE_ATTR)
            module.__class__ = site.original_class
            captured_forwards.restore(module, site.captured_forwards)
