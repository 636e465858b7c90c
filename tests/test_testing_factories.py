"""The offline tiny-model factories in accelpatch.testing: shapes, determinism, layouts, pipelines."""
import subprocess
import sys

import pytest
import torch

from accelpatch import testing as T


def _capture_forward_kwargs(model):
    """Record the kwargs of every forward of ``model``; returns (calls, handle)."""
    calls = []

    def hook(module, args, kwargs):
        calls.append((args, dict(kwargs)))

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_import_accelpatch_stays_light():
    code = (
        "import sys, accelpatch; "
        "assert 'accelpatch.testing' not in sys.modules; "
        "import accelpatch.testing; "
        "assert 'diffusers' not in sys.modules, 'accelpatch.testing must import diffusers lazily'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------------------ SanaVideo


@pytest.fixture(scope="module")
def sana():
    return T.tiny_sana_video_transformer()


def test_sana_forward_shape_and_mask(sana):
    inputs = T.sana_video_transformer_inputs(sana, batch_size=2, with_mask=True)
    assert inputs["encoder_attention_mask"].tolist() == [[1] * 6, [1] * 5 + [0]]
    assert inputs["hidden_states"].shape == (2, 16, 3, 8, 8)
    assert inputs["encoder_hidden_states"].shape == (2, 6, 8)
    assert torch.all((inputs["timestep"] >= 0) & (inputs["timestep"] <= 1000))
    with torch.no_grad():
        out = sana(**inputs).sample
    assert out.shape == inputs["hidden_states"].shape
    assert torch.isfinite(out).all()


def test_sana_determinism(sana):
    inputs = T.sana_video_transformer_inputs(sana)
    assert all(torch.equal(a, b) for a, b in zip(inputs.values(), T.sana_video_transformer_inputs(sana).values()))
    same = T.tiny_sana_video_transformer(seed=0)
    other = T.tiny_sana_video_transformer(seed=1)
    with torch.no_grad():
        ref = sana(**inputs).sample
        assert torch.equal(ref, same(**inputs).sample)
        assert not torch.equal(ref, other(**inputs).sample)
    different_inputs = T.sana_video_transformer_inputs(sana, seed=1)
    assert not torch.equal(inputs["hidden_states"], different_inputs["hidden_states"])


def test_sana_release_like_and_overrides():
    model = T.tiny_sana_video_transformer(T.SANA_VIDEO_RELEASE_LIKE_CONFIG, num_layers=1)
    assert model.config.attention_head_dim == 112 and model.config.num_layers == 1
    assert model.transformer_blocks[0].attn1.heads == 2
    inputs = T.sana_video_transformer_inputs(model.config, num_frames=2, height=4, width=6)
    with torch.no_grad():
        assert model(**inputs).sample.shape == (1, 16, 2, 4, 6)
    with pytest.raises(ValueError, match="patch"):
        T.sana_video_transformer_inputs(model, height=5)


def test_sana_bf16_inputs_follow_model():
    model = T.tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = T.sana_video_transformer_inputs(model)
    assert inputs["hidden_states"].dtype == torch.bfloat16
    with torch.no_grad():
        assert model(**inputs).sample.dtype == torch.bfloat16


def test_sana_on_meta_has_no_storage():
    model = T.sana_video_transformer_on_meta()
    params = list(model.parameters())
    assert params and all(p.is_meta for p in params)
    assert all(b.is_meta for b in model.buffers())
    assert model.config.num_layers == 20 and len(model.transformer_blocks) == 20
    assert model.config.num_attention_heads == 20 and model.config.attention_head_dim == 112
    assert sum(p.numel() for p in params) > 1_000_000_000
    small = T.sana_video_transformer_on_meta(num_layers=2, num_attention_heads=4)
    assert len(small.transformer_blocks) == 2 and small.transformer_blocks[0].attn1.heads == 4


@pytest.fixture(scope="module")
def sana_pipe():
    return T.tiny_sana_video_pipeline()


def test_sana_pipeline_call_is_deterministic_and_batches_cfg(sana_pipe):
    calls, handle = _capture_forward_kwargs(sana_pipe.transformer)
    try:
        first = sana_pipe(**T.sana_video_pipeline_call_kwargs()).frames
    finally:
        handle.remove()
    second = sana_pipe(**T.sana_video_pipeline_call_kwargs()).frames
    assert first.shape == (1, 9, 3, 32, 32)
    assert first.min() >= 0 and first.max() <= 1
    assert torch.equal(first, second)
    assert len(calls) == 2  # 2 steps, CFG batched into one forward each
    assert all(kw["encoder_hidden_states"].shape[0] == 2 for _, kw in calls)
    other = sana_pipe(**T.sana_video_pipeline_call_kwargs(seed=1)).frames
    assert not torch.equal(first, other)


# ------------------------------------------------------------------------------------ MiniMax-H3


@pytest.fixture(scope="module")
def h3():
    return T.tiny_minimax_h3_transformer()


def _check_layout_consistency(inputs):
    seq = inputs["position_ids"].shape[0]
    tags = inputs["token_tags"]
    text, audio, video = inputs["text_indices"], inputs["audio_indices"], inputs["video_indices"]
    assert inputs["position_ids"].shape == (seq, 3) and inputs["position_ids"].is_floating_point()
    assert tags.shape == inputs["timestep_indices"].shape == (seq,)
    assert torch.equal(torch.cat([text, audio, video]).sort().values, torch.arange(seq))
    assert torch.all(tags[text] == 1) and torch.all(tags[audio] == 2) and torch.all(tags[video] == 0)
    assert torch.all((inputs["timestep"] >= 0) & (inputs["timestep"] <= 1))
    ti = inputs["timestep_indices"]
    assert ti.min() >= 0 and ti.max() < inputs["timestep"].numel()
    assert inputs["hidden_states"].shape[1] == video.numel()
    assert inputs["audio_hidden_states"].shape[1] == audio.numel()
    assert inputs["encoder_hidden_states"].shape[1] == text.numel()


def test_h3_forward_shapes(h3):
    assert h3.config.attention_head_dim == 128
    inputs = T.minimax_h3_transformer_inputs(h3, batch_size=2)
    _check_layout_consistency(inputs)
    with torch.no_grad():
        out = h3(**inputs)
    assert out.sample.shape == inputs["hidden_states"].shape == (2, 12, 16)
    assert out.audio_sample.shape == inputs["audio_hidden_states"].shape == (2, 8, 8)


def test_h3_default_layout_facts(h3):
    inputs = T.minimax_h3_transformer_inputs(h3, num_text=6, num_audio=8, video_frames=3, height=4, width=4)
    layout = T.minimax_h3_layout(inputs)
    assert layout == T.MiniMaxH3Layout(
        sequence_length=26, num_text=6, num_audio=8, num_video=12, prefix_rows=14, video_start=14
    )
    assert torch.equal(inputs["text_indices"], torch.arange(6))
    assert torch.equal(inputs["audio_indices"], torch.arange(6, 14))
    assert torch.equal(inputs["token_tags"][: layout.prefix_rows] != 0, torch.ones(14, dtype=torch.bool))
    # Text positions run along t; audio and video start the media clock at num_text.
    pos = inputs["position_ids"]
    assert torch.equal(pos[:6, 0], torch.arange(6, dtype=pos.dtype))
    assert pos[6, 0] == 6 and pos[14, 0] == 6
    # Video and text rows share the video timestep; audio rows have their own.
    ts = inputs["timestep"][inputs["timestep_indices"]]
    assert torch.all(ts[:6] == 0.5) and torch.all(ts[6:14] == 0.7) and torch.all(ts[14:] == 0.5)


def test_h3_large_layouts_are_cheap_and_consistent(h3):
    big = T.minimax_h3_transformer_inputs(T.MINIMAX_H3_MEDIUM_CONFIG, num_text=64, num_audio=1024, num_video=7168)
    _check_layout_consistency(big)
    layout = T.minimax_h3_layout(big)
    assert layout.sequence_length == 8256 and layout.prefix_rows == 1088 and layout.num_video == 7168
    mid = T.minimax_h3_transformer_inputs(h3, num_text=16, num_audio=256, num_video=1000)
    assert T.minimax_h3_layout(mid).sequence_length == 1272
    with torch.no_grad():
        out = h3(**mid)
    assert out.sample.shape == mid["hidden_states"].shape and torch.isfinite(out.sample).all()


def test_h3_shuffled_layout_is_a_consistent_permutation(h3):
    ref = T.minimax_h3_transformer_inputs(h3)
    shuffled = T.minimax_h3_transformer_inputs(h3, layout="shuffled")
    _check_layout_consistency(shuffled)
    layout = T.minimax_h3_layout(shuffled)
    assert layout.prefix_rows is None and layout.num_text == 6
    with torch.no_grad():
        a, b = h3(**ref), h3(**shuffled)
    # Attention is permutation-equivariant, so the same rows give the same outputs.
    torch.testing.assert_close(a.sample, b.sample, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.audio_sample, b.audio_sample, atol=1e-5, rtol=1e-5)


def test_h3_determinism(h3):
    inputs = T.minimax_h3_transformer_inputs(h3)
    with torch.no_grad():
        ref = h3(**inputs).sample
        assert torch.equal(ref, T.tiny_minimax_h3_transformer(seed=0)(**inputs).sample)
        assert not torch.equal(ref, T.tiny_minimax_h3_transformer(seed=1)(**inputs).sample)
        assert torch.equal(ref, h3(**T.minimax_h3_transformer_inputs(h3)).sample)


def test_h3_configs_and_bf16_keeps_fp32_modules():
    tiny = T.tiny_minimax_h3_transformer(T.MINIMAX_H3_TINY_CONFIG)
    assert tiny.config.attention_head_dim == 16
    model = T.tiny_minimax_h3_transformer(dtype=torch.bfloat16, num_layers=1)
    assert model.proj_in.weight.dtype == torch.float32 and model.rope.inv_freq.dtype == torch.float32
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    inputs = T.minimax_h3_transformer_inputs(model)
    assert inputs["hidden_states"].dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).sample).all()
    with pytest.raises(ValueError, match="audio_channels"):
        T.minimax_h3_transformer_inputs(model, num_audio=7)


@pytest.fixture(scope="module")
def h3_pipe():
    return T.tiny_minimax_h3_pipeline()


def test_h3_pipeline_call_is_deterministic_and_packs_text_audio_video(h3_pipe):
    calls, handle = _capture_forward_kwargs(h3_pipe.transformer)
    try:
        state = h3_pipe(**T.minimax_h3_pipeline_call_kwargs(pipeline=h3_pipe))
    finally:
        handle.remove()
    videos = state.get("videos")
    assert videos.shape == (1, 124, 3, 32, 32)
    assert videos.min() >= 0 and videos.max() <= 1
    again = h3_pipe(**T.minimax_h3_pipeline_call_kwargs(pipeline=h3_pipe), output="videos")
    assert torch.equal(videos, again)
    assert len(calls) == 2  # num_inference_steps=3 runs 2 forwards
    layout = T.minimax_h3_layout(calls[0][1])
    assert layout == T.MiniMaxH3Layout(
        sequence_length=456, num_text=5, num_audio=414, num_video=37, prefix_rows=419, video_start=419
    )
