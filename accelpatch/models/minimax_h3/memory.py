"""What the memory planner (:mod:`accelpatch.memory.plan`, issue #44) asks of MiniMax-H3 beyond its registered
:class:`~accelpatch.models.families.MemorySettings`, as diffusers 0.42.1's modular pipeline (modular_pipelines/
minimax_h3) does it: its video VAE encodes 17n + 5 frames into 5n + 2 latents, the transformer sees 40 audio latents
per second on 2 channels as rows beside the video, and the default canvas is its own 16:9 one. Imports diffusers
only for the canvas."""
from __future__ import annotations


def release_config(name: str):
    return {}, "diffusers' MiniMaxH3Transformer3DModel defaults (the release: 56 x 128 heads, hidden 5376)"


def transformer_inputs(case) -> dict:
    return dict(batch_size=case.batch, num_text=case.text_tokens, num_audio=case.audio, video_frames=case.frames,
                height=case.height, width=case.width, audio_channels=2)


def frames(n: int) -> int:
    """The pipeline's frames: ``n`` rounded up to 17k + 5."""
    while n % 17 != 5:
        n += 1
    return n


def latent_frames(n: int) -> int:
    return (n - 5) // 17 * 5 + 2


def audio(frames: int, call) -> int:
    """Audio rows: 40 audio latents per second of 24 fps video, on 2 channels."""
    return round(frames / 24 * 40) * 2


def canvas() -> tuple[int, int, int]:
    """The 16:9 canvas (short edge 768, at most 768 x 1344 pixels) and 124 frames."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    return (*resolve_canvas_size(16, 9, 32, 768, 768 * 1344), 124)


def audio_decode(call, model: str, audio: int):
    """The modular pipeline's audio decode after the video's: its mono ``AutoencoderKLMiniMaxH3Audio`` (diffusers'
    defaults: 32 latent channels, 40 latents a second, a BigVGAN-style decoder to 32 kHz) decodes the two stereo
    channels as two rows of ``audio // 2`` latents each."""
    from accelpatch.models.families import AudioDecodeCase

    return AudioDecodeCase("diffusers:AutoencoderKLMiniMaxH3Audio", (), (32, audio // 2),
                           "diffusers' AutoencoderKLMiniMaxH3Audio defaults", batch_rows=2)
