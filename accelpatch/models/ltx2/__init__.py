"""LTX-2 and LTX-2.3 (diffusers ``LTX2VideoTransformer3DModel``): how accelpatch patches it.
:mod:`.adapter` holds the model's site table (which module, which fast path, which tier) and its adapter,
:mod:`.lossless` its lossless fused paths, :mod:`.high` its ``high`` paths. Imported on first use: importing this
package imports neither torch nor diffusers."""
from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import DemoSettings, Family, MemorySettings, VaeDecodeCase, register

_LAZY = {"LTX2Adapter": f"{__name__}.adapter"}

__getattr__ = lazy_attributes(__name__, _LAZY)

register(Family(
    key="ltx2", name="LTX-2", cli="ltx2", adapter=f"{__name__}.adapter:LTX2Adapter", order=60,
    demo=DemoSettings("sol", None, steps=2, rounds=6, outputs=("frames", "audio"), seconds=6),
    diffusers_tests="tests/models/transformers/test_models_transformer_ltx2.py",
    # read from diffusers 0.42.1's pipeline_ltx2.py: audio latents beside the video, CFG for either guidance
    memory=MemorySettings(
        names=("ltx-2", "ltx2"), name_order=50, transformer="diffusers:LTX2VideoTransformer3DModel",
        release_config=f"{__name__}.memory:release_config",
        transformer_inputs=f"{__name__}.memory:transformer_inputs", audio=f"{__name__}.memory:audio",
        guidance_rule=f"{__name__}.memory:guidance", temporal=8, spatial=32, multiple=32, text_tokens=1024,
        text_source="LTX2Pipeline pads the prompt to max_sequence_length 1024", cfg="batch", guidance=3.0,
        size=(512, 768, 121), text_encoder="Gemma 3 and the text connectors",
        text_encoders=f"{__name__}.memory:text_encoders",
        text_stage=f"{__name__}.memory:text_connectors", audio_decode=f"{__name__}.memory:audio_decode",
        vae=VaeDecodeCase("AutoencoderKLLTX2Video", source="diffusers' AutoencoderKLLTX2Video defaults (the LTX-2 "
                           "video VAE)", repeated=("decoder",)), vae_for=f"{__name__}.memory:video_vae")))
