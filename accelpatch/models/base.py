"""What a model adapter provides: which modules are sites, which backends apply, which hooks to attach."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import torch

from ..sites.base import FastPath
from ..tiers import DEFAULT_TIER, Tier

if TYPE_CHECKING:  # pragma: no cover
    from ..patcher import ModelPatch


class ModelAdapter:
    """The whole story of one model family. Subclasses list their model classes, find their sites and validate
    their backends; ``apply``/``remove`` in :mod:`accelpatch.patcher` do the rest."""

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

    def validate_backend(self, backend_config: Any) -> None:
        """Raise ValueError when ``backend_config`` does not apply to this family."""
        if backend_config is None:
            return
        if backend_config.name not in self.backends:
            available = ", ".join(self.backends) or "none"
            raise ValueError(
                f"backend {backend_config.name!r} is not available for {self.family} models; "
                f"backends available for {self.family}: {available}")

    def default_tier(self, backend_config: Any) -> Tier:
        return DEFAULT_TIER

    def iter_sites(self, model: torch.nn.Module, backend_config: Any) -> Iterator[tuple[str, torch.nn.Module, FastPath]]:
        """Yield (module path, module, fast path, layer index or None) for every site of ``model``."""
        raise NotImplementedError

    def attach_hooks(self, model: torch.nn.Module, patch: "ModelPatch", pipeline: Optional[Any]) -> Iterable[Any]:
        """Attach model-level hooks; return callables that detach them."""
        return ()
