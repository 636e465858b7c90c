"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes

_LAZY = {"MiniMaxH3Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)
