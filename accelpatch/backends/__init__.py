"""Attention backends selectable with ``apply(..., backend=...)``: name → typed config class."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from .sol_attn import SolAttnConfig

#: backend name → config class with ``from_options(**options)``
BACKENDS: dict[str, type] = {SolAttnConfig.name: SolAttnConfig}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def resolve_backend(backend: Any, options: dict, model_options: Iterable[str] = ()) -> tuple[Any, dict]:
    """Validate ``backend`` and ``options`` into a typed config (or None), touching no model. Options named in
    ``model_options`` (the patched models' own options) are passed through; returns (config, those options)."""
    model_options = set(model_options)
    own = {k: v for k, v in options.items() if k in model_options}
    rest = {k: v for k, v in options.items() if k not in model_options}
    model_note = (f"; options of the models being patched: {', '.join(sorted(model_options))}" if model_options
                  else "")
    if backend is None:
        if rest:
            raise ValueError(
                f"unexpected options {sorted(rest)} for apply() without a backend; options belong to a backend "
                f"(available backends: {', '.join(available_backends()) or 'none'}){model_note}")
        return None, own
    cls = _backend_class(backend)
    if cls is not None and not isinstance(backend, cls):  # by name: its options may share names with the model's
        backend_names = set(cls.option_names())
        own = {k: v for k, v in options.items() if k in model_options and k not in backend_names}
        rest = {k: v for k, v in options.items() if k not in own}
    return _resolve(backend, rest, model_note), own


def _backend_class(backend: Any) -> Optional[type]:
    for cls in BACKENDS.values():
        if isinstance(backend, cls):
            return cls
    if isinstance(backend, str):
        return BACKENDS.get(backend.strip().lower().replace("-", "_"))
    return None


def _resolve(backend: Any, options: dict, model_note: str) -> Any:
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
            try:
                return cls.from_options(**options)
            except ValueError as error:
                raise ValueError(f"{error}{model_note}") from None
    raise ValueError(
        f"unknown backend {backend!r}; available backends: {', '.join(available_backends()) or 'none'}")
