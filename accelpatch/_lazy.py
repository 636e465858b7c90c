"""A package's public names and subpackages imported on first use, so that importing the package stays cheap (no
torch, no diffusers) while its names are still its attributes."""
import importlib
import importlib.util
import sys


def lazy_attributes(package: str, table: dict, *, subpackages: tuple = ()):
    """A module ``__getattr__`` for ``package`` that imports each name of ``table`` (name -> module) on first use. A
    submodule is an attribute too, imported on first use (``accelpatch.models.sana_video2.modeling`` after
    ``import accelpatch``, as an eagerly imported package would have it)."""
    namespace = sys.modules[package].__dict__ if package in sys.modules else None

    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            if namespace is not None:
                namespace[name] = value  # found once: later reads are plain attribute reads
            return value
        if name in subpackages or (not name.startswith("_")
                                   and importlib.util.find_spec(f"{package}.{name}") is not None):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
