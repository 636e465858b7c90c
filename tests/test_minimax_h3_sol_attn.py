"""MiniMax-H3 with backend="sol_attn": dense guards are bit-identical, the sparse path really runs, the step clock
follows the pipeline, batch items and sink rows are respected, options are validated. What every family keeps (the
tiers' bits, kernel errors and strict, remove(), ...) is tests/test_family_contract.py's."""

import warnings

import pytest
import torch

import accelpatch
from accelpatch.sol_attn.config import DENSE_STEP, NOTHING_SKIPPED, SHORT_SEQUENCE, TOTAL_UNKNOWN
from accelpatch.core.reporting import merge_counts
from accelpatch.models.minimax_h3 import high as h3_high
from accelpatch.testing import (minimax_h3_layout, minimax_h3_pipeline_call_kwargs, minimax_h3_transformer_inputs,
                                tiny_minimax_h3_pipeline, tiny_minimax_h3_transformer)

ROWS = 1100  # video rows; with text and audio the packed sequence is > 1,000 rows, i.e. ~18 blocks of 64


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.fixture(scope="module")
def model_and_reference():
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=ROWS)
    return model, inputs, _forward(model, inputs)


@pytest.fixture
def model(model_and_reference):
    m, inputs, reference = model_and_reference
    yield m, inputs, reference
    accelpatch.remove(m)


def _attention_modules(model):
    return [m for name, m in model.named_modules() if name.endswith(".attn")]


FP32_SWIGLU = "activations are torch.float32: the fused SiLU tables are bfloat16"
EXACT_ADMITS_NO_LOSSLESS = "tier exact does not admit lossless"


def _high(report):
    return [s for s in report.sites if s.tier == "high"]


def _lossless_counts(report):
    """{(path, kind): (fast calls, reference calls by reason, fallback calls by reason)} of the lossless sites."""
    return {(s.path, s.kind): (s.fast_calls, s.reference_calls, s.fallback_calls)
            for s in report.sites if s.tier == "lossless"}


def _lossless_after(fast, exact=0):
    """The tiny fp32 model's lossless counts after ``fast`` forwards they ran and ``exact`` under quality("exact"):
    blocks and attentions run fused; the SwiGLU gate, a bf16 table, keeps the reference on fp32 (counted)."""
    out = {}
    for layer in (0, 1):
        refused = {EXACT_ADMITS_NO_LOSSLESS: exact} if exact else {}
        out[(f"transformer_blocks.{layer}", "minimax_h3_fused_block")] = (fast, refused, {})
        out[(f"transformer_blocks.{layer}.attn", "minimax_h3_fused_attention")] = (fast, refused, {})
        out[(f"transformer_blocks.{layer}.ff.net.0", "fused_swiglu")] = (0, {**refused, FP32_SWIGLU: fast}, {})
    return out


@pytest.mark.parametrize("options", [dict(dense_steps=10**6), dict(dense_steps=0, dense_layers="0-1"),
                                     dict(dense_steps=0, dense_layers=[0, 1])])
def test_dense_guards_covering_everything_are_bit_identical(model, options):
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", tau=5.0, **options)
    assert torch.equal(_forward(m, inputs), reference)
    rep = accelpatch.report(m)
    assert sum(s.fast_calls for s in _high(rep)) == 0 and rep.fallback_calls == {}
    reason = h3_high.DENSE_STEP if options["dense_steps"] else h3_high.DENSE_LAYER
    assert merge_counts(s.reference_calls for s in _high(rep)) == {reason: 2, h3_high.REFINER_DENSE: 2}
    # each dense call went to the lossless fused attention below: it is the reference bit for bit (checked above)
    assert _lossless_counts(rep) == _lossless_after(fast=1)


def test_exact_and_lossless_blocks_run_dense_on_a_sol_patched_model(model):
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", tau=3.0)
    assert accelpatch.report(m).models[0].default_tier == "high"
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert torch.equal(_forward(m, inputs), reference)
    rep = accelpatch.report(m)
    assert {s.path: (s.fast_calls, s.reference_calls) for s in _high(rep)} == {
        path: (0, {"tier exact does not admit high": 1, "tier lossless does not admit high": 1})
        for path in ("token_refiner.refiner_blocks.0.attn", "token_refiner.refiner_blocks.1.attn",
                     "transformer_blocks.0.attn", "transformer_blocks.1.attn")}
    assert _lossless_counts(rep) == _lossless_after(fast=1, exact=1)  # lossless ran its fusions, exact did not


def test_all_exact_tau_is_close_to_dense_and_a_large_tau_really_runs_sparse(model):
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=-1e9)
    torch.testing.assert_close(_forward(m, inputs), reference, atol=1e-4, rtol=1e-4)
    sites = [s for s in accelpatch.report(m).sites if s.kind == "sol_attn"]
    # the kernel ran, but skipped nothing: not a fast call (issue #30: it once counted as one)
    assert all(s.fast_calls == 0 and s.reference_calls == {NOTHING_SKIPPED: 1} and s.stats["exact_fraction"] == 1.0
               for s in sites), sites
    with pytest.raises(AssertionError, match="no sparse fast path ran"):
        accelpatch.report(m).assert_fast_path_ran(kind="sparse")

    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)  # in place
    out = _forward(m, inputs)
    assert torch.isfinite(out).all() and not torch.allclose(out, reference, atol=1e-4, rtol=1e-4)
    sites = [s for s in accelpatch.report(m).sites if s.kind == "sol_attn"]
    assert all(s.fast_calls == 1 and s.stats["exact_fraction"] < 0.6 for s in sites), sites
    assert "exact_fraction" in str(accelpatch.report(m))
    accelpatch.report(m).assert_fast_path_ran(kind="sparse")


def test_direct_calls_use_the_denoising_step_context(model):
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=2, dense_layers="", min_tokens=0, tau=3.0)
    seen = []
    hook = m.transformer_blocks[0].attn.register_forward_pre_hook(
        lambda *_: seen.append(accelpatch.core.steps.current_denoising_step()))
    try:
        assert torch.equal(_forward(m, inputs), reference)  # no clock: step 0, dense
        with accelpatch.denoising_step(1):
            assert torch.equal(_forward(m, inputs), reference)
        with accelpatch.denoising_step(2):
            assert not torch.equal(_forward(m, inputs), reference)
    finally:
        hook.remove()
    assert seen == [0, 1, 2]
    with pytest.raises(ValueError, match="denoising_step expects an int >= 0, got -1"):
        with accelpatch.denoising_step(-1):
            pass


def _sol_counts(m):
    """(fast calls, reference calls by reason, fallback calls by reason) of each main-block Sol-Attn site."""
    return [(s.fast_calls, s.reference_calls, s.fallback_calls)
            for s in accelpatch.report(m).sites if s.kind == "sol_attn"]


def test_the_default_dense_steps_fraction_needs_the_calls_number_of_steps(model):
    """dense_steps defaults to 0.2 of the call's steps: a direct call whose number of steps nothing gives runs dense
    (bit for bit, counted TOTAL_UNKNOWN, a fallback: the policy could not apply), even at a known step; with
    denoising_step(i, total=10) steps 0 and 1 (ceil(0.2 * 10)) are dense steps and step 2 runs sparse."""
    from accelpatch.core.patcher import patch_of

    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_layers="", min_tokens=0, tau=3.0)
    assert patch_of(m).backend.dense_steps == 0.2
    with pytest.warns(RuntimeWarning, match="number of denoising steps is unknown"):
        assert torch.equal(_forward(m, inputs), reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        with accelpatch.denoising_step(5):
            assert torch.equal(_forward(m, inputs), reference)
    assert _sol_counts(m) == [(0, {TOTAL_UNKNOWN: 2}, {TOTAL_UNKNOWN: 2})] * 2
    accelpatch.report(m, reset=True)
    for step in range(3):
        with accelpatch.denoising_step(step, total=10):
            assert torch.equal(_forward(m, inputs), reference) == (step < 2), step
    assert _sol_counts(m) == [(1, {DENSE_STEP: 2}, {})] * 2


def test_the_default_min_tokens_keeps_the_tiny_models_calls_dense(model):
    """The default floor (12,288 tokens) is far above the tiny model's 1,114 rows: even at a sparse step every call
    runs the dense original, bit for bit, counted SHORT_SEQUENCE (the policy, not a fallback)."""
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", tau=3.0)
    assert accelpatch.SolAttnConfig().min_tokens == 12288 > inputs["position_ids"].shape[0]
    assert torch.equal(_forward(m, inputs), reference)
    assert _sol_counts(m) == [(0, {SHORT_SEQUENCE: 1}, {})] * 2
    with pytest.raises(AssertionError, match="no sparse fast path ran"):
        accelpatch.report(m).assert_fast_path_ran(kind="sparse")


def _call(pipe):
    # 128×128 gives 592 video rows after 419 text/audio rows: enough blocks beyond the sink for sparsity.
    return pipe(**minimax_h3_pipeline_call_kwargs(num_inference_steps=4, height=128, width=128), output="videos")


def test_step_clock_through_the_modular_pipeline_restarts_each_call():
    pipe = tiny_minimax_h3_pipeline()
    expected = _call(pipe)
    accelpatch.apply(pipe, backend="sol_attn", dense_steps=1, dense_layers="", min_tokens=0, tau=1.0)
    seen = []
    hook = pipe.transformer.transformer_blocks[1].attn.register_forward_pre_hook(
        lambda *_: seen.append(accelpatch.core.steps.current_denoising_step()))
    first = _call(pipe)
    second = _call(pipe)
    hook.remove()
    assert seen == [0, 1, 2, 0, 1, 2]  # num_inference_steps=N runs N-1 transformer calls
    assert torch.equal(first, second) and not torch.equal(first, expected)
    counts = accelpatch.report(pipe).sites
    main = [s for s in counts if s.kind == "sol_attn"]
    assert all(s.fast_calls == 4 and s.reference_calls == {h3_high.DENSE_STEP: 2} for s in main)
    with accelpatch.quality("exact"):
        assert torch.equal(_call(pipe), expected)
    accelpatch.remove(pipe)
    assert torch.equal(_call(pipe), expected)


def test_batch_items_never_mix(model):
    m, _, _ = model
    inputs = minimax_h3_transformer_inputs(m, num_video=ROWS, batch_size=2, seed=3)
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=1.0)
    out = _forward(m, inputs)
    changed = dict(inputs)
    for key in ("hidden_states", "audio_hidden_states", "encoder_hidden_states"):
        changed[key] = inputs[key].clone()
        changed[key][1] = torch.randn_like(changed[key][1])
    out_changed = _forward(m, changed)
    assert torch.equal(out_changed[0], out[0]) and (out_changed[1] - out[1]).abs().max() > 1e-2
    single = _forward(m, {k: (v[:1] if k in ("hidden_states", "audio_hidden_states", "encoder_hidden_states")
                              else v) for k, v in inputs.items()})
    torch.testing.assert_close(single[0], out[0], atol=1e-5, rtol=1e-5)


def test_sink_rows_stay_exact_at_the_attention_level(model):
    m, inputs, _ = model
    layout = minimax_h3_layout(inputs)
    attn = m.transformer_blocks[0].attn
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, layout.sequence_length, m.config.hidden_size, generator=g)
    rope = m.rope(inputs["position_ids"])
    with torch.no_grad():
        dense = attn(hidden, rope)
        accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
        with accelpatch.denoising_step(5):
            token = h3_high._layout.set(h3_high.layout_from_token_tags(inputs["token_tags"]))
            try:
                sparse = attn(hidden, rope)
            finally:
                h3_high._layout.reset(token)
    prefix = layout.prefix_rows
    assert prefix == 14 and h3_high.layout_from_token_tags(inputs["token_tags"]).sink_tokens == prefix
    torch.testing.assert_close(sparse[:, :prefix], dense[:, :prefix], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(sparse[:, prefix:], dense[:, prefix:], atol=1e-4, rtol=1e-4)


def test_layout_hull_covers_every_non_video_row():
    tags = torch.tensor([0, 0, 1, 1, 0, 2, 2, 0, 0])
    assert h3_high.layout_from_token_tags(tags) == h3_high.PackedLayout(9, 2, 5, rows=(2, 3, 5, 6))
    assert h3_high.layout_from_token_tags(torch.tensor([0, 1, 2, 2, 0])) == h3_high.PackedLayout(5, 1, 3)
    assert h3_high.layout_from_token_tags(torch.zeros(5, dtype=torch.long)).sink_tokens == 0


@pytest.mark.parametrize("options,match", [
    (dict(tau=float("nan")), r"tau must be a finite float.*nan"),
    (dict(tau="1"), r"tau must be a finite float.*'1'"),
    (dict(thresh_type="max"), r"thresh_type must be one of diag, exact, got 'max'"),
    (dict(dense_steps=-1), r"dense_steps must be a number of steps \(an int >= 0\), a fraction .*got -1"),
    (dict(dense_layers="0,x"), r"dense_layers: 'x' in '0,x' is not a layer index"),
    (dict(dense_layers="5-2"), r"dense_layers: range '5-2' in '5-2' runs backwards"),
    (dict(dense_layers=[0, -1]), r"dense_layers: -1 is not a non-negative layer index"),
    (dict(kv_splits=3), r"kv_splits must be 1, 2, 4 or 'auto', got 3"),
    (dict(impl="cuda"), r"impl must be one of auto, torch, triton, upstream, got 'cuda'"),
    (dict(sink_start=4), r"sink_start=4 needs sink_tokens"),
    (dict(sink_tokens=-3), r"sink_tokens must be an int >= 0 or None, got -3"),
    (dict(taus=1.0), r"unknown option\(s\) \['taus'\].*backend 'sol_attn': tau, thresh_type"),
])
def test_options_are_validated_before_any_module_is_touched(model, options, match):
    m, inputs, reference = model
    with pytest.raises(ValueError, match=match):
        accelpatch.apply(m, backend="sol_attn", **options)
    assert not hasattr(m, "_accelpatch_state")
    assert all(type(a).__name__ == "MiniMaxH3Attention" for a in _attention_modules(m))
    assert not m._forward_pre_hooks and not m._forward_hooks


def test_config_object_parses_layer_ranges():
    cfg = accelpatch.SolAttnConfig(dense_layers="0-2,5, 7")
    assert cfg.dense_layers == frozenset({0, 1, 2, 5, 7})
    assert accelpatch.SolAttnConfig(dense_layers="").dense_layers == frozenset()
    assert accelpatch.SolAttnConfig(dense_layers=[1, 0]) == accelpatch.SolAttnConfig(dense_layers="0,1")
    assert accelpatch.SolAttnConfig().dense_layers is None  # left to the model: MiniMax-H3 fills in {0, 1}


def test_default_dense_layers_are_the_prior_arts_for_minimax_h3(model):
    from accelpatch.core.patcher import patch_of

    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, tau=3.0)
    assert patch_of(m).backend.dense_layers == frozenset({0, 1})
    assert torch.equal(_forward(m, inputs), reference)  # the tiny model has 2 layers: both dense
    rep = accelpatch.report(m)
    assert merge_counts(s.reference_calls for s in _high(rep)) == {h3_high.DENSE_LAYER: 2,
                                                                   h3_high.REFINER_DENSE: 2}
    assert sum(s.fast_calls for s in _high(rep)) == 0 and _lossless_counts(rep) == _lossless_after(fast=1)


def test_backend_errors_list_what_is_available(model):
    m, _, _ = model
    with pytest.raises(ValueError, match=r"unknown backend 'sparse'; available backends: sol_attn"):
        accelpatch.apply(m, backend="sparse")
    from accelpatch.testing import tiny_sana_video_transformer

    with pytest.raises(ValueError, match=r"backend 'sol_attn' is not available for SANA-Video models; backends "
                                         r"available for SANA-Video: none"):
        accelpatch.apply(tiny_sana_video_transformer(), backend="sol_attn")
    with pytest.raises(ValueError, match="either inside SolAttnConfig or as keyword arguments"):
        accelpatch.apply(m, backend=accelpatch.SolAttnConfig(), tau=2.0)


def test_context_parallel_config_falls_back_to_the_dense_original(model):
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
    processors = [a.processor for a in _attention_modules(m)]
    sentinel = object()
    for p in processors:
        p._parallel_config = sentinel
    seen = []
    from diffusers.models.transformers import transformer_minimax_h3 as h3

    original = h3.dispatch_attention_fn

    def spy(*args, **kwargs):
        seen.append(kwargs.get("parallel_config"))
        kwargs["parallel_config"] = None
        return original(*args, **kwargs)

    h3.dispatch_attention_fn = spy
    try:
        with pytest.warns(RuntimeWarning, match="context parallelism"):
            out = _forward(m, inputs)
    finally:
        h3.dispatch_attention_fn = original
        for p in processors:
            p._parallel_config = None
    assert torch.equal(out, reference)
    assert seen == [sentinel] * 4  # the original processors ran with their own parallel config


def test_attention_backend_choice_reaches_the_dense_path(model, monkeypatch):
    m, inputs, _ = model
    from diffusers.models.transformers import transformer_minimax_h3 as h3

    accelpatch.apply(m, backend="sol_attn")  # default policy: a direct call (no number of steps) runs dense
    for a in _attention_modules(m):
        a.processor._attention_backend = "_native_math"
    seen = []
    original = h3.dispatch_attention_fn
    monkeypatch.setattr(h3, "dispatch_attention_fn", lambda *a, **k: seen.append(k["backend"]) or original(*a, **k))
    try:
        _forward(m, inputs)
    finally:
        for a in _attention_modules(m):
            a.processor._attention_backend = None
    assert seen == ["_native_math"] * 4
    assert [s.fallback_calls for s in accelpatch.report(m).sites if s.kind == "sol_attn"] == [{TOTAL_UNKNOWN: 1}] * 2


def test_without_a_backend_nothing_is_announced_and_the_fp32_swiglu_gate_says_why_it_stands_aside(model):
    m, inputs, reference = model
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to announce: every site can run
        accelpatch.apply(m)
    assert torch.equal(_forward(m, inputs), reference)
    assert _lossless_counts(accelpatch.report(m)) == _lossless_after(fast=1)


@pytest.mark.parametrize("video_rows", [1, 30, 100])
def test_sequences_shorter_than_a_few_blocks_run_sparse_and_match_dense(video_rows):
    m = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(m, num_video=video_rows)
    reference = _forward(m, inputs)
    accelpatch.apply(m, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    out = _forward(m, inputs)
    # With at most 3 blocks every block is its own neighbour's neighbour: exact, so sparse equals dense, and the
    # call, which skipped nothing, is counted as such rather than as a fast call.
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    sites = [s for s in accelpatch.report(m).sites if s.kind == "sol_attn"]
    assert all(s.fast_calls == 0 and s.reference_calls == {NOTHING_SKIPPED: 1} and s.stats["exact_fraction"] == 1.0
               for s in sites), sites
