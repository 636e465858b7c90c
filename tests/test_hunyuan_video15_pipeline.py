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


def test_a_saved_tiny_pipeline_loads_with_its_own_sequence_lengths_and_gives_the_same_frames(pipe_and_reference,
                                                                                              tmp_path):
    """diffusers' HunyuanVideo15Pipeline keeps its sequence lengths as attributes ``save_pretrained`` does not
    write: the tiny pipeline (a TinyHunyuanVideo15Pipeline) saves them in its config, so the folder loads, with
    the class's own ``from_pretrained`` and with diffusers' ``DiffusionPipeline`` after the import that offers the
    class, as it was built (diffusers' own class reloads the release's 108/1000/256/729) and makes the same frames."""
    from diffusers import DiffusionPipeline, HunyuanVideo15Pipeline

    from accelpatch.models.hunyuan_video15.pipeline import RELEASE_LENGTHS, TinyHunyuanVideo15Pipeline

    pipe, (frames,) = pipe_and_reference
    built = {name: getattr(pipe, name) for name in RELEASE_LENGTHS}
    assert built != RELEASE_LENGTHS and built["tokenizer_max_length"] == 64
    pipe.save_pretrained(tmp_path)
    index = (tmp_path / "model_index.json").read_text()
    assert '"_class_name": "TinyHunyuanVideo15Pipeline"' in index and '"tokenizer_max_length": 64' in index
    for loader in (TinyHunyuanVideo15Pipeline, DiffusionPipeline):
        again = loader.from_pretrained(tmp_path)
        assert type(again) is TinyHunyuanVideo15Pipeline
        assert {name: getattr(again, name) for name in RELEASE_LENGTHS} == built
        again.set_progress_bar_config(disable=True)
        assert torch.equal(run(CASE, again)[0], frames)
    plain = HunyuanVideo15Pipeline.from_pretrained(tmp_path)  # what the subclass fixes
    assert {name: getattr(plain, name) for name in RELEASE_LENGTHS} == RELEASE_LENGTHS
    with pytest.raises(ValueError, match=r"unknown length 'text_len'; the lengths are prompt_template_encode_start_idx"):
        pipe.set_lengths(text_len=3)
