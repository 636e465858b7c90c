"""The gated subclasses: ``apply()`` swaps a patched module's class for a subclass of its own class (same parameters,
same path) whose forward asks the module's :class:`~accelpatch.core.sites.Site`, and whose enabled attributes read the
site's mount record. They are made once per (class, fusions), print as the diffusers class they wrap, and pickle and
deep-copy by what they are made of, also into a process that has not patched that class yet."""
from __future__ import annotations

import base64
import copyreg
import importlib
import inspect
import threading
import types
from typing import Any, Callable

import torch

from accelpatch.core.gate import QualityGatedFusion, fusion_by_name
from accelpatch.core.sites import SITE_ATTR

_GATED_CLASSES: dict[tuple[type, str], type] = {}
_GATED_LOCK = threading.Lock()


def _enabled_property(fusion: QualityGatedFusion) -> property:
    def get(self) -> bool:
        return fusion.is_enabled(self)

    def set_(self, value: bool) -> None:
        # another caller's mount/unmount (sglang's site protocol sets the attribute): off always works; on only
        # where accelpatch's own mount did not reject the site (its reason stays)
        record = fusion.record(self)
        record.mounted = bool(value) and record.reject_reason is None

    def delete(self) -> None:
        fusion.record(self).mounted = False

    return property(get, set_, delete, f"True when {fusion.name} is mounted and the calling context's tier admits it.")


def ungated_forward(module: torch.nn.Module) -> Callable:
    """The forward the module's original class defines, bound to ``module``."""
    cls = type(module)
    original = cls.__dict__.get("_accelpatch_original_class", cls)
    return original.forward.__get__(module)


def _gated_forward(self, *args, **kwargs):
    """The gated subclasses' forward. A foreign hook may hold this bound method long after ``remove()`` restored
    the module's class (accelerate's ``_old_forward``, a diffusers hook, ``m.forward = m.forward``): without a
    site it runs the original class's forward, so such a hook keeps working on the unpatched module."""
    site = self.__dict__.get(SITE_ATTR)
    if site is None or not is_gated(self):
        return ungated_forward(self)(*args, **kwargs)
    return site.call(self, args, kwargs)


# A bound method pickles as getattr(module, __name__): name it after the attribute it lives under.
_gated_forward.__name__ = "forward"
_gated_forward._accelpatch_gated = True

_FORWARD_PREFIX = "_gated_forward_of_"
_FORWARDS: dict[str, Callable] = {}


def _forward_name(original: type) -> str:
    """A dot-free module attribute name that says which class's gated forward it is (pickle looks functions up
    by module and qualified name, and splits that name at dots)."""
    where = f"{original.__module__}:{original.__qualname__}".encode()
    return _FORWARD_PREFIX + base64.urlsafe_b64encode(where).decode().rstrip("=")


def _forward_for(original: type) -> Callable:
    """The gated forward of ``original``'s gated classes: :func:`_gated_forward` under the original forward's
    signature. diffusers reads parameters by name from ``inspect.signature(type(module).forward)`` (its cache
    hooks' block registry, its context-parallel split hooks): they must see ``hidden_states``, not ``*args``."""
    name = _forward_name(original)
    forward = _FORWARDS.get(name)
    if forward is None:
        forward = types.FunctionType(_gated_forward.__code__, _gated_forward.__globals__, "forward")
        forward.__qualname__ = name  # found again by module __getattr__ below, in any process
        forward.__doc__ = _gated_forward.__doc__
        forward.__signature__ = inspect.signature(original.forward)
        forward._accelpatch_gated = True
        forward = _FORWARDS.setdefault(name, forward)
    return forward


def __getattr__(name: str):
    """Module attributes ``_gated_forward_of_<class>``: a pickled reference to a gated forward is resolved here,
    also in a process that has not patched that class yet."""
    if not name.startswith(_FORWARD_PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    encoded = name[len(_FORWARD_PREFIX):]
    module_name, _, qualname = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode().partition(":")
    original = importlib.import_module(module_name)
    for part in qualname.split("."):
        original = getattr(original, part)
    return _forward_for(original)


def is_gated_forward(function: Any, module: torch.nn.Module) -> bool:
    """True when ``function`` is the gated forward bound to ``module`` (as a hook that captured it holds it)."""
    return (getattr(getattr(function, "__func__", None), "_accelpatch_gated", False)
            and getattr(function, "__self__", None) is module)


def _new_gated(original: type, fusion_names, defined_in=None):
    """Unpickling/deepcopy constructor of a gated module (its state is restored afterwards by the module). Works
    in a fresh process: each fusion is found by name, importing the module that defines it if need be. (A pickle
    from before stacked sites names one fusion as a string.)"""
    if isinstance(fusion_names, str):
        fusion_names, defined_in = (fusion_names,), (defined_in,)
    fusions = tuple(fusion_by_name(name, where) for name, where in zip(fusion_names, defined_in))
    return object.__new__(gated_class(original, fusions))


def _gated_reduce_ex(self, protocol):
    reduced = object.__reduce_ex__(self, protocol)
    cls = type(self)
    fusions = [fusion_by_name(name) for name in cls._accelpatch_fusion_names]
    return (_new_gated, (cls._accelpatch_original_class, tuple(f.name for f in fusions),
                         tuple(f.defined_in for f in fusions))) + tuple(reduced[2:])


_GATED_METACLASSES: dict[type, type] = {}


def _gated_class_by_names(original: type, fusion_names: tuple, defined_in: tuple) -> type:
    """Unpickling of a gated *class* (an object that holds ``type(module)``, like diffusers' block registry
    metadata in a cache hook): rebuilt from the original class and the fusions' names."""
    return gated_class(original, tuple(fusion_by_name(n, d) for n, d in zip(fusion_names, defined_in)))


def _reduce_gated_class(cls: type):
    fusions = [fusion_by_name(name) for name in cls._accelpatch_fusion_names]
    return _gated_class_by_names, (cls._accelpatch_original_class, tuple(f.name for f in fusions),
                                   tuple(f.defined_in for f in fusions))


def _gated_class_repr(cls: type) -> str:
    """A gated class as messages print it (diffusers' "Model class {cls} not registered", a user's ``type(m)``): the
    real diffusers class and that accelpatch wrapped it; its own name exists in no diffusers module."""
    original = getattr(cls, "_accelpatch_original_class", None)
    if original is None:
        return type.__repr__(cls)
    return f"<class '{original.__module__}.{original.__qualname__}', wrapped by accelpatch as {cls.__qualname__}>"


def _metaclass_for(original: type) -> type:
    """A metaclass deriving from ``original``'s, registered with copyreg so that a gated class pickles by what it
    is made of (it has no importable name of its own)."""
    meta = type(original)
    gated_meta = _GATED_METACLASSES.get(meta)
    if gated_meta is None:
        gated_meta = type(f"Gated{meta.__name__}", (meta,), {"__module__": __name__, "__repr__": _gated_class_repr})
        copyreg.pickle(gated_meta, _reduce_gated_class)
        _GATED_METACLASSES[meta] = gated_meta
    return gated_meta


def gated_class(original: type, fusions) -> type:
    """The gated subclass of ``original`` for ``fusions`` (one fusion, or the tuple of those stacked on one module,
    highest tier first); made once, then cached."""
    fusions = (fusions,) if isinstance(fusions, QualityGatedFusion) else tuple(fusions)
    key = (original, tuple(f.name for f in fusions))
    with _GATED_LOCK:
        cls = _GATED_CLASSES.get(key)
        if cls is None:
            kinds = ", ".join(f"{f.name} ({f.tier} tier)" for f in fusions)
            namespace = {
                "__module__": original.__module__,
                "__doc__": f"{original.__name__} gated by accelpatch's {kinds}.",
                "forward": _forward_for(original),
                "_accelpatch_original_class": original,
                "_accelpatch_fusion_names": key[1],
                "__reduce_ex__": _gated_reduce_ex,
            }
            for fusion in fusions:
                namespace[fusion.enabled_attr] = _enabled_property(fusion)
            cls = _metaclass_for(original)(f"Gated{original.__name__}", (original,), namespace)
            cls.__qualname__ = f"Gated{original.__qualname__}"
            _GATED_CLASSES[key] = cls
        return cls


def is_gated(module: torch.nn.Module) -> bool:
    return "_accelpatch_original_class" in type(module).__dict__
