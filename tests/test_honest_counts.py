"""Issue #30 item 1: ``report().fast_calls`` and ``assert_fast_path_ran()`` count calls that did fast work, not calls
that entered a fast path. A lossless site call whose every fused op ran its eager chain, and a Sol-Attn call that
skipped no block, once counted as fast: the guard against silent no-ops passed on a silent no-op."""
import warnings

import pytest
import torch

import accelpatch
import accelpatch.testing as t
from accelpatch.core import patcher
from accelpatch.sol_attn import diffusers_backend as attention_backend
from accelpatch.sol_attn.config import NOTHING_SKIPPED
from accelpatch.core.gate import SiteCounters, WorkWatch, note_work
from accelpatch.core.reporting import FAST_KINDS
from accelpatch.core.sites import NO_FUSED_OP


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA-only paths are not mounted on CPU
        yield


def _sana_video():
    model = t.tiny_sana_video_transformer(dtype=torch.bfloat16)
    return model, t.sana_video_transformer_inputs(model, seed=1)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def test_a_fused_call_whose_ops_all_ran_their_eager_chains_is_not_a_fast_call():
    model, inputs = _sana_video()
    accelpatch.apply(model, cpu_kernels=False)  # every fused op runs diffusers' chain: nothing fast can run
    _forward(model, inputs)
    report = accelpatch.report(model)
    lossless = [s for s in report.sites if s.tier == "lossless"]
    assert lossless and all(s.work == "fused" for s in lossless)
    assert [(s.fast_calls, s.reference_calls) for s in lossless] == [(0, {NO_FUSED_OP: 1})] * len(lossless)
    assert report.fast_calls == 0 and report.fast_calls_by_tier == {"lossless": 0, "high": 0}
    with pytest.raises(AssertionError, match="no accelpatch fast path ran"):
        report.assert_fast_path_ran()
    with pytest.raises(AssertionError, match="no fused fast path ran"):
        report.assert_fast_path_ran(kind="fused")
    assert "fast calls: 0 lossless, 0 high" in str(report)
    accelpatch.remove(model)


def test_a_call_whose_fused_ops_fused_counts_as_fused_work_only():
    model, inputs = _sana_video()
    accelpatch.apply(model)
    _forward(model, inputs)
    report = accelpatch.report(model)
    fused = sum(f.fused_calls for f in report.models[0].fusions)
    assert fused > 0  # relu_rope, modulate, gated residual... fuse on every CPU the kernels build on
    counts = report.fast_calls_by_kind
    assert counts["fused"] == report.fast_calls > 0 and counts["sparse"] == counts["cache"] == 0, counts
    report.assert_fast_path_ran()
    report.assert_fast_path_ran(kind="fused")
    with pytest.raises(AssertionError, match=r"no sparse fast path ran \(fast calls by kind: fused \d+\)"):
        report.assert_fast_path_ran(kind="sparse")
    accelpatch.remove(model)


def test_assert_fast_path_ran_names_the_valid_kinds():
    model, inputs = _sana_video()
    accelpatch.apply(model)
    with pytest.raises(ValueError, match="kind must be one of fused, sparse, approximate, cache, lossless, high "
                                         ".* got 'fast'"):
        accelpatch.report(model).assert_fast_path_ran(kind="fast")
    assert FAST_KINDS == ("fused", "sparse", "approximate", "cache")
    accelpatch.remove(model)


def test_lossless_and_high_are_reported_apart():
    """MiniMax-H3 with sol_attn: the Sol-Attn calls that skipped blocks are the high calls, the fused blocks the
    lossless ones, and the headline says both."""
    model = t.tiny_minimax_h3_transformer()
    inputs = t.minimax_h3_transformer_inputs(model, num_video=300)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    _forward(model, inputs)
    report = accelpatch.report(model)
    sparse = sum(s.fast_calls for s in report.sites if s.kind == "sol_attn")
    lossless = sum(s.fast_calls for s in report.sites if s.tier == "lossless")
    assert sparse == len(model.transformer_blocks)
    assert report.fast_calls_by_tier == {"lossless": lossless, "high": sparse}
    assert report.fast_calls_by_kind["sparse"] == sparse
    assert f"fast calls: {lossless} lossless, {sparse} high" in report.models[0].headline()
    report.assert_fast_path_ran(kind="sparse")
    accelpatch.remove(model)


def _qkv(tokens):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, tokens, 2, 16, generator=gen) for _ in range(3)]


def test_the_attention_backend_counts_a_call_that_skipped_nothing_as_dense():
    config = attention_backend.backend_config(tau=3.0)
    attention_backend.COUNTERS.reset()
    try:
        attention_backend.run_sparse(config, *_qkv(100))  # two blocks: every pair is exact
        totals = attention_backend.COUNTERS.totals()
        assert (totals["fast"], totals["reference"][NOTHING_SKIPPED]) == (0, 1)
        attention_backend.run_sparse(config, *_qkv(640))  # ten blocks at tau=3: some pairs skipped
        totals = attention_backend.COUNTERS.totals()
        assert (totals["fast"], totals["reference"][NOTHING_SKIPPED]) == (1, 1)
    finally:
        attention_backend.COUNTERS.reset()


def test_work_watches_nest_and_mark_only_their_own_site():
    outer, inner = SiteCounters(), SiteCounters()
    note_work(outer)  # no call open: nothing to mark, no error
    with WorkWatch(outer) as a:
        with WorkWatch(inner) as b:
            note_work(outer)
        assert (a.did_work, b.did_work) == (True, False)
        with WorkWatch(inner) as c:
            note_work(inner)
        assert c.did_work


def _accelpatch_warnings(record):
    return [str(w.message) for w in record if str(w.message).startswith("accelpatch:")]


def test_a_warning_is_given_once_per_model_however_often_it_is_patched_again():
    """Issue #30 item 2: every model a bench, validate or tune built said "not mounted: CUDA" again; they re-apply one
    model per candidate, so: once per model, whatever it is re-patched with (and after a remove())."""
    model = t.tiny_sana_video_transformer()
    inputs = t.sana_video_transformer_inputs(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for options in ({}, {"strict": False}, {"tier": "high"}, {}):
            accelpatch.apply(model, **options)
            with accelpatch.quality("high"):  # requests the unmounted path: the same reason, already said
                _forward(model, inputs)
        accelpatch.remove(model)
        accelpatch.apply(model)
    said = _accelpatch_warnings(record)
    assert len(said) == 1, said
    assert "CUDA is unavailable" in said[0] and "(expected on this machine, not a fault)" in said[0], said
    accelpatch.remove(model)


def test_a_second_model_hears_the_warnings_the_first_heard_naming_itself():
    """Issue #40 item 4: after one Wan warned that high has nothing to run, a second Wan, a HunyuanVideo 1.5 and an
    LTX-2 heard nothing in that process, and a second SANA-Video 2.0 pipeline no "not mounted": once per model, as
    docs/contract.md says, each naming its model."""
    from accelpatch.testing import tiny_hunyuan_video15_transformer, tiny_ltx2_transformer

    models = [t.tiny_wan_transformer(), t.tiny_wan_transformer(), tiny_hunyuan_video15_transformer(),
              tiny_ltx2_transformer()]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for model in models:
            accelpatch.apply(model, tier="high")
    said = [m for m in _accelpatch_warnings(record) if "no high fast path" in m]
    assert [m.removeprefix("accelpatch: ").split(":")[0] for m in said] == [
        "WanTransformer3DModel", "WanTransformer3DModel", "HunyuanVideo15Transformer3DModel",
        "LTX2VideoTransformer3DModel"], said
    for model in models:
        accelpatch.remove(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pipes = [t.tiny_sana_video2_pipeline() for _ in range(2)]
        for pipe in pipes:
            accelpatch.apply(pipe)
    mounted = [m for m in _accelpatch_warnings(record) if "sana_video2_softmax_attention fast path was not mounted" in m]
    assert len(mounted) == 2 and all("on SanaVideo2Transformer3DModel" in m for m in mounted), mounted
    for pipe in pipes:
        accelpatch.remove(pipe)


def test_a_warning_names_the_checkpoint_the_model_came_from(tmp_path):
    model = t.tiny_sana_video_transformer()
    model.save_pretrained(tmp_path / "my-sana")
    loaded = type(model).from_pretrained(tmp_path / "my-sana")
    with pytest.warns(RuntimeWarning, match=r"not mounted on SanaVideoTransformer3DModel \(.*my-sana\)"):
        accelpatch.apply(loaded)
    accelpatch.remove(loaded)


def test_a_reason_about_the_model_is_not_worded_as_expected():
    from diffusers.models.attention_processor import AttnProcessor2_0

    model = t.tiny_sana_video_transformer()
    model.transformer_blocks[1].attn1.set_processor(AttnProcessor2_0())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        accelpatch.apply(model)
    said = [m for m in _accelpatch_warnings(record) if "processor is AttnProcessor2_0" in m]
    assert said and not any("expected on this machine" in m for m in said), said
    accelpatch.remove(model)


def test_high_on_a_model_with_no_high_fast_path_says_so():
    """Issue #32 item 3: quality("high") on Wan without backend= or cache= ran the lossless path, counted nothing
    and the report still said it "opts in to the approximate fast paths"."""
    model = t.tiny_wan_transformer()
    inputs = t.wan_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    report = accelpatch.report(model)
    assert "this model has no high fast path without backend= or cache=" in report.models[0].headline()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with accelpatch.quality("high"):
            outputs = [_forward(model, inputs) for _ in range(2)]
    said = [m for m in _accelpatch_warnings(record) if "no high fast path" in m]
    assert len(said) == 1 and "runs the lossless path" in said[0], said
    assert all(torch.equal(out, reference) for out in outputs)
    with pytest.raises(AssertionError, match="no high fast path ran"):
        accelpatch.report(model).assert_fast_path_ran(kind="high")
    accelpatch.report(model).assert_fast_path_ran(kind="lossless")  # the fused kernels did run
    accelpatch.remove(model)
    patcher.forget_warnings()  # as in a fresh process: said once per process, and it was said above
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        accelpatch.apply(model, tier="high")  # asked at apply: said there
    assert [m for m in _accelpatch_warnings(record) if "no high fast path" in m]
    accelpatch.remove(model)


def test_a_model_with_a_high_fast_path_does_not_say_it_has_none():
    model, inputs = _sana_video()
    accelpatch.apply(model)
    assert "opts in to the approximate fast paths" in accelpatch.report(model).models[0].headline()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with accelpatch.quality("high"):
            _forward(model, inputs)
    assert not [m for m in _accelpatch_warnings(record) if "no high fast path" in m]
    accelpatch.remove(model)



def test_a_sparse_call_that_skipped_nothing_is_counted_once_not_handed_down():
    """MiniMax-H3's attention carries Sol-Attn (high) over the fused attention (lossless): a Sol-Attn call that ran
    but skipped nothing is counted by Sol-Attn with NOTHING_SKIPPED, and the site below never ran for it."""
    model = t.tiny_minimax_h3_transformer(dtype=torch.bfloat16)
    inputs = t.minimax_h3_transformer_inputs(model, num_video=96, video_timestep=0.1, audio_timestep=0.1)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0,
                     tau=-1e9)  # every pair exact
    with torch.no_grad():
        model(**inputs)
    sites = [s for s in accelpatch.report(model).models[0].sites if s.path == "transformer_blocks.0.attn"]
    assert [(s.kind, s.fast_calls, dict(s.reference_calls)) for s in sites] == [
        ("sol_attn", 0, {NOTHING_SKIPPED: 1}), ("minimax_h3_fused_attention", 0, {})]


def test_a_gated_class_prints_as_the_real_diffusers_class_wrapped_by_accelpatch():
    """Issue #32 item 4: messages printed "diffusers.models...GatedWanTransformerBlock", a class no diffusers module
    has. A gated class prints the real class (importable from where it says) and that accelpatch wrapped it."""
    import importlib

    model = t.tiny_wan_transformer(dtype=torch.bfloat16)
    accelpatch.apply(model)
    gated = type(model.blocks[0])
    assert repr(gated) == ("<class 'diffusers.models.transformers.transformer_wan.WanTransformerBlock', wrapped by "
                           "accelpatch as GatedWanTransformerBlock>")
    assert importlib.import_module(gated.__module__).WanTransformerBlock is gated.__mro__[1]
    assert f"{gated}" == repr(gated)  # what an f-string message (diffusers' registry error) shows
