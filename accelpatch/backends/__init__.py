"""Attention backends selectable with ``apply(..., backend=...)``: name → typed config class."""
from __future__ import annotations

from typing import Any

from .sol_attn import SolAttnConfig

#: backend name → config class with ``from_options(**options)``
BACKENDS: dict[str, type] = {SolAttnConfig.name: SolAttnConfig}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def resolve_backend(backend: Any, options: dict) -> Any:
    """Validate ``backend`` and ``options`` into a typed config (or None), touching no model."""
    if backend is None:
        if options:
            raise ValueError(
                f"unexpected options {sorted(options)} for apply() without a backend; options belong to a backend "
                f"(available backends: {', '.join(available_backends()) or 'none'})")
        return None
    for cls in BACKENDS.values():
        if isinstance(backend, cls):
            if options:
                raise ValueError(
                    f"pass options either inside {type(backend).__name__} or as keyword arguments, not both "
                    f"(got {sorted(options)})")
            return backend
    if isinstance(backend, str):
        key = backend.strip().lower().replace("-", "_")
        cls = BACKENDS.get(key)
        if cls is not None:
            return cls.from_options(**options)
    raise ValueError(
        f"unknown backend {backend!r}; available backends: {', '.join(available_backends()) or 'none'}")
