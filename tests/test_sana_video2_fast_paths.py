"""SANA-Video 2.0's fast paths on CPU through the test-only switch (their guards want CUDA): the BF16 anchor
attention, the linear attention's BF16-operand first GEMM, and Sol-Attn on the anchors; their guards and reasons;
the FP32-anchor options; and the tiny pipeline's quality under each documented setting."""
import warnings

import pytest
import torch
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.sol_attn.config import NOTHING_SKIPPED
from accelpatch.models.sana_video2 import high as sv2_high
from accelpatch.core.patcher import patch_of
from accelpatch.sol_attn.sites import DENSE_LAYER, DENSE_STEP
from accelpatch.testing import (SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO2_TINY_VAE_8X_CONFIG, sana_video2_pipeline_call_kwargs,
                                sana_video2_transformer_inputs, tiny_sana_video2_pipeline, tiny_sana_video2_transformer)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.fixture
def on_cpu():
    with run_fast_paths_on_cpu():
        yield


def _attn_sites(report, layer):
    """(the high site, the lossless site below it) of ``blocks.{layer}.attn``."""
    high, lossless = [s for s in report.sites if s.path == f"blocks.{layer}.attn"]
    assert (high.tier, lossless.tier) == ("high", "lossless")
    return high, lossless


def _bf16_model(**overrides):
    return tiny_sana_video2_transformer(dtype=torch.bfloat16, **overrides)


def _attn_inputs(model, layer, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 72, model.config.hidden_size, generator=g).to(torch.bfloat16)
    attn = model.blocks[layer].attn
    rope = (model.rope_softmax if layer in model.softmax_layer_indices else model.rope_linear)(3, 4, 6, x.device)
    return attn, x, rope


def test_the_bf16_anchor_path_is_the_processor_without_the_fp32_upcast(on_cpu):
    model = _bf16_model()
    attn, x, rope = _attn_inputs(model, 3)
    with torch.no_grad():
        reference_fp32 = attn(x, rope)
        attn.fp32_attention = False
        reference_bf16 = attn(x, rope)  # the original processor, in bf16
        attn.fp32_attention = True
        accelpatch.apply(model, anchor_fp32_steps=0)
        with accelpatch.quality("high"):
            fast = attn(x, rope)
    assert torch.equal(fast, reference_bf16)  # the same function as the processor on BF16 operands
    assert not torch.equal(fast, reference_fp32)
    torch.testing.assert_close(fast.float(), reference_fp32.float(), atol=2e-2, rtol=2e-2)
    high, lossless = _attn_sites(accelpatch.report(model), 3)
    assert high.kind == "sana_video2_softmax_attention" and high.fast_calls == 1
    assert lossless.fast_calls == 0 and lossless.reference_calls == {}  # the high path took the call


def test_the_linear_path_runs_its_first_gemm_on_bf16_operands(on_cpu, monkeypatch):
    model = _bf16_model()
    attn, x, rope = _attn_inputs(model, 0)
    from accelpatch.models.sana_video import gemm

    seen = []
    real = gemm.bmm_bf16_operands

    def spy(a, b):
        seen.append((a.dtype, b.dtype, tuple(a.shape), tuple(b.shape)))
        return real(a, b)

    monkeypatch.setattr(gemm, "bmm_bf16_operands", spy)
    with torch.no_grad():
        reference = attn(x, rope)
        accelpatch.apply(model, anchor_fp32_steps=0)
        with accelpatch.quality("high"):
            fast = attn(x, rope)
    heads, dim = attn.heads, attn.head_dim
    assert seen == [(torch.bfloat16, torch.bfloat16, (2 * heads, dim, 72), (2 * heads, 72, dim))]
    assert fast.dtype == torch.bfloat16
    # On CPU the GEMM runs its exact FP32 emulation: products of BF16 values are exact in FP32.
    torch.testing.assert_close(fast.float(), reference.float(), atol=1e-2, rtol=1e-2)
    high, lossless = _attn_sites(accelpatch.report(model), 0)
    assert high.kind == "sana_video2_linear_attention" and high.fast_calls == 1
    assert lossless.fast_calls == 0 and lossless.reference_calls == {}  # the high path took the call


def _declined(model, layer, x, rope, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(model, anchor_fp32_steps=0, **kwargs)
        with torch.no_grad(), accelpatch.quality("high"):
            model.blocks[layer].attn(x, rope)
    high, lossless = _attn_sites(accelpatch.report(model), layer)
    accelpatch.report(model, reset=True)
    # the call the high path declined went to the lossless site below, which ran it
    assert lossless.fast_calls == 1 and lossless.reference_calls == {} and lossless.fallback_calls == {}
    return high


def test_each_guard_says_why(on_cpu):
    fp32_model = tiny_sana_video2_transformer()
    model = _bf16_model()
    for layer in (0, 3):
        _, x, rope = _attn_inputs(model, layer)
        site = _declined(fp32_model, layer, x.float(), rope)
        assert site.fast_calls == 0 and any("activations are torch.float32" in r for r in site.fallback_calls)
        attn = model.blocks[layer].attn
        attn.fp32_attention = False
        site = _declined(model, layer, x, rope)
        assert site.reference_calls == {sv2_high.FP32_ATTENTION_OFF: 1} and site.fallback_calls == {}
        attn.fp32_attention = True
    accelpatch.remove(model)
    model.blocks[3].attn.set_processor(torch.nn.Identity())  # a processor the fast path does not restate
    with pytest.warns(RuntimeWarning, match="processor is Identity"):
        rep = accelpatch.apply(model)
    high, lossless = _attn_sites(rep, 3)
    assert "processor is Identity, expected SanaVideo2SoftmaxAttnProcessor" in high.reason
    assert "processor is Identity, expected SanaVideo2SoftmaxAttnProcessor" in lossless.reason  # never bypassed
    assert not high.mounted and not lossless.mounted


def test_without_the_switch_the_cpu_is_rejected_at_apply():
    with pytest.warns(RuntimeWarning, match="CUDA is unavailable"):
        rep = accelpatch.apply(_bf16_model())
    high = [s for s in rep.sites if s.tier == "high"]
    assert len(high) == 4 and all(not s.mounted and "CUDA is unavailable" in s.reason for s in high)
    # the lossless sites (4 blocks, 4 attentions) need no CUDA
    assert [s.mounted and s.reason for s in rep.sites if s.tier == "lossless"] == [None] * 8


def test_fp32_anchor_steps_and_layers(on_cpu):
    model = _bf16_model(depth=8, softmax_ratio=0.25)  # anchors 3 and 7
    inputs = sana_video2_transformer_inputs(model, batch_size=1)
    accelpatch.apply(model, anchor_fp32_steps=2, anchor_fp32_layers="7")
    with accelpatch.quality("high"):
        for step in (0, 1, 2, 3):
            with accelpatch.denoising_step(step):
                _forward(model, inputs)
    anchors = {s.path: s for s in accelpatch.report(model).sites if s.kind == "sana_video2_softmax_attention"}
    assert anchors["blocks.3.attn"].fast_calls == 2
    assert anchors["blocks.3.attn"].reference_calls == {sv2_high.FP32_ANCHOR_STEP: 2}
    assert anchors["blocks.7.attn"].fast_calls == 0
    assert anchors["blocks.7.attn"].reference_calls == {sv2_high.FP32_ANCHOR_STEP: 2, sv2_high.FP32_ANCHOR_LAYER: 2}
    with pytest.raises(ValueError, match=r"anchor_fp32_layers names layer\(s\) \[2\] that are not anchor layers .* "
                                         r"its softmax anchors are 3, 7"):
        accelpatch.apply(model, anchor_fp32_layers="2,3")
    with pytest.raises(ValueError, match=r"anchor_fp32_steps must be a number of steps \(an int >= 0\).*got -1"):
        accelpatch.apply(model, anchor_fp32_steps=-1)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['anchor_fp32_step'\].*SANA-Video 2.0: "
                                         r"anchor_fp32_steps, anchor_fp32_layers"):
        accelpatch.apply(model, anchor_fp32_step=2)


def test_fp32_anchor_steps_as_a_fraction_of_the_call(on_cpu):
    """#42: anchor_fp32_steps='25%' keeps FP32 anchors for 1 of 4 steps and 2 of 8; without the call's number of
    steps it keeps FP32 and says why."""
    model = _bf16_model()
    inputs = sana_video2_transformer_inputs(model, batch_size=1)
    accelpatch.apply(model, anchor_fp32_steps="25%")
    with accelpatch.quality("high"):
        for total in (4, 8):
            for step in range(total):
                with accelpatch.denoising_step(step, total=total):
                    _forward(model, inputs)
        with pytest.warns(RuntimeWarning, match="number of denoising steps is unknown"), accelpatch.denoising_step(1):
            _forward(model, inputs)
    high, _ = _attn_sites(accelpatch.report(model), 3)
    assert high.fast_calls == 3 + 6
    assert high.reference_calls == {sv2_high.FP32_ANCHOR_STEP: 1 + 2, sv2_high.ANCHOR_TOTAL_UNKNOWN: 1}
    assert high.fallback_calls == {sv2_high.ANCHOR_TOTAL_UNKNOWN: 1}  # the policy could not apply: a fallback


def test_an_unknown_step_keeps_fp32_anchors_and_says_so(on_cpu, monkeypatch):
    from accelpatch.core import steps

    model = _bf16_model()
    inputs = sana_video2_transformer_inputs(model)
    accelpatch.apply(model, anchor_fp32_steps=3)
    monkeypatch.setattr(steps, "timestep_values", lambda timestep: None)
    with pytest.warns(RuntimeWarning, match="anchor_fp32_steps cannot apply"), accelpatch.quality("high"):
        _forward(model, inputs)
    rep = accelpatch.report(model)
    high, lossless = _attn_sites(rep, 3)
    assert high.fast_calls == 0 and high.fallback_calls == {sv2_high.ANCHOR_STEP_UNKNOWN: 1}
    assert lossless.fast_calls == 1  # the FP32 anchor it kept ran the lossless fused path
    assert rep.models[0].step_sources == {steps.UNKNOWN: 1}


def test_sol_attn_on_the_anchors():
    model = tiny_sana_video2_transformer(SANA_VIDEO2_MEDIUM_CONFIG)  # release head dims: anchors at head dim 256
    inputs = sana_video2_transformer_inputs(model, batch_size=1, frames=4, height=16, width=16)  # 1,024 tokens
    reference = _forward(model, inputs)
    with pytest.raises(ValueError, match=r"dense_layers names layer\(s\) \[0, 1\] that are not anchor layers"):
        accelpatch.apply(model, backend="sol_attn", dense_layers="0,1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the linear sites' CUDA-only path is rejected on CPU
        accelpatch.apply(model, backend="sol_attn", dense_steps=0)
    assert patch_of(model).backend.dense_layers == frozenset({3})  # the first anchor stays dense by default
    assert accelpatch.current_quality(model) == "high"
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert torch.equal(_forward(model, inputs), reference)
    accelpatch.report(model, reset=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # min_tokens=0: the 1,024 tokens lie below the default floor, under which every anchor call runs dense
        accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=-1e9)
        dense_equivalent = _forward(model, inputs)
        torch.testing.assert_close(dense_equivalent, reference, atol=1e-4, rtol=1e-4)
        sol_sites = [s for s in accelpatch.report(model).sites if s.kind == "sana_video2_sol_attn"]
        assert [s.path for s in sol_sites] == ["blocks.3.attn", "blocks.7.attn"]
        # the op ran and skipped nothing: not a fast call
        assert all((s.fast_calls, s.reference_calls) == (0, {NOTHING_SKIPPED: 1}) and s.stats["exact_fraction"] == 1.0
                   for s in sol_sites), sol_sites

        accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=2.0)
        sparse = _forward(model, inputs)
        sol_sites = [s for s in accelpatch.report(model).sites if s.kind == "sana_video2_sol_attn"]
        assert all(s.fast_calls == 1 and s.stats["exact_fraction"] < 0.8 for s in sol_sites), sol_sites
        assert not torch.allclose(sparse, reference, atol=1e-4, rtol=1e-4) and torch.isfinite(sparse).all()

        accelpatch.apply(model, backend="sol_attn", dense_steps=2, min_tokens=0, tau=2.0)
        with accelpatch.denoising_step(1):
            assert torch.equal(_forward(model, inputs), reference)
        rep = accelpatch.report(model)
        assert {s.path: s.reference_calls for s in rep.sites if s.kind == "sana_video2_sol_attn"} == {
            "blocks.3.attn": {DENSE_STEP: 1}, "blocks.7.attn": {DENSE_STEP: 1}}
        accelpatch.report(model, reset=True)
        with accelpatch.denoising_step(2):
            _forward(model, inputs)
        rep = accelpatch.report(model)
        assert {s.path: (s.fast_calls, s.reference_calls) for s in rep.sites if s.kind == "sana_video2_sol_attn"} == {
            "blocks.3.attn": (0, {DENSE_LAYER: 1}), "blocks.7.attn": (1, {})}
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), reference)


# -- quality: the tiny pipeline under each setting, against exact -------------------------------------------------

#: The settings docs/models/sana-video2.md documents, with the gate each passed on the tiny CPU model (every frame
#: SSIM >= 0.92 and PSNR >= 24 dB against exact). The tiny random model says nothing about the released weights:
#: see that page.
DOCUMENTED_SETTINGS = {
    "BF16 anchors everywhere (anchor_fp32_steps=0)": dict(anchor_fp32_steps=0),
    "default (anchor_fp32_steps=0.2)": dict(),
    "anchor_fp32_steps=2": dict(anchor_fp32_steps=2),
    "anchor_fp32_layers=all anchors": dict(anchor_fp32_steps=0, anchor_fp32_layers="3"),
    # min_tokens=0: the tiny pipeline's 768 tokens lie below the default floor, under which Sol-Attn never runs
    "sol_attn, tau=1.0": dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=1.0),
}
GATE_SSIM, GATE_PSNR = 0.92, 24.0


def test_the_tiny_pipeline_passes_the_gate_under_each_documented_setting(on_cpu, capsys):
    from accelpatch.eval.metrics import compare_videos

    # An 8x VAE: 128x128x17 frames are 16x16x3 = 768 tokens, enough for BF16 rounding to show and for Sol-Attn to
    # be sparse, while SSIM over the decoded frames stays cheap.
    pipe = tiny_sana_video2_pipeline(dtype=torch.bfloat16, vae_config=SANA_VIDEO2_TINY_VAE_8X_CONFIG)
    call = lambda: sana_video2_pipeline_call_kwargs(num_inference_steps=4, output_type="pt", height=128,  # noqa: E731
                                                    width=128, frames=17)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(pipe)
        with accelpatch.quality("exact"):
            exact = pipe(**call()).frames
        rows, sol_fast = [], {}
        for label, options in DOCUMENTED_SETTINGS.items():
            accelpatch.apply(pipe, **options)
            accelpatch.report(pipe, reset=True)
            with accelpatch.quality("high"):
                frames = pipe(**call()).frames
            rep = accelpatch.report(pipe)
            q = compare_videos(exact, frames)
            # the gate is about the approximate paths: count the high sites' fast calls, not the lossless ones'
            rows.append((label, q.min_ssim, q.min_psnr, sum(s.fast_calls for s in rep.sites if s.tier == "high")))
            sol_fast[label] = sum(s.fast_calls for s in rep.sites if s.kind == "sana_video2_sol_attn")
    with capsys.disabled():
        print("\nSANA-Video 2.0 tiny pipeline (bf16, 4 steps, 768 tokens, CPU): per-frame quality against exact")
        for label, ssim, psnr, fast in rows:
            print(f"  {label:<48} min SSIM {ssim:.4f}  min PSNR {psnr:7.2f} dB  high fast calls {fast}")
    for label, ssim, psnr, fast in rows:
        assert fast > 0, f"{label}: no high fast path ran, so the gate says nothing"
        assert ssim >= GATE_SSIM and psnr >= GATE_PSNR, (label, ssim, psnr)
    assert any(psnr < 200 for _, _, psnr, _ in rows)  # the approximate paths do change the frames
    # the Sol-Attn setting's gate is about Sol-Attn: its anchors ran sparse (not only the linear attention's path)
    assert sol_fast["sol_attn, tau=1.0"] > 0 and not any(n for label, n in sol_fast.items() if "sol_attn" not in label)
