"""What a model adapter provides: which modules are sites, which backends apply, which hooks to attach."""
from __future__ import annotations

import contextvars
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

from accelpatch.core.sites import FastPath
from accelpatch.core.tiers import DEFAULT_TIER, Tier


class ModelAdapter:
    """The whole story of one model family. Subclasses list their model classes, find their sites and validate
    their backends; ``apply``/``remove`` in :mod:`accelpatch.core.patcher` do the rest."""

    #: human-readable family name, shown in reports
    family: str = ""
    #: (module, class name) pairs of the diffusers classes this adapter handles
    model_classes: tuple[tuple[str, str], ...] = ()
    #: backend names this family accepts in ``apply(..., backend=...)``
    backends: tuple[str, ...] = ()

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.model_classes)

    def matches(self, model: torch.nn.Module) -> bool:
        import importlib

        for module_name, class_name in self.model_classes:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            if isinstance(model, cls):
                return True
        return False

    #: the forward argument the step clock reads (see accelpatch.core.steps)
    timestep_argument: str = "timestep"
    #: the typed options of this family's own fast paths (``apply(model, **options)``), or None; a frozen dataclass
    #: with ``option_names()`` and ``from_options(**options)``, like the backends' configs
    options_class: Optional[type] = None

    def option_names(self) -> tuple[str, ...]:
        return tuple(self.options_class.option_names()) if self.options_class is not None else ()

    def resolve_options(self, options: Mapping[str, Any]) -> Any:
        """This family's options from ``apply``'s keyword arguments (its defaults when there are none)."""
        if self.options_class is None:
            return None
        return self.options_class.from_options(**{k: v for k, v in options.items() if k in self.option_names()})

    def complete_backend(self, backend_config: Any, model: torch.nn.Module) -> Any:
        """``backend_config`` with the options left to the model (None) filled in with this family's defaults."""
        return backend_config

    def validate_options(self, options: Any, model: torch.nn.Module) -> None:
        """Raise ValueError when ``options`` do not fit this model (e.g. layers it does not have)."""

    def backend_unavailable_reason(self, name: str) -> Optional[str]:
        """Why this family cannot run the backend called ``name`` (None when it can)."""
        if name in self.backends:
            return None
        return (f"backend {name!r} is not available for {self.family} models; backends available for "
                f"{self.family}: {', '.join(self.backends) or 'none'}")

    def validate_backend(self, backend_config: Any, model: torch.nn.Module) -> None:
        """Raise ValueError when ``backend_config`` does not apply to this family or to this model's shape."""
        if backend_config is None:
            return
        reason = self.backend_unavailable_reason(backend_config.name)
        if reason is not None:
            raise ValueError(reason)

    def static_noops(self, model: torch.nn.Module, backend_config: Any, options: Any,
                     asked: Any = None) -> list[str]:
        """Fast paths these settings ask for that can never run on ``model`` (known at ``apply``), each as one
        sentence with the reason and what to change: ``apply`` warns once for each, ``strict=True`` raises.
        ``asked`` is the backend config as the user gave it (before :meth:`complete_backend` filled defaults)."""
        return []

    def default_tier(self, backend_config: Any) -> Tier:
        return DEFAULT_TIER

    def iter_sites(self, model: torch.nn.Module,
                   backend_config: Any) -> Iterator[tuple[str, torch.nn.Module, FastPath, Any]]:
        """Yield (module path, module, fast path, layer index or None) for every site of ``model``."""
        raise NotImplementedError

    def cp_plan(self, model: torch.nn.Module) -> Optional[dict]:
        """diffusers' context-parallel plan for ``model``, which ``apply`` sets as ``model._cp_plan`` (read by
        ``enable_parallelism``) where diffusers' class has none; None: this family adds no plan."""
        return None

    def prepare_parallel(self, model: torch.nn.Module) -> Optional[Callable[[], None]]:
        """Called once by ``apply``: make the layers diffusers' context-parallel hooks do not reach split-aware
        (idle, and bit-identical, while the model is not split). Returns the undo ``remove()`` runs, or None."""
        return None

    #: step caches (accelpatch.step_cache.cache) this family runs: "first_block", "mag"
    cache_methods: tuple[str, ...] = ()
    #: the ModuleList of residual blocks diffusers' cache hooks go on; None: the model's own hook point
    cache_blocks: Optional[str] = None
    #: why a cache method is missing, for the error message
    cache_unsupported: str = "not implemented"
    #: where a cache block's streams sit in its output: (index of the hidden states, index of the second stream or
    #: None when the block returns the hidden states alone), as diffusers' ``TransformerBlockMetadata`` says
    cache_block_outputs: tuple[int, Optional[int]] = (0, None)
    #: the block forward argument the second stream enters by (diffusers' hooks read ``encoder_hidden_states``)
    cache_second_stream: str = "encoder_hidden_states"

    def validate_cache(self, config: Any) -> None:
        """Raise ValueError when this family cannot run the step cache ``config`` asks for."""
        if config.method not in self.cache_methods:
            runs = f"it runs {', '.join(map(repr, self.cache_methods))}" if self.cache_methods else "it runs none"
            raise ValueError(f"cache method {config.method!r} is not available for {self.family} "
                             f"({self.cache_unsupported}); {runs}")

    def uses_steps(self, backend_config: Any, options: Any = None) -> bool:
        """Whether a step-based policy applies, so that each call needs a step reading (steps.py)."""
        return False

    def step_thresholds(self, backend_config: Any, options: Any = None) -> tuple[int, ...]:
        """The N of every "the first N steps" in this family's policies under these settings."""
        return ()

    def noise_level(self, timestep_values: tuple[float, ...]) -> float:
        """How noisy a call's input is, from its timestep values (larger = noisier): diffusers' 0-1000 scale."""
        return max(timestep_values)

    def captures(self, backend_config: Any) -> bool:
        """Whether :meth:`capture` has anything to set for calls under ``backend_config``."""
        return False

    def capture(self, arguments: Mapping[str, Any],
                backend_config: Any) -> Iterable[tuple[contextvars.ContextVar, Any]]:
        """Context variables to set for the duration of one forward, from its bound arguments (registered with
        accelpatch.core.call_context so that recomputation sees them too)."""
        return ()
