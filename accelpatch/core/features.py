"""The features the core hosts, and the model families it patches: each registers itself here, and ``apply()``,
``remove()`` and ``report()`` run what is registered, so the core imports no feature and no model (in the spirit of
torchao's config → handler map and diffusers' hooks).

A :class:`Feature` (the step cache, parallelism, the lossless kernels' switch, ...) states its ``apply()`` keyword
argument and options, checks them before any model is touched, attaches itself to each patched model (returning
what ``remove()`` undoes) and fills its section of the report. ``accelpatch/__init__.py``, above the core, names
the modules that register (:func:`host`); they are imported on the first ``apply()`` or ``report()``, so that
``import accelpatch`` stays free of torch.
"""
from __future__ import annotations

import importlib
import threading
from typing import Any, Optional, Sequence

__all__ = ["Feature", "register", "unregister", "registered", "feature", "host", "host_adapters", "adapters",
           "find_adapter"]


class Feature:
    """One feature hosted by the core. Every hook has a default that does nothing, so a feature overrides only what
    it does. ``config`` is what :meth:`resolve` returned for this call (hashable: it is part of the patch's key);
    ``patch`` is the model's ``ModelPatch`` (``patch.configs[name]``, ``patch.attached[name]``)."""

    #: the feature's name: the key of its config and attached state on a patch
    name: str = ""
    #: features attach in this order (lower first) and are undone in reverse
    order: int = 100
    #: ``apply()``'s keyword argument that turns it on (e.g. "cache"), or None, and that argument's default
    argument: Optional[str] = None
    default: Any = None
    #: who owns ``option_names()`` in error messages, and how a user turns them on
    owner: str = ""
    use: str = ""
    #: the key of this feature's section in the report (``ModelReport.sections``; "cache" and "parallel" are also
    #: fields of their own); None: it adds nothing per model
    report_field: Optional[str] = None

    def option_names(self) -> tuple[str, ...]:
        """Keyword options of ``apply()`` this feature owns (they come to :meth:`resolve`)."""
        return ()

    def resolve(self, value: Any, options: dict) -> Any:
        """``apply()``'s argument and this feature's options → the config of this call (None: off). Raises
        ValueError naming a bad value and the choices. Touches no model. A config it returned must come back as
        itself when given as the argument (``patched()`` and ``tune`` re-apply a patch that way)."""
        return None

    def validate(self, model: Any, adapter: Any, config: Any, existing: Any, requested: tuple) -> None:
        """Before any model is touched: raise where this model cannot take the feature (``existing``: the model's
        current patch or None; ``requested``: the key of the patch being asked for)."""

    def attach(self, model: Any, patch: Any, config: Any, pipeline: Any) -> Any:
        """Attach to a patched model (after its sites and forward hooks). Returns the attached state (kept as
        ``patch.attached[name]``; its ``before_forward(model, args)``, if any, runs before each forward) or None."""
        return None

    def detach(self, model: Any, state: Any) -> None:
        """Undo :meth:`attach` (``remove()`` detaches features in reverse order, before the sites are restored)."""
        if state is not None:
            state.remove()

    def forget(self, model: Any, *, reapplying: bool) -> None:
        """Called by ``remove()`` for every model, patched or not, before the patch is undone (``reapplying``:
        ``apply()`` removes a patch to apply other arguments)."""

    def offers_high(self, config: Any) -> bool:
        """Whether this feature gives tier ``high`` something to do."""
        return False

    def uses_steps(self, config: Any) -> bool:
        """Whether this feature reads the denoising step (the model's hooks then run the step clock)."""
        return False

    def report(self, model: Any, patch: Any, reset: bool) -> Any:
        """This feature's section of the model's report (``report_field``); None when it has nothing to say."""
        return None

    def report_line(self, section: Any) -> Optional[str]:
        """One line of the report's text for a section :meth:`report` returned (None: no line)."""
        return None

    def notes(self) -> list[str]:
        """Process-wide lines the report shows under the lossless fusions (e.g. the state of a kernel build)."""
        return []


_FEATURES: dict[str, Feature] = {}
_HOSTED: list[str] = []
_ADAPTER_SOURCES: list[str] = []
_LOCK = threading.RLock()
_loaded = 0


def register(feature: Feature) -> Feature:
    """Called by a feature's module when it is imported. A second feature of the same name raises."""
    if not feature.name:
        raise ValueError(f"{type(feature).__name__} has no name")
    with _LOCK:
        known = _FEATURES.get(feature.name)
        if known is not None and _qualified(type(known)) != _qualified(type(feature)):  # a reload re-registers
            raise ValueError(f"a different feature is already registered as {feature.name!r}")
        _FEATURES[feature.name] = feature
    return feature


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def unregister(name: str) -> None:
    """Take a feature out of the registry (an example's or a test's own feature; patched models keep theirs)."""
    with _LOCK:
        _FEATURES.pop(name, None)


def host(*modules: str) -> None:
    """Name modules that register features; they are imported on first use (see :func:`registered`)."""
    with _LOCK:
        _HOSTED.extend(m for m in modules if m not in _HOSTED)


def host_adapters(source: str) -> None:
    """Name where the model families' adapters are listed ("module:attribute"), read on first use."""
    with _LOCK:
        if source not in _ADAPTER_SOURCES:
            _ADAPTER_SOURCES.append(source)


def _load() -> None:
    global _loaded
    with _LOCK:
        while _loaded < len(_HOSTED):
            importlib.import_module(_HOSTED[_loaded])
            _loaded += 1


def registered() -> tuple[Feature, ...]:
    """Every registered feature, in attach order."""
    _load()
    return tuple(sorted(_FEATURES.values(), key=lambda f: (f.order, f.name)))


def feature(name: str) -> Feature:
    """The feature registered as ``name`` (KeyError naming the registered ones)."""
    _load()
    try:
        return _FEATURES[name]
    except KeyError:
        raise KeyError(f"no feature is registered as {name!r}; registered: {', '.join(sorted(_FEATURES))}") from None


def adapters() -> Sequence[Any]:
    """Every model family's adapter, from the sources named with :func:`host_adapters`."""
    found: list = []
    for source in list(_ADAPTER_SOURCES):
        module, _, attribute = source.partition(":")
        found.extend(getattr(importlib.import_module(module), attribute))
    return found


def find_adapter(model: Any, candidates: Optional[Sequence[Any]] = None) -> Any:
    """The adapter of the first family that takes ``model``; ValueError naming the supported classes otherwise
    (and saying what to do with a model torch.compile already wrapped)."""
    import torch

    candidates = adapters() if candidates is None else candidates
    for adapter in candidates:
        if adapter.matches(model):
            return adapter
    supported = ", ".join(name for adapter in candidates for name in adapter.class_names)
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, torch.nn.Module):  # torch.compile's wrapper (OptimizedModule) around a model
        try:
            family = find_adapter(inner, candidates).family
        except ValueError:
            family = None
        if family is not None:
            raise ValueError(f"this {type(inner).__name__} is already wrapped by torch.compile "
                             f"({type(model).__name__}): apply accelpatch before compiling (accelpatch.apply(pipe), "
                             "then pipe.transformer = torch.compile(pipe.transformer), or transformer.compile() in "
                             "place), or apply it to the model inside, its ._orig_mod")
    raise ValueError(f"accelpatch does not support {type(model).__name__}; supported model classes: {supported}")
