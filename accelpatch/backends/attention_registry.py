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
2. registers :func:`~accelpatch.backends.attention_backend.sol_attn_backend` for it through the registry's own
   (private) ``register`` decorator, which fills ``_backends``, ``_constraints`` and ``_supported_arg_names``; not
   in ``_supports_context_parallel``: diffusers then refuses ``sol_attn`` on a model with a parallel config;
3. wraps the registry's ``get_active_backend`` so that a processor *not* set to ``sol_attn`` never runs it, also
   when ``sol_attn`` became diffusers' process-global active backend (diffusers#14249): it gets the counted dense
   :func:`~accelpatch.backends.attention_backend.sol_attn_via_global` instead.

When: ``import accelpatch`` never imports diffusers. :func:`install` (called by ``import accelpatch``) registers at
once if ``diffusers.models.attention_dispatch`` is already imported, and otherwise adds a ``sys.meta_path`` finder
that registers right after that module is first imported (and then removes itself). On an unknown diffusers version
the hook only warns (importing diffusers must keep working); ``accelpatch.register_sol_attn_backend()`` raises.
:func:`unregister` undoes all three steps. Both hold a lock; registration is idempotent.
"""
from __future__ import annotations

import importlib.abc
import re
import sys
import threading
import warnings
from typing import Any, Optional

TARGET = "diffusers.models.attention_dispatch"
MEMBER = "SOL_ATTN"
VALUE = "sol_attn"
#: diffusers versions whose dispatcher this module was written against: (lowest, first excluded)
SUPPORTED = ((0, 42, 1), (0, 43, 0))

_lock = threading.RLock()
_state: dict[str, Any] = {"registered": False, "error": None, "original_get_active": None}


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
    if TARGET not in sys.modules:
        return "diffusers' attention dispatcher is not imported yet (it registers on that import)"
    return "not registered (unregistered, or registration has not run)"


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

        from . import attention_backend as ab

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
        _state.update(registered=True, error=None, original_get_active=original)


def attention_backend_report(*, reset: bool = False) -> AttentionBackendReport:
    """What the ``sol_attn`` attention backend (``set_attention_backend``) did in this process; ``reset=True``
    zeroes the counts after reading them."""
    from dataclasses import asdict

    from .attention_backend import COUNTERS, AttentionBackendReport, current_config

    totals = COUNTERS.totals()
    if reset:
        COUNTERS.reset()
    return AttentionBackendReport(
        registered=is_registered(), why_not_registered=why_not_registered(),
        sparse_calls=totals["fast"], dense_calls={k: v for k, v in totals["reference"].items() if v},
        fallback_calls={k: v for k, v in totals["fallbacks"].items() if v},
        exact_fraction=totals["stats"].get("exact_fraction"), config=asdict(current_config()),
        uncounted=totals["uncounted"])


#: the public name (``accelpatch.register_sol_attn_backend``)
register_sol_attn_backend = register


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


def _register_quietly() -> None:
    """The import hook's registration: an unknown diffusers version warns (the import of diffusers goes on)."""
    try:
        register()
    except UnsupportedDiffusersVersion as error:
        warnings.warn(f"set_attention_backend('sol_attn') is unavailable: {error}", RuntimeWarning, stacklevel=3)


class _LoaderThatRegisters(importlib.abc.Loader):
    """The dispatcher's own loader, followed by :func:`_register_quietly` once the module has run."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _FINDER.remove()
        _register_quietly()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for :data:`TARGET`, wraps the spec the other finders give in a registering loader."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderThatRegisters(spec.loader)
        return spec

    def remove(self) -> None:
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)


_FINDER = _Finder()


def install() -> None:
    """Called by ``import accelpatch``: register now if the dispatcher is imported, else on its import."""
    with _lock:
        if TARGET in sys.modules:
            _register_quietly()
        elif _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
