"""Register the ``sol_attn`` backend in diffusers' attention backend registry, so that
``model.set_attention_backend("sol_attn")`` works after ``import accelpatch``, with no ``apply()``; and the
backend's public face: whether it is registered and what it did (:func:`attention_backend_report`).

diffusers 0.42 has no public registration API and its ``AttentionBackendName`` is a closed ``str`` enum that both
``set_attention_backend`` methods and ``dispatch_attention_fn`` validate names against. :func:`register` therefore,
on a diffusers version it knows (:data:`SUPPORTED`, checked before anything is touched; any other version raises
:class:`UnsupportedDiffusersVersion` naming it):

1. adds one member ``AttentionBackendName.SOL_ATTN = "sol_attn"`` the way ``enum`` adds a member when it builds a
   class (a ``str`` instance with ``_name_``/``_value_``/``_sort_order_``, in ``_member_map_``,
   ``_value2member_map_``, ``_member_names_`` and as a class attribute);
2. registers :func:`~accelpatch.sol_attn.diffusers_backend.sol_attn_backend` for it through the registry's own
   (private) ``register`` decorator, which fills ``_backends``, ``_constraints`` and ``_supported_arg_names``; not
   in ``_supports_context_parallel``: diffusers then refuses ``sol_attn`` on a model with a parallel config;
3. wraps the registry's ``get_active_backend`` so that a processor *not* set to ``sol_attn`` never runs it, also
   when ``sol_attn`` became diffusers' process-global active backend (diffusers#14249): it gets the counted dense
   :func:`~accelpatch.sol_attn.diffusers_backend.sol_attn_via_global` instead.

When: only when asked. ``import accelpatch`` touches nothing of diffusers (it imports neither diffusers nor
torch); :func:`register` runs from ``accelpatch.sol_attn.register_attention_backend()``, from
``accelpatch.sol_attn.configure_sol_attn_backend()`` and from ``apply(..., backend="sol_attn")`` (there quietly: on an unknown
diffusers version apply()'s own Sol-Attn sites still work, and :func:`why_not_registered` keeps the reason).
:func:`unregister` undoes all three steps. Both hold a lock; registration is idempotent.
"""
from __future__ import annotations

import re
import threading
import warnings
from typing import Any, Optional

MEMBER = "SOL_ATTN"
VALUE = "sol_attn"
#: diffusers versions whose dispatcher this module was written against: (lowest, first excluded)
SUPPORTED = ((0, 42, 1), (0, 43, 0))

_lock = threading.RLock()
_state: dict[str, Any] = {"registered": False, "error": None, "original_get_active": None, "was_registered": False}


class UnsupportedDiffusersVersion(RuntimeError):
    """The installed diffusers is not one whose private attention registry :func:`register` knows."""


def _parse(version: str) -> tuple:
    """"0.42.1" → (0, 42, 1); a version that does not start with three numbers → () (supported by nothing)."""
    match = re.match(r"\s*(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(x) for x in match.groups()) if match else ()


def check_version(version: str) -> None:
    """Raise :class:`UnsupportedDiffusersVersion` unless ``version`` lies in :data:`SUPPORTED`."""
    lo, hi = SUPPORTED
    if not (lo <= _parse(version) < hi):
        raise UnsupportedDiffusersVersion(
            f"accelpatch's sol_attn attention backend supports diffusers >={'.'.join(map(str, lo))},"
            f"<{'.'.join(map(str, hi))}, found diffusers {version}: diffusers has no public API to register an "
            "attention backend, so accelpatch edits its private registry and does so only on versions it was "
            "checked against. Use accelpatch.apply(pipe, backend='sol_attn') instead, or a supported diffusers")


def is_registered() -> bool:
    return _state["registered"]


def why_not_registered() -> Optional[str]:
    if _state["registered"]:
        return None
    error = _state["error"]
    if error is not None:
        return str(error)
    return ("not registered: call accelpatch.sol_attn.register_attention_backend() (or apply(..., backend='sol_attn')) "
            "before set_attention_backend('sol_attn')" + (" (it was unregistered)" if _state["was_registered"] else ""))


def _add_member(enum_cls) -> Any:
    """Add ``SOL_ATTN = "sol_attn"`` to the (str, Enum) class ``enum_cls`` as the enum machinery adds a member."""
    if VALUE in enum_cls._value2member_map_:
        return enum_cls._value2member_map_[VALUE]
    for attribute in ("_member_map_", "_value2member_map_", "_member_names_"):
        if not hasattr(enum_cls, attribute):
            raise UnsupportedDiffusersVersion(f"this Python's enum has no {attribute}: cannot add {VALUE!r} to "
                                              f"{enum_cls.__name__}")
    member = str.__new__(enum_cls, VALUE)
    member._name_ = MEMBER
    member._value_ = VALUE
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    type.__setattr__(enum_cls, MEMBER, member)  # EnumType.__setattr__ refuses names that are members
    enum_cls._member_map_[MEMBER] = member
    enum_cls._value2member_map_[VALUE] = member
    enum_cls._member_names_.append(MEMBER)
    return member


def _remove_member(enum_cls) -> None:
    enum_cls._member_map_.pop(MEMBER, None)
    enum_cls._value2member_map_.pop(VALUE, None)
    if MEMBER in enum_cls._member_names_:
        enum_cls._member_names_.remove(MEMBER)
    if MEMBER in enum_cls.__dict__:
        type.__delattr__(enum_cls, MEMBER)


def register(*, diffusers_version: Optional[str] = None) -> None:
    """Register ``sol_attn`` in diffusers' attention registry (imports diffusers). ``diffusers_version`` overrides
    the installed version (tests). Raises :class:`UnsupportedDiffusersVersion` on a version not in
    :data:`SUPPORTED`, before touching diffusers' registry."""
    with _lock:
        if diffusers_version is None:
            import diffusers

            diffusers_version = diffusers.__version__
        try:
            check_version(diffusers_version)
        except UnsupportedDiffusersVersion as error:
            if not _state["registered"]:
                _state["error"] = error
            raise
        if _state["registered"]:
            return
        from diffusers.models import attention_dispatch as ad

        from accelpatch.sol_attn import diffusers_backend as ab

        registry = ad._AttentionBackendRegistry
        for attribute in ("_backends", "_constraints", "_supported_arg_names", "_supports_context_parallel",
                          "_active_backend", "register", "get_active_backend"):
            if not hasattr(registry, attribute):
                raise UnsupportedDiffusersVersion(f"diffusers {diffusers_version}'s _AttentionBackendRegistry has "
                                                  f"no {attribute}")
        member = _add_member(ad.AttentionBackendName)
        registry.register(member, constraints=[], supports_context_parallel=False)(ab.sol_attn_backend)
        original = registry.__dict__["get_active_backend"]

        def get_active_backend(cls):
            if cls._active_backend is member:
                return member, ab.sol_attn_via_global
            return original.__func__(cls)

        get_active_backend.__doc__ = original.__func__.__doc__
        registry.get_active_backend = classmethod(get_active_backend)
        ab.prime_dense()
        _state.update(registered=True, error=None, original_get_active=original, was_registered=True)


def attention_backend_report(*, reset: bool = False) -> AttentionBackendReport:
    """What the ``sol_attn`` attention backend (``set_attention_backend``) did in this process; ``reset=True``
    zeroes the counts after reading them."""
    from accelpatch.sol_attn.diffusers_backend import COUNTERS, AttentionBackendReport, options_in_force

    totals = COUNTERS.totals()
    if reset:
        COUNTERS.reset()
    return AttentionBackendReport(
        registered=is_registered(), why_not_registered=why_not_registered(),
        sparse_calls=totals["fast"], dense_calls={k: v for k, v in totals["reference"].items() if v},
        fallback_calls={k: v for k, v in totals["fallbacks"].items() if v},
        exact_fraction=totals["stats"].get("exact_fraction"), config=options_in_force(),
        uncounted=totals["uncounted"])


def register_attention_backend() -> None:
    """Make ``model.set_attention_backend("sol_attn")`` work in this process: add ``sol_attn`` to diffusers'
    attention backends (see this module). Raises :class:`UnsupportedDiffusersVersion` naming the installed diffusers
    where the registry is not one accelpatch knows; ``apply(pipe, backend="sol_attn")`` works on any version."""
    register()


def configure_sol_attn_backend(**options: Any):
    """Set the ``sol_attn`` attention backend's options for this process (unnamed options keep their defaults, not
    their previous values) and register the backend (configuring it asks for it; see
    :func:`register_attention_backend`); returns the options in force, a
    :class:`~accelpatch.sol_attn.config.SolAttnConfig` (the type ``apply(..., backend="sol_attn")`` takes). Options:
    tau, thresh_type, sink_tokens (default 0 here), sink_start, kv_splits, impl, dense_steps (default 0 here),
    dense_backend (a registered diffusers backend name, checked here)."""
    from accelpatch.sol_attn.diffusers_backend import set_options

    register()
    return set_options(**options)


def unregister() -> None:
    """Undo :func:`register`: the enum member, the registry entries and the ``get_active_backend`` wrapper go;
    a global active backend left at ``sol_attn`` returns to diffusers' process default. Processors still set to
    ``sol_attn`` would then fail in diffusers: set them back first (``model.set_attention_backend("native")``)."""
    with _lock:
        if not _state["registered"]:
            return
        from diffusers.models import attention_dispatch as ad

        registry = ad._AttentionBackendRegistry
        member = ad.AttentionBackendName._value2member_map_.get(VALUE)
        for table in (registry._backends, registry._constraints, registry._supported_arg_names):
            table.pop(member, None)
        registry._supports_context_parallel.discard(VALUE)
        registry.get_active_backend = _state["original_get_active"]
        if registry._active_backend is member:
            registry._active_backend = ad.AttentionBackendName(ad.DIFFUSERS_ATTN_BACKEND)
        _remove_member(ad.AttentionBackendName)
        _state.update(registered=False, original_get_active=None)


def register_quietly() -> None:
    """``apply(..., backend="sol_attn")``'s registration: on an unknown diffusers version nothing happens (apply's own
    sites do not need diffusers' registry); :func:`why_not_registered` keeps the reason."""
    try:
        register()
    except UnsupportedDiffusersVersion:
        pass
