"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, MemorySettings, RecipeSettings, VaeDecodeCase, register

_LAZY = {"MiniMaxH3Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="minimax_h3", name="MiniMax-H3", cli="minimax-h3", adapter=f"{__name__}.adapter:MiniMaxH3Adapter", order=30,
    demo=DemoSettings("minimax-h3", "MINIMAX_H3_MEDIUM_CONFIG", steps=1, rounds=6, seconds=35),
    recipe=RecipeSettings(output=(("output", "videos"),), fp32_cpu_only=True, min_steps=(
        2, "MiniMax-H3's scheduler counts the final sigma 0 as one of the steps, so n steps run n-1 transformer calls "
           "and its scheduler refuses fewer than 2")),
    # read from diffusers 0.42.1's modular_pipelines/minimax_h3: its own frame and audio grid and canvas (.memory)
    memory=MemorySettings(
        names=("minimax-h3",), name_order=30, transformer="diffusers:MiniMaxH3Transformer3DModel",
        release_config=f"{__name__}.memory:release_config",
        transformer_inputs=f"{__name__}.memory:transformer_inputs", frames=f"{__name__}.memory:frames",
        latent_frames=f"{__name__}.memory:latent_frames", audio=f"{__name__}.memory:audio", audio_unit="rows",
        audio_decode=f"{__name__}.memory:audio_decode",
        canvas=f"{__name__}.memory:canvas", temporal=4, spatial=16, multiple=32, text_tokens=256,
        text_source="MiniMax-H3 packs the prompt's own tokens (no padding): assumed 256, text_tokens= to change",
        cfg="distilled", guidance=None, size=None,
        text_encoder="Qwen3-VL-32B", text_encoders=f"{__name__}.memory:text_encoders",
        vae=VaeDecodeCase("AutoencoderKLMiniMaxH3", source="diffusers' AutoencoderKLMiniMaxH3 defaults: its ViT "
                           "decoder runs per 256-pixel tile and 17-frame chunk", repeated=("decoder",),
                           tiles_by_default=True))))
