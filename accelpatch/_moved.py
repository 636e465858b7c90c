"""Names reached through a package without importing their module up front: old import paths of moved modules, kept
for one release (the old name becomes the new module itself: one module object, so state and monkeypatching are
shared, with a DeprecationWarning naming the new path), and a package's public names imported on first use."""
import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make ``old`` (the module being imported) the module ``new``; called from the old path's stub."""
    warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)


def lazy_attributes(package: str, table: dict):
    """A module ``__getattr__`` for ``package`` that imports each name of ``table`` (name -> module) on first use:
    the package stays cheap to import (no torch, no diffusers) and its public names are still its attributes."""
    def __getattr__(name: str):
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
