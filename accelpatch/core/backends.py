"""Attention backends selectable with ``apply(..., backend=...)``: name → typed config class. A backend registers
itself (:func:`register_backend`) from a module the core hosts (:mod:`accelpatch.core.features`)."""
from __future__ import annotations

from typing import Any, Optional

from accelpatch.core import features
from accelpatch.core.errors import did_you_mean

#: backend name → config class with ``name``, ``option_names()`` and ``from_options(**options)``
_BACKENDS: dict[str, type] = {}


def register_backend(cls: type) -> type:
    """Called by a backend's module when it is imported: ``apply(..., backend=cls.name)`` then takes it (a module
    imported again replaces its own class)."""
    known = _BACKENDS.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"a different backend is already registered as {cls.name!r}")
    _BACKENDS[cls.name] = cls
    return cls


def backends() -> dict[str, type]:
    """Every registered backend: name → config class."""
    features.registered()  # the hosted modules register the backends
    return dict(_BACKENDS)


def available_backends() -> list[str]:
    return sorted(backends())


def backend_class(backend: Any) -> Optional[type]:
    """The config class ``backend`` (None, a name, or a config object) stands for; None for None. Raises
    ValueError for anything else, naming the available backends."""
    if backend is None:
        return None
    known = backends()
    for cls in known.values():
        if isinstance(backend, cls):
            return cls
    if isinstance(backend, str):
        key = backend.strip().lower().replace("-", "_")
        if key in known:
            return known[key]
        hint = did_you_mean(key, available_backends())
    else:
        hint = ""
    raise ValueError(f"unknown backend {backend!r}{hint}; available backends: "
                     f"{', '.join(available_backends()) or 'none'}, or a config object such as "
                     f"{' or '.join(f'{cls.__name__}(...)' for cls in known.values()) or 'none'}")


def resolve_backend(backend: Any, options: dict) -> Any:
    """``backend`` and its own keyword options (already sorted out by accelpatch.core.apply_options) → its typed
    config, or None without a backend. Touches no model."""
    cls = backend_class(backend)
    if cls is None:
        return None
    if isinstance(backend, cls):
        if options:
            raise ValueError(f"pass options either inside {type(backend).__name__} or as keyword arguments, not both "
                             f"(got {sorted(options)})")
        return backend
    return cls.from_options(**options)
