"""The tiny offline LTX2Pipeline (accelpatch.testing.tiny_ltx2_pipeline): it runs end to end on CPU (video and
audio), a dense stand-in for the Sol-Attn op gives the reference through the whole pipeline and a one-element error
in it is seen in the output, and transformers the tiny components cannot feed are refused. Seeded builds, the tiers'
bits (frames and audio), sol_attn's dense steps and sparse run, remove(): tests/test_family_contract.py, as for every
family."""
import pytest
import torch

from accelpatch.testing import ltx2_pipeline_call_kwargs, tiny_ltx2_pipeline

from _sol_attn_models import all_equal
from _tiny_pipeline_checks import PipelineCase, dense_kernel, high_with_kernel, run

# 2 steps, one CFG batch of 2 per step: 2 calls of each video self-attention site
CASE = PipelineCase(build=lambda seed=0: tiny_ltx2_pipeline(seed=seed), call_kwargs=ltx2_pipeline_call_kwargs,
                    outputs=lambda out: (out.frames, out.audio), sol_kind="ltx2_sol_attn", sol_calls=2)


@pytest.fixture(scope="module")
def pipe_and_reference():
    torch.set_num_threads(1)
    pipe = CASE.build()
    return pipe, run(CASE, pipe)


def test_runs_end_to_end_with_video_and_audio(pipe_and_reference):
    pipe, (frames, audio) = pipe_and_reference
    # 7 frames of 32 x 32 RGB; stereo audio from the vocoder
    assert frames.shape == (1, 7, 3, 32, 32) and frames.dtype == torch.float32
    assert audio.shape[:2] == (1, pipe.vocoder.config.out_channels) and audio.shape[2] > 0
    assert torch.isfinite(frames).all() and torch.isfinite(audio).all()
    assert 0 <= frames.min() and frames.max() <= 1 and frames.std() > 0 and audio.std() > 0
    other = pipe(**ltx2_pipeline_call_kwargs(prompt="a cat sleeping"))  # the byte tokenizer tells prompts apart
    assert not torch.equal(other.frames, frames)


def test_a_dense_stand_in_gives_the_reference_and_a_wrong_kernel_is_caught(pipe_and_reference, monkeypatch):
    pipe, reference = pipe_and_reference
    assert all_equal(high_with_kernel(CASE, pipe, monkeypatch, dense_kernel()), reference)
    wrong = high_with_kernel(CASE, pipe, monkeypatch, dense_kernel(perturb=True))
    assert not torch.equal(wrong[0], reference[0]) and not torch.equal(wrong[1], reference[1])


def test_transformers_the_tiny_components_cannot_feed_are_refused_with_the_reason():
    from accelpatch.testing import LTX2_3_TINY_CONFIG, LTX2_TINY_CONFIG

    with pytest.raises(ValueError, match="cross_attn_mod"):
        tiny_ltx2_pipeline(transformer_config=LTX2_3_TINY_CONFIG)
    with pytest.raises(ValueError, match="gives 4 audio channels .* audio_in_channels=8"):
        tiny_ltx2_pipeline(transformer_config={**LTX2_TINY_CONFIG, "audio_in_channels": 8})
