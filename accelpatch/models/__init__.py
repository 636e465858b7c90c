"""The supported models, one package per family (``accelpatch.models.<family>``): each holds its adapter (the
model's site table: which module, which fast path, which tier), its lossless fused paths and its ``high`` paths;
SANA-Video 2.0's own model code is under its family. :mod:`.registry` finds a model's family. Importing this package
imports neither torch nor diffusers; ``ADAPTERS`` and ``find_adapter`` are imported on first use."""
from accelpatch._lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"ADAPTERS": f"{__name__}.registry", "find_adapter": f"{__name__}.registry"})
