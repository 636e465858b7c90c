"""The live-bytes counter (issue #44): what it counts on known allocations, that a fake-tensor trace of a tiny
transformer gives the bytes its real run measures, and a full-size trace's figures against what the shapes imply."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from accelpatch.memory import LiveBytes, module_bytes


def _tensor_bytes(module):
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def test_views_and_in_place_results_count_once_and_freed_storages_leave():
    with LiveBytes() as live:
        a = torch.empty(1000)  # 4,000 bytes
        view = a.view(10, 100)
        a.add_(1.0)
        b = torch.empty(500, dtype=torch.float64)  # 4,000 bytes
        assert live.current == 8000
        del a, view
        c = torch.empty(100, dtype=torch.bfloat16)  # 200 bytes, after a's storage was freed
        assert live.current == 4200
    assert live.peak == 8000 and live.current == 4200
    del b, c


def test_tensors_made_before_the_block_are_not_counted():
    weight = torch.ones(256, 256)
    with LiveBytes() as live:
        weight.mul_(2.0)
        weight.t()
        out = weight.sum()
    assert live.peak == out.untyped_storage().nbytes() == 4


def test_a_fake_trace_of_a_tiny_transformer_matches_its_real_run():
    """The planner's premise: the same counter over a FakeTensorMode trace (no storage, no math) gives the bytes the
    real run's live tensors peak at (issue #44: within 10 %)."""
    from diffusers import WanTransformer3DModel

    from accelpatch.testing.wan import WAN_SOL_CONFIG, wan_transformer_inputs

    torch.manual_seed(0)
    model = WanTransformer3DModel(**WAN_SOL_CONFIG).eval()
    with torch.no_grad(), LiveBytes() as real:
        model(**wan_transformer_inputs(model))
    with FakeTensorMode():
        fake_model = WanTransformer3DModel(**WAN_SOL_CONFIG).eval()
        inputs = wan_transformer_inputs(fake_model)
        with torch.no_grad(), LiveBytes() as fake:
            fake_model(**inputs)
    assert real.peak > 1_000_000, real.peak  # the 1,024-token forward's activations, not nothing
    assert abs(fake.peak - real.peak) <= 0.10 * real.peak, (fake.peak, real.peak)
    assert module_bytes(fake_model) == module_bytes(model) == _tensor_bytes(model)


def test_a_full_size_wan_forward_traces_with_the_bytes_its_shapes_imply():
    """Wan 2.1 T2V 1.3B, bf16, 480 x 832 x 81 frames (32,760 tokens): its feed-forward's hidden state before and
    after GELU (tokens x 8,960, bf16) are alive together, so the peak is at least their bytes; CPU attention in a
    trace is flash-style (no tokens x tokens score matrix, 24 GiB here)."""
    from diffusers import WanTransformer3DModel

    from accelpatch.testing.wan import WAN_1_3B_CONFIG, wan_transformer_inputs

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # a fake module cannot be cast after it is built
    try:
        with FakeTensorMode():
            model = WanTransformer3DModel(**WAN_1_3B_CONFIG).eval()
            inputs = wan_transformer_inputs(model, num_frames=21, height=60, width=104, text_len=512)
            with torch.no_grad(), LiveBytes() as live:
                model(**inputs)
    finally:
        torch.set_default_dtype(previous)
    tokens = 21 * 30 * 52
    assert module_bytes(model) == _tensor_bytes(model)
    assert 1.3e9 < sum(p.numel() for p in model.parameters()) < 1.5e9
    feed_forward = 2 * tokens * 8960 * 2
    assert feed_forward <= live.peak < 2 * 2 ** 30, live.peak / 2 ** 30


def test_apply_and_a_patched_forward_trace_on_fake_tensors_and_say_what_they_could_not_check():
    """apply() inside a memory trace (issue #44): the site counters stay real tensors and readable, the lossless
    fused ops meet fake operands and allocate what their kernels would (nothing checked or computed), saying so,
    and remove() restores the classes."""
    import accelpatch
    from diffusers import WanTransformer3DModel

    from accelpatch.testing.wan import WAN_SOL_CONFIG, wan_transformer_inputs

    with FakeTensorMode():
        model = WanTransformer3DModel(**WAN_SOL_CONFIG).eval()
        original = type(model.blocks[0].attn1)
        inputs = wan_transformer_inputs(model)
        accelpatch.apply(model)
        assert type(model.blocks[0].attn1) is not original
        with torch.no_grad(), LiveBytes() as live:
            out = model(**inputs).sample
        report = str(accelpatch.report(model))
        accelpatch.remove(model)
    assert out.shape == inputs["hidden_states"].shape and live.peak > 0
    assert "modulate on 2 site(s): 0 ran, 4 not applicable (fake operands (a memory trace): planned as the kernel" \
           " holds it" in report, report
    assert "ran its eager chain, or on fake tensors was only planned" in report
    assert type(model.blocks[0].attn1) is original


def test_a_count_the_device_decides_on_a_fake_tensor_says_it_was_not_counted():
    from accelpatch.core.gate import FAKE_UNCOUNTED, SiteCounters

    counters = SiteCounters()
    with FakeTensorMode():
        counters.count_fast(value=torch.ones((), dtype=torch.int64))
        counters.add_stat("exact_fraction", torch.ones(()))
        totals = counters.totals()
    assert totals["fast"] == 0 and totals["stats"] == {} and totals["uncounted"] == FAKE_UNCOUNTED
    counters.count_fast(value=torch.ones((), dtype=torch.int64))  # a real one still counts
    assert counters.totals()["fast"] == 1
