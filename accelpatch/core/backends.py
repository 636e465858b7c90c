"""Attention backends selectable with ``apply(..., backend=...)``: name → typed config class."""
from __future__ import annotations

from typing import Any, Optional

from accelpatch.core.errors import did_you_mean
from accelpatch.sol_attn.config import SolAttnConfig

#: backend name → config class with ``option_names()`` and ``from_options(**options)``
BACKENDS: dict[str, type] = {SolAttnConfig.name: SolAttnConfig}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def backend_class(backend: Any) -> Optional[type]:
    """The config class ``backend`` (None, a name, or a config object) stands for; None for None. Raises
    ValueError for anything else, naming the available backends."""
    if backend is None:
        return None
    for cls in BACKENDS.values():
        if isinstance(backend, cls):
            return cls
    if isinstance(backend, str):
        key = backend.strip().lower().replace("-", "_")
        if key in BACKENDS:
            return BACKENDS[key]
        hint = did_you_mean(key, available_backends())
    else:
        hint = ""
    raise ValueError(f"unknown backend {backend!r}{hint}; available backends: "
                     f"{', '.join(available_backends()) or 'none'}, or a config object such as SolAttnConfig(...)")


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
