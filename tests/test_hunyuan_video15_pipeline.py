"""The tiny offline HunyuanVideo15Pipeline (accelpatch.testing.tiny_hunyuan_video15_pipeline): it runs end to end
on CPU (both text encoders, CFG, the VAE), a one-element error in the Sol-Attn op is seen in the pipeline's frames,
and a transformer it cannot feed is refused. Seeded builds, the tiers' bits, sol_attn's dense steps and sparse run,
remove(): tests/test_family_contract.py, as for every family."""
import pytest
import torch

from accelpatch.testing import hunyuan_video15_pipeline_call_kwargs, tiny_hunyuan_video15_pipeline

from _tiny_pipeline_checks import PipelineCase, dense_kernel, high_with_kernel, run

# 2 steps, CFG as two forwards of batch 1 per step (diffusers' guider): 4 calls of each joint-attention site
CASE = PipelineCase(build=lambda seed=0: tiny_hunyuan_video15_pipeline(seed=seed),
                    call_kwargs=hunyuan_video15_pipeline_call_kwargs, outputs=lambda out: (out.frames,),
                    sol_kind="hunyuan_video15_sol_attn", sol_calls=4)


@pytest.fixture(scope="module")
def pipe_and_reference():
    torch.set_num_threads(1)
    pipe = CASE.build()
    return pipe, run(CASE, pipe)


def test_runs_end_to_end_with_both_text_encoders(pipe_and_reference):
    pipe, (frames,) = pipe_and_reference
    assert frames.shape == (1, 7, 3, 64, 64) and frames.dtype == torch.float32  # 7 frames of 64 x 64 RGB
    assert torch.isfinite(frames).all() and 0 <= frames.min() and frames.max() <= 1 and frames.std() > 0
    # the Qwen stream is the prompt after the system prefix the pipeline crops, and the quoted word reaches ByT5
    embeds, mask, glyph, glyph_mask = pipe.encode_prompt(hunyuan_video15_pipeline_call_kwargs()["prompt"])
    text = 'a tiny test video of a sign that says "hello"<|im_end|>\n<|im_start|>assistant\n'
    assert mask.sum() == len(pipe.tokenizer(text)["input_ids"]) and mask[0, 0] == 1
    assert glyph_mask.sum() == len(pipe.tokenizer_2('Text "hello". ')["input_ids"]) and glyph.abs().sum() > 0
    other = pipe(**hunyuan_video15_pipeline_call_kwargs(prompt="a cat sleeping")).frames
    assert not torch.equal(other, frames)


def test_a_wrong_kernel_is_caught(pipe_and_reference, monkeypatch):
    pipe, reference = pipe_and_reference
    dense = high_with_kernel(CASE, pipe, monkeypatch, dense_kernel())
    # the unmasked valid prefix is the model's masked attention up to rounding (SDPA with and without a mask)
    torch.testing.assert_close(dense[0], reference[0], atol=1e-5, rtol=0)
    wrong = high_with_kernel(CASE, pipe, monkeypatch, dense_kernel(perturb=True))
    assert not torch.equal(wrong[0], dense[0])


def test_a_transformer_the_pipeline_cannot_feed_is_refused_with_the_reason():
    from accelpatch.testing import HUNYUAN_VIDEO15_SOL_CONFIG

    with pytest.raises(ValueError, match=r"in_channels=4 must be 2 \* out_channels \+ 1 = 9"):
        tiny_hunyuan_video15_pipeline(transformer_config=HUNYUAN_VIDEO15_SOL_CONFIG)
    with pytest.raises(ValueError, match="text_len=0 must be at least 1"):
        tiny_hunyuan_video15_pipeline(text_len=0)
