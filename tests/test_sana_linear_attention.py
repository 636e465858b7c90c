"""The SANA-Video BF16-input linear-attention fast path: its math against the FP32 chain and the diffusers
processor, batch > 1 per item, every guard's reason, and unmounting back to the reference bit for bit.

On CPU the BF16×BF16→FP32 GEMM is emulated (the suite's ``run_fast_paths_on_cpu``, tests/_cpu_fast_paths.py); on
a CUDA machine the same tests also run the real kernel."""
import pytest
import torch
from _cpu_fast_paths import fast_paths_run_on_cpu, run_fast_paths_on_cpu
from diffusers.models.attention_processor import AttnProcessor2_0
from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

import accelpatch
from accelpatch.models.sana_video.linear_attention import FUSED_FUSION, FUSION, linear_attention_bf16_gemm
from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RELEASE_LIKE = dict(num_attention_heads=2, attention_head_dim=112, cross_attention_dim=224,
                    num_cross_attention_heads=2, cross_attention_head_dim=112)


def _attn1_sites(report, block=0):
    """The two sites stacked on ``transformer_blocks.{block}.attn1``: the high BF16-GEMM one (asked first) and the
    lossless fused restatement below it (asked when the high one does not take a call)."""
    by_kind = {s.kind: s for s in report.sites if s.path == f"transformer_blocks.{block}.attn1"}
    assert len(by_kind) == 2, by_kind
    return by_kind[FUSION.name], by_kind[FUSED_FUSION.name]


def _high(report):
    return [s for s in report.sites if s.tier == "high"]


def _lossless(report):
    return [s for s in report.sites if s.tier == "lossless"]


def _emulate(device):
    return run_fast_paths_on_cpu() if device == "cpu" else torch.autograd.grad_mode.no_grad()


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_chain_matches_the_fp32_reference_chain(device):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 16, generator=g).relu().to(device, torch.bfloat16) for _ in range(3))
    z = (1.0 / (torch.rand(1, 4, 1, 16, generator=g) * 10 + 1)).to(device, torch.bfloat16)
    with _emulate(device):
        out = linear_attention_bf16_gemm(q, k, v, z)
    expected = ((v.double() @ k.double().transpose(-1, -2)) @ q.double()) * z.double()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=1e-2)


def _site_inputs(device, batch, seed=0):
    model = tiny_sana_video_transformer(dtype=torch.bfloat16, seed=seed, **RELEASE_LIKE).to(device)
    attn = model.transformer_blocks[0].attn1
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(batch, 48, 224, generator=g).to(device, torch.bfloat16)
    rope = model.rope(torch.zeros(batch, 16, 3, 8, 8, device=device))
    return model, attn, hidden, rope


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_fast_path_matches_the_diffusers_processor(device, batch):
    model, attn, hidden, rope = _site_inputs(device, batch)
    with torch.no_grad():
        expected = SanaLinearAttnProcessor3_0()(attn, hidden, rotary_emb=rope)
        with _emulate(device):
            accelpatch.apply(model)
            with accelpatch.quality("high"):
                out = attn(hidden, rotary_emb=rope)
    high, below = _attn1_sites(accelpatch.report(model))
    assert high.fast_calls == 1 and high.fallback_calls == {}
    assert below.fast_calls == 0 and below.reference_calls == {}  # the high path took the call
    assert out.dtype == expected.dtype == torch.bfloat16 and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_items_are_computed_independently(device):
    model, attn, hidden, rope = _site_inputs(device, batch=3)
    with torch.no_grad(), _emulate(device):
        accelpatch.apply(model)
        with accelpatch.quality("high"):
            together = attn(hidden, rotary_emb=rope)
            alone = [attn(hidden[i:i + 1], rotary_emb=rope) for i in range(3)]
            changed = hidden.clone()
            changed[1] = -changed[1]
            perturbed = attn(changed, rotary_emb=rope)
    for i in range(3):
        torch.testing.assert_close(together[i:i + 1].float(), alone[i].float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(perturbed[0], together[0]) and torch.equal(perturbed[2], together[2])
    assert not torch.equal(perturbed[1], together[1])
    high, below = _attn1_sites(accelpatch.report(model))
    assert high.fast_calls == 5 and below.fast_calls == 0 and below.reference_calls == {}


def test_whole_transformer_under_high_is_close_to_exact_and_counts_fast_calls():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16, **RELEASE_LIKE)
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    with torch.no_grad():
        reference = model(**inputs).sample
        with run_fast_paths_on_cpu():
            accelpatch.apply(model)
            with accelpatch.quality("high"):
                fast = model(**inputs).sample
            with accelpatch.quality("exact"):
                exact = model(**inputs).sample
    assert torch.equal(exact, reference)
    torch.testing.assert_close(fast.float(), reference.float(), atol=2e-2, rtol=2e-2)
    rep = accelpatch.report(model)
    assert all(s.mounted for s in rep.sites)
    # the high path ran once per block under high; exact ran neither it nor the lossless site below it
    assert [(s.fast_calls, s.reference_calls) for s in _high(rep)] == [(1, {"tier exact does not admit high": 1})] * 2
    below = [s for s in _lossless(rep) if s.kind == FUSED_FUSION.name]
    assert [(s.fast_calls, s.reference_calls) for s in below] == [(0, {"tier exact does not admit lossless": 1})] * 2
    # the block and GLUMB (bf16) fusions: high admits lossless, exact does not
    others = [s for s in _lossless(rep) if s not in below]
    assert len(others) == 4
    assert all(s.fast_calls == 1 and s.reference_calls == {"tier exact does not admit lossless": 1} for s in others)
    rep.assert_fast_path_ran()


def _declines(attn, *args, **kwargs):
    site = getattr(attn, FUSION.marker_attr)
    return site.fast_path.run(attn, site, args, kwargs)


def test_each_guard_reports_its_reason():
    model, attn, hidden, rope = _site_inputs("cpu", batch=1)
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
        assert "no rotary_emb" in _declines(attn, hidden).reason
        assert "encoder_hidden_states given" in _declines(attn, hidden, hidden, rotary_emb=rope).reason
        fp32 = model.float()
        assert "activations are torch.float32" in _declines(fp32.transformer_blocks[0].attn1, hidden.float(),
                                                            rotary_emb=rope).reason
        model.to(torch.bfloat16)
    # Mounted under the switch, called without it: the device guard fires, and the reference runs instead.
    assert "input on cpu: the BF16-input GEMM needs CUDA" in _declines(attn, hidden, rotary_emb=rope).reason
    with pytest.warns(RuntimeWarning, match="needs CUDA"), accelpatch.quality("high"), torch.no_grad():
        out = attn(hidden, rotary_emb=rope)
        expected = SanaLinearAttnProcessor3_0()(attn, hidden, rotary_emb=rope)
    assert torch.equal(out, expected)
    # A processor swapped in after apply() is never bypassed.
    attn.set_processor(AttnProcessor2_0())
    with run_fast_paths_on_cpu():
        assert "processor is AttnProcessor2_0" in _declines(attn, hidden, rotary_emb=rope).reason
    high, below = _attn1_sites(accelpatch.report(model))
    assert high.fast_calls == 0 and high.fallback_calls == {"input on cpu: the BF16-input GEMM needs CUDA": 1}
    assert below.fast_calls == 1 and below.reference_calls == {}  # the declined call went to the lossless site


def test_mount_rejects_a_model_whose_processor_was_replaced():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    model.transformer_blocks[1].attn1.set_processor(AttnProcessor2_0())
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
    rep = accelpatch.report(model)
    for kind in (FUSION.name, FUSED_FUSION.name):  # both attn1 fast paths, each all or nothing
        first, second = [s for s in rep.sites if s.kind == kind]
        assert not first.mounted and not second.mounted
        assert "processor is AttnProcessor2_0" in second.reason
        assert "model rejected at transformer_blocks.1.attn1" in first.reason
    # the block and GLUMB fusions do not restate the processor: they mount
    assert all(s.mounted for s in rep.sites if s.kind not in (FUSION.name, FUSED_FUSION.name))


def test_unmount_restores_the_reference_bit_for_bit():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16, **RELEASE_LIKE)
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    with torch.no_grad():
        reference = model(**inputs).sample
        with run_fast_paths_on_cpu():
            accelpatch.apply(model)
            for site in FUSION.iter_sites(model):  # another caller's unmount (sglang's site protocol)
                setattr(site, FUSION.enabled_attr, False)
            with accelpatch.quality("high"), pytest.warns(RuntimeWarning, match="not mounted"):
                out = model(**inputs).sample
    assert torch.equal(out, reference)
    rep = accelpatch.report(model)
    assert [(s.fast_calls, s.mounted) for s in _high(rep)] == [(0, False)] * 2
    assert [sum(s.fallback_calls.values()) for s in _high(rep)] == [1, 1]  # not mounted: to the site below
    assert [s.fast_calls for s in _lossless(rep)] == [1] * 6  # blocks, attn1 below the high path, GLUMBs


def test_the_switch_is_off_outside_its_block():
    assert fast_paths_run_on_cpu() is False
    with run_fast_paths_on_cpu():
        assert fast_paths_run_on_cpu() is True
    assert fast_paths_run_on_cpu() is False


@pytest.mark.parametrize("device", DEVICES)
def test_the_bf16_gemm_has_the_gradients_of_its_fp32_emulation(device, monkeypatch):
    """torch has no derivative for bmm(..., out_dtype=float32) ("derivative for aten::bmm is not implemented"):
    the fast path's GEMM carries its own, equal to autograd through the exact FP32 emulation."""
    from accelpatch.models.sana_video import gemm

    if device == "cpu":  # no CPU kernel for out_dtype: the same autograd.Function around the emulation
        monkeypatch.setattr(gemm, "_bmm_out_fp32", gemm.bmm_bf16_fp32_emulated)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(shape, generator=g).to(device, torch.bfloat16).requires_grad_()
            for shape in ((3, 8, 16), (3, 16, 8)))
    weight = torch.randn(3, 8, 8, generator=g).to(device)
    (gemm.bmm_bf16_fp32(a, b) * weight).sum().backward()
    a_ref, b_ref = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (gemm.bmm_bf16_fp32_emulated(a_ref, b_ref) * weight).sum().backward()
    assert a.grad.dtype == b.grad.dtype == torch.bfloat16
    assert torch.equal(a.grad, a_ref.grad) and torch.equal(b.grad, b_ref.grad)
