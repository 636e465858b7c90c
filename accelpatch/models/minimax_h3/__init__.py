"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, RecipeSettings, register

_LAZY = {"MiniMaxH3Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="minimax_h3", name="MiniMax-H3", cli="minimax-h3", adapter=f"{__name__}.adapter:MiniMaxH3Adapter", order=30,
    demo=DemoSettings("minimax-h3", "MINIMAX_H3_MEDIUM_CONFIG", steps=1, rounds=6, seconds=35),
    recipe=RecipeSettings(output=(("output", "videos"),), fp32_cpu_only=True, min_steps=(
        2, "MiniMax-H3's scheduler counts the final sigma 0 as one of the steps, so n steps run n-1 transformer calls "
           "and its scheduler refuses fewer than 2"))))
