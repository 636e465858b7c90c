"""The default tier with the real fused kernels: every model, bit-identical to unpatched diffusers, and the fused ops
really ran (so identity is not identity by absence).

Transformers in fp32 and bf16, batch 1 and 2, with and without text masks, odd latent shapes and non-contiguous
inputs; the tiny pipelines at the default tier. Each case asserts ``torch.equal`` against the unpatched model and
that no signature was declined and some fused op ran."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch import testing as t


def _noncontiguous(x: torch.Tensor) -> torch.Tensor:
    """The same values in a transposed memory layout."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _sana_video(dtype, batch, mask, odd):
    model = t.tiny_sana_video_transformer(dtype=dtype)
    shape = dict(num_frames=1, height=6, width=10) if odd else {}
    return model, t.sana_video_transformer_inputs(model, batch_size=batch, with_mask=mask, seed=batch, **shape)


def _sana_video2(dtype, batch, mask, odd):
    model = t.tiny_sana_video2_transformer(dtype=dtype)
    shape = dict(frames=1, height=5, width=3) if odd else {}
    inputs = t.sana_video2_transformer_inputs(model, batch_size=batch, per_frame_timesteps=mask, seed=batch, **shape)
    return model, inputs


def _minimax_h3(dtype, batch, mask, odd):
    model = t.tiny_minimax_h3_transformer(dtype=dtype)
    shape = dict(num_text=1, num_audio=4, video_frames=2, height=2, width=6) if odd else {}
    return model, t.minimax_h3_transformer_inputs(model, **shape)


MODELS = {"sana_video": _sana_video, "sana_video2": _sana_video2, "minimax_h3": _minimax_h3}


def _check(model, inputs):
    with torch.no_grad():
        expected = model(**inputs).sample
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")  # a declined signature warns
        with torch.no_grad():
            for _ in range(2):  # first sight, then the verified kernels
                assert torch.equal(model(**inputs).sample, expected)
    fusions = accelpatch.report(model).models[0].fusions
    assert not [f for f in fusions if f.declined], [(f.op, f.declined) for f in fusions if f.declined]
    assert sum(f.fused_calls for f in fusions) > 0
    accelpatch.remove(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).sample, expected)


def _cases():
    """(model, dtype, batch, variant, odd shapes): SANA-Video's variant is a text mask, SANA-Video 2.0's per-frame
    timesteps (image-to-video; its batch-2 captions are masked anyway); MiniMax-H3 packs one request per call
    (batch 1, no mask)."""
    for dtype in (torch.bfloat16, torch.float32):
        for odd in (False, True):
            for name in ("sana_video", "sana_video2"):
                for batch in (1, 2):
                    for variant in (False, True):
                        yield name, dtype, batch, variant, odd
            yield "minimax_h3", dtype, 1, False, odd


def _case_id(case):
    name, dtype, batch, variant, odd = case
    return (f"{name}-{str(dtype).removeprefix('torch.')}-b{batch}{'-mask/i2v' if variant else ''}"
            f"{'-odd' if odd else ''}")


@pytest.mark.parametrize("case", list(_cases()), ids=_case_id)
def test_default_tier_is_bit_identical_with_the_fused_kernels_running(case):
    name, dtype, batch, variant, odd = case
    model, inputs = MODELS[name](dtype, batch, variant, odd)
    _check(model, inputs)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_non_contiguous_inputs(name):
    model, inputs = MODELS[name](torch.bfloat16, 1, False, False)
    inputs = {k: _noncontiguous(v) if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.is_floating_point() else v
              for k, v in inputs.items()}
    _check(model, inputs)


def _frames(output):
    return output.frames if hasattr(output, "frames") else output.videos


@pytest.mark.parametrize("name", ["sana_video", "sana_video2", "minimax_h3"])
def test_pipelines_at_the_default_tier_are_bit_identical(name):
    build = {"sana_video": lambda: t.tiny_sana_video_pipeline(seed=2, dtype=torch.bfloat16),
             "sana_video2": lambda: t.tiny_sana_video2_pipeline(seed=2, dtype=torch.bfloat16),
             "minimax_h3": lambda: t.tiny_minimax_h3_pipeline(seed=2)}[name]
    reference_pipe, pipe = build(), build()
    call = {"sana_video": lambda p: t.sana_video_pipeline_call_kwargs(seed=4),
            "sana_video2": lambda p: t.sana_video2_pipeline_call_kwargs(seed=4),
            "minimax_h3": lambda p: t.minimax_h3_pipeline_call_kwargs(pipeline=p, seed=4)}[name]
    expected = _frames(reference_pipe(**call(reference_pipe)))
    accelpatch.apply(pipe)
    assert torch.equal(_frames(pipe(**call(pipe))), expected)
    fusions = accelpatch.report(pipe).models[0].fusions
    assert sum(f.fused_calls for f in fusions) > 0 and not [f for f in fusions if f.declined]


def test_cpu_kernels_false_runs_no_kernel_for_that_model_only():
    """apply(..., cpu_kernels=False): that model's fused ops run diffusers' chains, each call counted with the
    reason, bit-identical; another model in the process still fuses. A non-bool is refused by name."""
    model, inputs = _sana_video(torch.bfloat16, 1, False, False)
    other, other_inputs = _sana_video(torch.bfloat16, 1, False, False)
    with torch.no_grad():
        expected = model(**inputs).sample
    with pytest.raises(ValueError, match="cpu_kernels must be True or False, got 'no'"):
        accelpatch.apply(model, cpu_kernels="no")
    accelpatch.apply(model, cpu_kernels=False)
    accelpatch.apply(other)
    with torch.no_grad():
        assert torch.equal(model(**inputs).sample, expected)
        other(**other_inputs)
    fusions = accelpatch.report(model).models[0].fusions
    assert sum(f.fused_calls for f in fusions) == 0
    reasons = {k for f in fusions for k in f.reference_calls}
    assert reasons and all("switched off for this model" in k or "float32" in k for k in reasons), reasons
    assert sum(f.fused_calls for f in accelpatch.report(other).models[0].fusions) > 0
    accelpatch.remove(model)
    accelpatch.remove(other)
