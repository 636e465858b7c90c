"""Old import paths of moved modules, kept for one release, and a package's public names imported on first use.

Issue #33 reorganised the package by feature (``core``, ``lossless``, ``sol_attn``, ``step_cache``, ``models``,
``eval``). :data:`MOVED` is the one table of old module paths; :class:`OldPathFinder` (put on ``sys.meta_path`` by
``import accelpatch``; it answers for ``accelpatch.*`` names no file has, nothing else) imports an old path as the
new module itself (one module object: state and monkeypatching shared) with a DeprecationWarning naming the new
path. An old package whose new home is a plain module (``accelpatch.backends``) imports as a small package that
reads its names from that module, so its old submodules still import below it.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Optional

#: old package -> new package: a module below an old package that :data:`MOVED` does not name keeps its name below
#: the new one (``accelpatch.adapters.sana_video.block`` -> ``accelpatch.models.sana_video.block``)
MOVED_PACKAGES = {
    "accelpatch.adapters": "accelpatch.models",
    "accelpatch.ops.fused": "accelpatch.lossless.kernels",
    "accelpatch.modeling.sana_video2": "accelpatch.models.sana_video2.modeling",
}
_FAMILIES = ("sana_video", "sana_video2", "minimax_h3", "wan", "hunyuan_video15", "ltx2")

#: old module path -> new module path
MOVED = {
    # the thin core
    **{f"accelpatch.{name}": f"accelpatch.core.{name}" for name in (
        "patcher", "gate", "call_context", "tiers", "steps", "errors", "reporting", "block_registry", "model_hooks",
        "model_state", "captured_forwards", "apply_options", "restated", "restated_fingerprints", "torch_compat")},
    "accelpatch.sites": "accelpatch.core.sites",
    "accelpatch.sites.base": "accelpatch.core.sites",
    "accelpatch.backends": "accelpatch.core.backends",
    "accelpatch.ops.triton_aot": "accelpatch.core.triton_aot",
    # the lossless fused ops
    "accelpatch.verify": "accelpatch.lossless.verify",
    "accelpatch.fused_ops": "accelpatch.lossless.ops",
    "accelpatch.ops.fused": "accelpatch.lossless.kernels",
    "accelpatch.sites.fused_swiglu": "accelpatch.lossless.swiglu",
    # Sol-Attn in one package
    "accelpatch.ops": "accelpatch.sol_attn.op",
    "accelpatch.backends.sol_attn": "accelpatch.sol_attn.config",
    "accelpatch.backends.attention_backend": "accelpatch.sol_attn.diffusers_backend",
    "accelpatch.backends.attention_registry": "accelpatch.sol_attn.registration",
    "accelpatch.sites.sol_attention": "accelpatch.sol_attn.sites",
    "accelpatch.adapters.sol_attn_adapter": "accelpatch.sol_attn.adapter",
    # the models, one package per family: its adapter and its lossless paths
    **MOVED_PACKAGES,
    "accelpatch.adapters.base": "accelpatch.core.adapter",
    **{f"accelpatch.adapters.{family}": f"accelpatch.models.{family}.adapter" for family in _FAMILIES},
    **{f"accelpatch.adapters.{family}.fused": f"accelpatch.models.{family}.lossless" for family in _FAMILIES
       if family != "sana_video"},
    "accelpatch.ops.gemm": "accelpatch.models.sana_video.gemm",
    "accelpatch.modeling": "accelpatch.models.sana_video2.modeling",
    "accelpatch.modeling.sana_video2": "accelpatch.models.sana_video2.modeling",
    "accelpatch.modeling.sana_video2_release": "accelpatch.models.sana_video2.release",
    # the evaluation tools
    **{f"accelpatch.tools.{name}": f"accelpatch.eval.{name}" for name in (
        "validate", "bench", "tune", "tune_space", "tune_search", "tune_plot", "metrics", "audio_metrics", "plots",
        "stats", "candidates", "preflight", "pipelines", "_report_text", "recipe_cli")},
}


def new_path(old: str):
    """The module an old path now names (None when ``old`` is not an old path)."""
    if old in MOVED:
        return MOVED[old]
    head, _, tail = old.rpartition(".")
    while head:
        if head in MOVED_PACKAGES:
            return f"{MOVED_PACKAGES[head]}.{old[len(head) + 1:]}"
        head, _, _ = head.rpartition(".")
    return None


def _was_package(old: str) -> bool:
    return old in MOVED_PACKAGES or old in _OLD_PACKAGES or any(name.startswith(old + ".") for name in MOVED)


#: old packages that :data:`MOVED` maps to a module (their submodules live on below the new package)
_OLD_PACKAGES = {f"accelpatch.adapters.{family}" for family in _FAMILIES}


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec):
        warnings.warn(f"{self.old} moved to {self.new}; import it from there (the old path goes in the next "
                      "release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        if hasattr(module, "__path__") or not _was_package(self.old):
            self.spec = module.__spec__
            return module
        package = types.ModuleType(self.old, module.__doc__)  # an old package whose home is now a module
        package.__path__ = []
        package.__getattr__ = lambda name: getattr(module, name)
        return package

    def exec_module(self, module) -> None:
        if module.__name__ != self.old:  # the new module itself: keep its own spec (the import system set the old one)
            module.__spec__ = self.spec


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds every old path of :data:`MOVED` (and the submodules below one) as its new module."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("accelpatch."):
            return None
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new), is_package=_was_package(fullname))


def install() -> None:
    """Put :class:`OldPathFinder` first on ``sys.meta_path`` (once): old paths win over the path finder, which would
    find nothing for them."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())


def lazy_attributes(package: str, table: dict, *, moved: Optional[dict] = None, subpackages: tuple = ()):
    """A module ``__getattr__`` for ``package`` that imports each name of ``table`` (name -> module) on first use:
    the package stays cheap to import (no torch, no diffusers) and its public names are still its attributes. A name
    of ``moved`` (name -> its new home) is found there with a DeprecationWarning naming the home, at every use. A
    submodule is an attribute too, imported on first use (``accelpatch.models.sana_video2.modeling`` after
    ``import accelpatch``, as an eagerly imported package would have it)."""
    namespace = sys.modules[package].__dict__ if package in sys.modules else None
    moved = moved or {}

    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            if namespace is not None:
                namespace[name] = value  # found once: later reads are plain attribute reads
            return value
        if name in moved:
            warnings.warn(f"{package}.{name} moved to {moved[name]}.{name}; use it from there (the old name goes in "
                          "the next release)", DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(moved[name]), name)
        if name in subpackages or (not name.startswith("_")
                                   and importlib.util.find_spec(f"{package}.{name}") is not None):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def names_moved_to(module: str, new: str):
    """A module ``__getattr__`` for ``module`` that reads a name it no longer defines from ``new`` (imported on first
    use): a family's ``high`` paths left its ``adapter.py`` for ``high.py``, and ``from ...adapter import X`` (or an
    old pickle naming ``adapter.X``) still finds them, the same objects."""
    def __getattr__(name: str):
        if not name.startswith("__"):
            target = importlib.import_module(new)
            if name in vars(target):
                return vars(target)[name]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
