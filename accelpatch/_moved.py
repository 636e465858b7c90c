"""Old import paths of moved modules, kept for one release: the old name becomes the new module itself (one module
object, so state and monkeypatching are shared), with a DeprecationWarning naming the new path."""
import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make ``old`` (the module being imported) the module ``new``; called from the old path's stub."""
    warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
