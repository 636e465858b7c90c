"""What a model adapter provides: which modules are sites (one declarative table), which backends apply, what the
step cache, the step clock and context parallelism need to know about the model.

A family's adapter is mostly data: :class:`SiteRule` rows in ``sites`` (module path pattern -> fast path, the tier
coming from the fast path), a :class:`CacheSupport` record, and a handful of methods for the checks that need the
model (see :attr:`ModelAdapter.EXTENSION_POINTS`)."""
from __future__ import annotations

import contextvars
import importlib
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from accelpatch.core.sites import FastPath
from accelpatch.core.steps import step_count
from accelpatch.core.tiers import DEFAULT_TIER, Tier

#: :attr:`SiteRule.backend` for a rule mounted only when ``apply`` runs no backend (a path a backend replaces)
NO_BACKEND = ""


@dataclass(frozen=True)
class SiteRule:
    """One row of a model's site table: every module whose path fullmatches ``pattern`` carries ``fast_path``.

    ``pattern``: a module path regex; group 1, when there is one, is the layer index (None without a group).
    ``backend``: None, mounted with or without a backend; a backend name (``"sol_attn"``), only with that backend;
    :data:`NO_BACKEND`, only without one. ``when``: a predicate on the module, for sites a path alone cannot tell
    (SANA-Video 2.0's softmax anchors and linear layers share ``blocks.N.attn``); None: every matching module.
    ``feature``: a hosted feature's name (:mod:`accelpatch.core.features`): the row mounts only when the call turns
    that feature on (``memory="low"``'s chunked sites). The tier is the fast path's own (``fast_path.tier``)."""

    pattern: Union[str, re.Pattern]
    fast_path: FastPath
    backend: Optional[str] = None
    when: Optional[Callable[[torch.nn.Module], bool]] = None
    feature: Optional[str] = None

    def __post_init__(self) -> None:
        if isinstance(self.pattern, str):
            object.__setattr__(self, "pattern", re.compile(self.pattern))

    def applies(self, backend_config: Any, configs: Mapping[str, Any] = MappingProxyType({})) -> bool:
        """Whether this rule mounts under ``backend_config`` (None: no backend) and the features' ``configs`` of
        the call (by feature name; a feature absent or None is off)."""
        if self.feature is not None and configs.get(self.feature) is None:
            return False
        if self.backend is None:
            return True
        if self.backend == NO_BACKEND:
            return backend_config is None
        return backend_config is not None and backend_config.name == self.backend

    def layer(self, path: str, module: torch.nn.Module) -> tuple[bool, Optional[int]]:
        """(whether ``path``/``module`` is a site of this rule, its layer index or None)."""
        match = self.pattern.fullmatch(path)
        if match is None or (self.when is not None and not self.when(module)):
            return False, None
        return True, int(match.group(1)) if self.pattern.groups else None


@dataclass(frozen=True)
class CacheSupport:
    """What the step cache (accelpatch.step_cache) needs to know about a family.

    ``methods``: the cache methods it runs ("first_block", "mag"). ``blocks``: the ModuleList of residual blocks
    diffusers' cache hooks go on (None: the model's own hook point). ``block_outputs``: where a block's streams sit in
    its output, (index of the hidden states, index of the second stream or None when the block returns the hidden
    states alone), as diffusers' ``TransformerBlockMetadata`` says. ``second_stream``: the block forward argument the
    second stream enters by (diffusers' hooks read ``encoder_hidden_states``). ``why_not``: why a method is missing,
    for the error message."""

    methods: tuple[str, ...] = ()
    blocks: Optional[str] = None
    block_outputs: tuple[int, Optional[int]] = (0, None)
    second_stream: str = "encoder_hidden_states"
    why_not: str = "not implemented"


@dataclass(frozen=True)
class ParallelSupport:
    """A family's context-parallel support: ``cp_plan(model)`` gives diffusers' plan (set as ``model._cp_plan`` where
    diffusers' class has none) and ``split_layers(model)`` makes the layers diffusers' hooks do not reach split-aware,
    returning the undo."""

    cp_plan: Callable[[torch.nn.Module], Optional[dict]]
    split_layers: Callable[[torch.nn.Module], Optional[Callable[[], None]]]


@dataclass(frozen=True)
class TimestepScale:
    """How the step clock (accelpatch.core.steps) reads a call's noise level: from the forward argument
    ``argument``; ``clean_is_high``: the timesteps run from 0 (noise) to 1 (clean), as MiniMax-H3's, instead of
    diffusers' 0-1000 scale where larger is noisier."""

    argument: str = "timestep"
    clean_is_high: bool = False

    def noise_level(self, timestep_values: tuple[float, ...]) -> float:
        """How noisy a call's input is, from its timestep values (larger = noisier); the noisiest rows count."""
        return 1.0 - min(timestep_values) if self.clean_is_high else max(timestep_values)


class ModelAdapter:
    """The whole story of one model family. ``apply``/``remove`` in :mod:`accelpatch.core.patcher` do the rest.

    A subclass overrides only the names in :attr:`EXTENSION_POINTS` (14; 29 before issue #33 grouped the cache
    knobs into :class:`CacheSupport`, the parallel pair into :class:`ParallelSupport`, the timestep pair into
    :class:`TimestepScale`, the site finding into the ``sites`` table, and made the methods no family changed
    plain helpers of the core). ``tests/test_site_tables.py`` checks that no adapter overrides anything else."""

    #: the names a family may set or override (attributes, then methods); everything else is the core's
    EXTENSION_POINTS = ("family", "model_classes", "backends", "sites", "options_class", "cache", "parallel",
                        "timesteps", "complete_backend", "validate_backend", "validate_options", "static_noops",
                        "step_thresholds", "capture_for")

    #: human-readable family name, shown in reports
    family: str = ""
    #: (module, class name) pairs of the diffusers classes this adapter handles
    model_classes: tuple[tuple[str, str], ...] = ()
    #: backend names this family accepts in ``apply(..., backend=...)``
    backends: tuple[str, ...] = ()
    #: the site table: which module carries which fast path (at the fast path's tier), with or without a backend
    sites: tuple[SiteRule, ...] = ()
    #: the typed options of this family's own fast paths (``apply(model, **options)``), or None; a frozen dataclass
    #: with ``option_names()`` and ``from_options(**options)``, like the backends' configs
    options_class: Optional[type] = None
    #: the step caches this family runs and how its blocks carry their streams
    cache: CacheSupport = CacheSupport()
    #: this family's context-parallel plan and split-aware layers; None: it adds none
    parallel: Optional[ParallelSupport] = None
    #: how the step clock reads the model's timesteps
    timesteps: TimestepScale = TimestepScale()

    # --- extension points (methods) -----------------------------------------------------------------------------

    def complete_backend(self, backend_config: Any, model: torch.nn.Module) -> Any:
        """``backend_config`` with the options left to the model (None) filled in with this family's defaults."""
        return backend_config

    def validate_backend(self, backend_config: Any, model: torch.nn.Module) -> None:
        """Raise ValueError when ``backend_config`` does not apply to this family or to this model's shape."""
        if backend_config is None:
            return
        reason = self.backend_unavailable_reason(backend_config.name)
        if reason is not None:
            raise ValueError(reason)

    def validate_options(self, options: Any, model: torch.nn.Module) -> None:
        """Raise ValueError when ``options`` do not fit this model (e.g. layers it does not have)."""

    def static_noops(self, model: torch.nn.Module, backend_config: Any, options: Any,
                     asked: Any = None) -> list[str]:
        """Fast paths these settings ask for that can never run on ``model`` (known at ``apply``), each as one
        sentence with the reason and what to change: ``apply`` warns once for each, ``strict=True`` raises.
        ``asked`` is the backend config as the user gave it (before :meth:`complete_backend` filled defaults)."""
        return []

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple:
        """The step counts of this family's policies under these settings: the N of every "the first N steps" (an
        int, or a :class:`~accelpatch.core.steps.StepCount` such as a fraction of the call's steps, or one counted
        from the end); a step-based policy applies, and each call needs a step reading, when one is not zero."""
        return ()

    def capture_for(self, backend_config: Any
                    ) -> Optional[Callable[[Mapping[str, Any]], Iterable[tuple[contextvars.ContextVar, Any]]]]:
        """What to capture per forward under ``backend_config``, or None for nothing: a picklable callable (a bound
        method) from the forward's bound arguments to the context variables to set for its duration (registered
        with accelpatch.core.call_context so that recomputation sees them too)."""
        return None

    # --- the core's helpers (not extension points) --------------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.model_classes)

    def matches(self, model: torch.nn.Module) -> bool:
        for module_name, class_name in self.model_classes:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            if isinstance(model, cls):
                return True
        return False

    def iter_sites(self, model: torch.nn.Module, backend_config: Any,
                   configs: Mapping[str, Any] = MappingProxyType({})
                   ) -> Iterator[tuple[str, torch.nn.Module, FastPath, Any]]:
        """Yield (module path, module, fast path, layer index or None) for every row of :attr:`sites` that applies
        under ``backend_config`` and the features' ``configs`` (a row naming a feature mounts only with it on):
        first the rules mounted with or without a backend, over the model's modules in
        order, then the backend-dependent ones (so a backend's own sites come after the lossless ones). A row naming
        a backend the family does not take raises (it would mount nothing, silently)."""
        for rule in self.sites:
            if rule.backend not in (None, NO_BACKEND) and rule.backend not in self.backends:
                raise ValueError(f"{type(self).__name__}.sites: the row {rule.pattern.pattern!r} names backend "
                                 f"{rule.backend!r}, which this family does not take; its backends: "
                                 f"{', '.join(map(repr, self.backends)) or 'none'} (or None, or NO_BACKEND)")
        for rules in ([r for r in self.sites if r.backend is None and r.applies(backend_config, configs)],
                      [r for r in self.sites if r.backend is not None and r.applies(backend_config, configs)]):
            if not rules:
                continue
            for path, module in model.named_modules():
                for rule in rules:
                    matched, layer = rule.layer(path, module)
                    if matched:
                        yield path, module, rule.fast_path, layer

    def default_tier(self, backend_config: Any) -> Tier:
        """``high`` when a backend is given (a backend's paths are approximate), else the default (``lossless``)."""
        return Tier.HIGH if backend_config is not None else DEFAULT_TIER

    def option_names(self) -> tuple[str, ...]:
        return tuple(self.options_class.option_names()) if self.options_class is not None else ()

    def resolve_options(self, options: Mapping[str, Any]) -> Any:
        """This family's options from ``apply``'s keyword arguments (its defaults when there are none)."""
        if self.options_class is None:
            return None
        return self.options_class.from_options(**{k: v for k, v in options.items() if k in self.option_names()})

    def backend_unavailable_reason(self, name: str) -> Optional[str]:
        """Why this family cannot run the backend called ``name`` (None when it can)."""
        if name in self.backends:
            return None
        return (f"backend {name!r} is not available for {self.family} models; backends available for "
                f"{self.family}: {', '.join(self.backends) or 'none'}")

    def validate_cache(self, config: Any) -> None:
        """Raise ValueError when this family cannot run the step cache ``config`` asks for."""
        if config.method not in self.cache.methods:
            runs = f"it runs {', '.join(map(repr, self.cache.methods))}" if self.cache.methods else "it runs none"
            raise ValueError(f"cache method {config.method!r} is not available for {self.family} "
                             f"({self.cache.why_not}); {runs}")

    def uses_steps(self, backend_config: Any, options: Any = None) -> bool:
        """Whether a step-based policy applies, so that each call needs a step reading (steps.py)."""
        return any(not step_count(n).zero for n in self.step_thresholds(backend_config, options))

    def cp_plan(self, model: torch.nn.Module) -> Optional[dict]:
        """diffusers' context-parallel plan for ``model`` (:attr:`parallel`), or None: this family adds no plan."""
        return self.parallel.cp_plan(model) if self.parallel is not None else None

    def prepare_parallel(self, model: torch.nn.Module) -> Optional[Callable[[], None]]:
        """Called once by ``apply``: make the layers diffusers' context-parallel hooks do not reach split-aware
        (idle, and bit-identical, while the model is not split). Returns the undo ``remove()`` runs, or None."""
        return self.parallel.split_layers(model) if self.parallel is not None else None
