"""The memory plan's audio decode (issue #44): LTX-2's pipeline decodes its audio latents after the video with its
audio VAE and then its vocoder, MiniMax-H3's with its mono audio VAE, the two stereo channels as two rows; planned on
fake tensors it holds what the tiny pipelines' own decodes hold, and at full size it is a stage of the plan (LTX-2.3's,
with its bandwidth-extending vocoder: tests/test_memory_ltx23.py)."""
from __future__ import annotations

import math

import pytest
import torch

from accelpatch.memory.live_bytes import LiveBytes
from accelpatch.memory.plan import memory_plan, trace_audio_decode
from accelpatch.models.families import AudioDecodeCase

LTX2_VOCODER = "diffusers.pipelines.ltx2.vocoder:LTX2Vocoder"


def _config(module) -> tuple:
    return tuple((k, v) for k, v in module.config.items() if not k.startswith("_"))


def _tiny(family: str):
    """(the tiny pipeline, its call kwargs, the audio VAE class, the vocoder class or None) of ``family``."""
    if family == "ltx2":
        from accelpatch.testing import ltx2_pipeline_call_kwargs, tiny_ltx2_pipeline

        return tiny_ltx2_pipeline(), ltx2_pipeline_call_kwargs(), "diffusers:AutoencoderKLLTX2Audio", LTX2_VOCODER
    from accelpatch.testing.minimax_h3 import minimax_h3_pipeline_call_kwargs, tiny_minimax_h3_pipeline

    pipe = tiny_minimax_h3_pipeline()
    return pipe, minimax_h3_pipeline_call_kwargs(pipeline=pipe), "diffusers:AutoencoderKLMiniMaxH3Audio", None


@pytest.mark.parametrize("family", ["ltx2", "minimax-h3"])
def test_the_planned_audio_decode_holds_what_the_tiny_pipelines_own_decode_holds(family, monkeypatch):
    """Measured inside the pipeline's own call (diffusers' LTX2Pipeline, MiniMax-H3's modular pipeline), from its
    audio VAE's decode to the end of its vocoder (LTX-2) or of the decode (MiniMax-H3), the latents, made before,
    counted as the plan counts them; against the fake trace of the same classes, configurations and shape."""
    torch.set_num_threads(1)
    pipe, kwargs, vae_class, vocoder_class = _tiny(family)
    live, seen = LiveBytes(), {}
    decode = pipe.audio_vae.decode

    def finish():
        live.__exit__(None, None, None)
        seen["done"] = True

    def measured_decode(latents, *args, **kwargs):
        seen["latents"] = (tuple(latents.shape), latents.dtype)
        live.__enter__()
        try:
            return decode(latents, *args, **kwargs)
        finally:
            if vocoder_class is None:
                finish()

    monkeypatch.setattr(pipe.audio_vae, "decode", measured_decode)
    if vocoder_class is not None:
        vocode = pipe.vocoder.forward

        def measured_vocoder(*args, **kwargs):
            try:
                return vocode(*args, **kwargs)
            finally:
                finish()

        monkeypatch.setattr(pipe.vocoder, "forward", measured_vocoder)
    with torch.no_grad():
        pipe(**kwargs)
    shape, dtype = seen["latents"]
    assert seen.get("done") and dtype == torch.float32, seen
    latent_bytes = math.prod(shape) * 4
    measured = live.peak + latent_bytes
    assert live.peak > 2 * latent_bytes, (live.peak, latent_bytes)  # what the decode makes, not the latents alone
    rows = 2 if family == "minimax-h3" else 1  # MiniMax-H3's mono VAE: the stereo channels as rows
    case = AudioDecodeCase(vae_class, _config(pipe.audio_vae), shape[1:], "the tiny pipeline's",
                           vocoder=vocoder_class,
                           vocoder_config=_config(pipe.vocoder) if vocoder_class else (), batch_rows=rows)
    weights, planned = trace_audio_decode(case, batch=shape[0] // rows, dtype="float32")
    modules = [pipe.audio_vae, *([pipe.vocoder] if vocoder_class else [])]
    assert weights >= sum(p.numel() * 4 for m in modules for p in m.parameters())
    assert abs(planned - measured) <= 0.10 * measured, (planned, measured)


def test_a_fake_trace_of_the_audio_decode_equals_its_real_run():
    from accelpatch.testing.ltx2 import LTX2_TINY_AUDIO_VAE_CONFIG, LTX2_TINY_VOCODER_CONFIG

    torch.set_num_threads(1)
    case = AudioDecodeCase("diffusers:AutoencoderKLLTX2Audio", tuple(LTX2_TINY_AUDIO_VAE_CONFIG.items()), (2, 50, 2),
                           "tiny", vocoder=LTX2_VOCODER, vocoder_config=tuple(LTX2_TINY_VOCODER_CONFIG.items()))
    assert trace_audio_decode(case, batch=2, dtype="float32") == trace_audio_decode(case, batch=2, dtype="float32",
                                                                                    fake=False)


def test_ltx2_plans_its_audio_decode_after_the_video_and_ltx23_its_own_vocoder():
    """At full size (diffusers' defaults: LTX-2.0's audio VAE, 53M parameters, and vocoder, 56M) the audio decode is
    a stage: its weights count with every component on the device; it scales with the clip's duration (twice the
    frames: the same weights, about twice the activations); LTX-2.3's decode ends in the BWE vocoder."""
    from accelpatch.models.ltx2.memory import audio, audio_decode

    plan = memory_plan("ltx2-distilled-8step", height=256, width=256, frames=121, patched=False)
    names = [stage.name for stage in plan.stages]
    assert names[-2:] == ["VAE decode", "audio decode"], names
    stage = plan.stages[-1]
    assert stage.planned and 0.19 * 2 ** 30 < stage.weights < 0.22 * 2 ** 30, stage  # bf16
    assert "audio decode: diffusers' AutoencoderKLLTX2Audio and LTX2Vocoder defaults (LTX-2.0); latents 1 x 8 x 126 " \
           "x 16" in plan.table()
    model = "rootonchair/ltx-2-19b-distilled"
    assert audio(121, {}) == 126 and trace_audio_decode(audio_decode({}, model, 126), batch=1,
                                                        dtype=torch.bfloat16) == (stage.weights, stage.activations)
    longer = trace_audio_decode(audio_decode({}, model, audio(241, {})), batch=1, dtype=torch.bfloat16)
    assert longer[0] == stage.weights and longer[1] > 1.9 * stage.activations, (longer, stage)
    assert audio_decode({}, "lightricks/ltx-2.3-22b", 126).vocoder.endswith(":LTX2VocoderWithBWE")


def test_minimax_h3_plans_its_audio_decode_two_stereo_rows():
    """diffusers' AutoencoderKLMiniMaxH3Audio defaults (151M parameters), 40 latents a second per channel: 124 frames
    at 24 fps are 207 latents on each of the two rows."""
    plan = memory_plan("minimax-h3-turbo-5step", height=320, width=320, frames=124, patched=False)
    stage = plan.stages[-1]
    assert stage.name == "audio decode" and stage.planned and 0.55 * 2 ** 30 < stage.weights < 0.58 * 2 ** 30, stage
    assert "latents 2 x 32 x 207" in plan.table(), plan.table()
