"""apply/remove/report on SANA-Video: which of its sites stand aside and why, sglang's markers, a requested fast path
that cannot run is never silent, threads, foreign hooks, compile's counts. What every family keeps (the default tiers
are untouched diffusers' bits, remove() restores, saved files never change, ...) is tests/test_family_contract.py's."""
import copy
import threading
import warnings

import pytest
import torch
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.core.sites import NO_FUSED_OP_COMPILED
from accelpatch.lossless import verify
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.core.reporting import merge_counts
from accelpatch.models.sana_video.linear_attention import FUSION
from accelpatch.testing import (
    sana_video_pipeline_call_kwargs,
    sana_video_transformer_inputs,
    tiny_sana_video_pipeline,
    tiny_sana_video_transformer,
)

MARKER, ENABLED = "_sgl_sana_video_linear_attention_site", "_sgl_sana_video_linear_attention_enabled"  # sglang's names


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _attn1(model):
    return [m for name, m in model.named_modules() if name.endswith("attn1")]


def _high(report):
    """The sites of the approximate (high) fast path; the lossless fused sites are tested in test_lossless_fusions."""
    return [s for s in report.sites if s.tier == "high"]


def _lossless(report):
    return [s for s in report.sites if s.tier == "lossless"]


def _kind(report, kind):
    return [s for s in report.sites if s.kind == kind]


EXACT_LOSSLESS = "tier exact does not admit lossless"
GLUMB_FP32 = "activations are torch.float32: GLUMB's fused chains are bfloat16 tables"


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def dtype(request):
    return request.param


def test_in_float32_glumb_alone_stands_aside_saying_why(dtype):
    """What the family contract leaves open (tests/test_family_contract.py: a lossless site runs every call or says
    why it does not apply): here only GLUMB's sites stand aside, in float32 only, and the others run every call."""
    model = tiny_sana_video_transformer(dtype=dtype)
    inputs = sana_video_transformer_inputs(model)
    accelpatch.apply(model)
    _forward(model, inputs)
    report = accelpatch.report(model)
    standing = [s for s in _lossless(report) if s.fast_calls == 0]
    assert [s.kind for s in standing] == (["sana_video_fused_glumb"] * 2 if dtype == torch.float32 else [])
    assert all(s.reference_calls == {GLUMB_FP32: 1} for s in standing)
    assert all(s.fast_calls == 1 and s.reference_calls == {} for s in _lossless(report) if s not in standing)


def test_a_pipeline_call_without_guidance_is_bit_identical_and_counted_per_site():
    """Batch 1 (no classifier-free guidance; the contract's call is the builder's CFG one), counted per site kind."""
    reference_pipe = tiny_sana_video_pipeline(seed=3)
    call = lambda: sana_video_pipeline_call_kwargs(seed=7, guidance_scale=1.0)  # noqa: E731
    expected = reference_pipe(**call()).frames
    pipe = tiny_sana_video_pipeline(seed=3)
    accelpatch.apply(pipe)
    assert type(pipe.transformer.transformer_blocks[0].attn1).__name__ == "GatedAttention"
    for tier in (None, "exact", "lossless"):
        if tier is None:
            frames = pipe(**call()).frames
        else:
            with accelpatch.quality(tier):
                frames = pipe(**call()).frames
        assert torch.equal(frames, expected), tier
    rep = accelpatch.report(pipe)
    high = _high(rep)
    assert sum(s.fast_calls for s in high) == 0
    assert sum(sum(s.reference_calls.values()) for s in high) == 3 * 2 * 2  # 3 calls × 2 steps × 2 sites
    # the block and attn1 fusions ran in the default and lossless calls (2 steps each) and stood aside in the exact
    # one; the pipeline is float32, so GLUMB's bf16 chains kept every call on the reference, saying why
    for kind in ("sana_video_fused_block", "sana_video_fused_linear_attention"):
        assert [(s.fast_calls, s.reference_calls) for s in _kind(rep, kind)] == [(2 * 2, {EXACT_LOSSLESS: 2})] * 2
    assert [(s.fast_calls, s.reference_calls) for s in _kind(rep, "sana_video_fused_glumb")] == \
        [(0, {GLUMB_FP32: 2 * 2, EXACT_LOSSLESS: 2})] * 2


def test_high_on_cpu_falls_back_loudly_and_stays_bit_identical():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    reference = _forward(model, inputs)
    with pytest.warns(RuntimeWarning, match="was not mounted.*CUDA is unavailable") as record:
        accelpatch.apply(model)  # the rejection is announced where it is decided
    assert len([w for w in record if "accelpatch" in str(w.message)]) == 1  # once per model and reason
    assert record[0].filename == __file__  # pointing at the user's apply() line
    rep = accelpatch.report(model)
    assert all(not s.mounted and "CUDA is unavailable" in s.reason for s in _high(rep))
    assert all(s.mounted for s in _lossless(rep))  # the bit-exact fusions need no CUDA
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once already: the calls do not warn again
        with accelpatch.quality("high"):
            out = _forward(model, inputs)
            out2 = _forward(model, inputs)
    assert torch.equal(out, reference) and torch.equal(out2, reference)
    rep = accelpatch.report(model)
    assert sum(s.fast_calls for s in _high(rep)) == 0
    (reason, count), = rep.fallback_calls.items()
    assert "CUDA is unavailable" in reason and count == 2 * len(_high(rep))
    assert "rejected" in str(rep) and "CUDA is unavailable" in str(rep)
    rep.assert_fast_path_ran()  # the lossless fusions did run


def test_strict_raises_instead_and_leaves_the_model_intact():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=1)
    reference = _forward(model, inputs)
    state = copy.deepcopy(model.state_dict())
    accelpatch.apply(model, strict=True)
    with pytest.raises(FastPathUnavailableError, match="CUDA is unavailable.*strict=False"):
        with accelpatch.quality("high"):
            _forward(model, inputs)
    assert accelpatch.current_quality() == "lossless"
    assert torch.equal(_forward(model, inputs), reference)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_sglangs_markers_stack_mount_once_and_go_with_remove():
    """The marker pair sglang reads, on the stacked attn1 sites; apply twice keeps them, remove() takes them and the
    split-aware processor away (the rest of apply/remove is tests/test_family_contract.py's)."""
    model = tiny_sana_video_transformer()
    original_types = {name: type(m) for name, m in model.named_modules()}

    accelpatch.apply(model)
    sites = _attn1(model)
    assert len(sites) == 2
    for m in sites:  # the high path's site, and the lossless one stacked under it with its own marker
        lossless = getattr(m, "_accelpatch_sana_video_fused_linear_attention_site")
        assert getattr(m, MARKER).below is lossless and lossless.below is None
        assert getattr(m, MARKER).path.endswith("attn1") and getattr(m, ENABLED) is False
        assert isinstance(m, original_types["transformer_blocks.0.attn1"])
        assert type(m.processor).__name__ == "SplitLinearAttnProcessor"  # diffusers' own, split-aware (idle unsplit)
    first_sites = [getattr(m, MARKER) for m in sites]
    accelpatch.apply(model)
    assert [getattr(m, MARKER) for m in _attn1(model)] == first_sites  # the same patch, not a second layer
    assert len(_high(accelpatch.report(model))) == 2
    assert len(accelpatch.report(model).sites) == 2 * 4  # per block: itself, attn1 (two paths), ff

    accelpatch.remove(model)
    for m in _attn1(model):
        assert not hasattr(m, MARKER) and not hasattr(m, ENABLED)
        assert type(m.processor).__name__ == "SanaLinearAttnProcessor3_0"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="expects a diffusers pipeline"):
        accelpatch.apply(object())
    model = tiny_sana_video_transformer()
    with pytest.raises(ValueError, match=r"unknown backend 'fastest'; available backends"):
        accelpatch.apply(model, backend="fastest")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['tau'\]"):
        accelpatch.apply(model, tau=1.0)
    with pytest.raises(ValueError, match="strict must be True or False"):
        accelpatch.apply(model, strict="yes")
    assert not hasattr(model, "_accelpatch_state")
    assert all(type(m).__name__ == "Attention" for m in _attn1(model))


def test_enabled_attribute_reflects_the_calling_context():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
    site = _attn1(model)[0]
    assert FUSION.record(site).mounted
    assert getattr(site, ENABLED) is False and not FUSION.is_enabled(site)
    with accelpatch.quality("high"):
        assert getattr(site, ENABLED) is True and FUSION.is_enabled(site)
        with accelpatch.quality("exact"):
            assert getattr(site, ENABLED) is False
    seen = {}

    def reader(tier):
        with accelpatch.quality(tier):
            seen[tier] = getattr(site, ENABLED)

    threads = [threading.Thread(target=reader, args=(t,)) for t in ("high", "lossless")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"high": True, "lossless": False}


def test_two_threads_with_different_tiers_share_one_model():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
        alone = {}
        for tier in ("exact", "high"):
            with accelpatch.quality(tier):
                alone[tier] = _forward(model, inputs)
        accelpatch.report(model, reset=True)

        barrier = threading.Barrier(2)
        together = {}

        def worker(tier):
            with accelpatch.quality(tier):
                for _ in range(3):
                    barrier.wait()
                    together.setdefault(tier, []).append(_forward(model, inputs))

        threads = [threading.Thread(target=worker, args=(t,)) for t in ("exact", "high")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for tier, outs in together.items():
        assert len(outs) == 3 and all(torch.equal(o, alone[tier]) for o in outs)
    rep = accelpatch.report(model)
    # Only the high thread took the fast path: 3 forwards × 2 sites; the exact thread ran the reference.
    high = _high(rep)
    assert sum(s.fast_calls for s in high) == 6
    assert merge_counts(s.reference_calls for s in high) == {"tier exact does not admit high": 6}
    # the lossless paths below the high one ran in neither thread (the high one took the high thread's calls, and
    # passed the exact thread's down, where exact stands aside too); the others (block, ff) ran in the high one only
    below = _kind(rep, "sana_video_fused_linear_attention")
    assert [(s.fast_calls, s.reference_calls) for s in below] == [(0, {EXACT_LOSSLESS: 3})] * 2
    others = [s for s in _lossless(rep) if s not in below]
    assert len(others) == 4
    assert all(s.fast_calls == 3 and s.reference_calls == {EXACT_LOSSLESS: 3} for s in others)


def test_exception_inside_a_quality_block_leaves_everything_as_it_was():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    with pytest.raises(RuntimeError):
        with accelpatch.quality("high"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                bad = dict(inputs, hidden_states=inputs["hidden_states"][:, :3])  # wrong channel count
                _forward(model, bad)
    assert accelpatch.current_quality() == "lossless"
    assert torch.equal(_forward(model, inputs), reference)


def test_a_module_hooked_by_accelerate_before_apply_still_routes_through_the_gate():
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    reference = _forward(model, inputs)
    attn = model.transformer_blocks[0].attn1
    add_hook_to_module(attn, ModelHook())
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
        with accelpatch.quality("high"):
            fast = _forward(model, inputs)
    rep = accelpatch.report(model)
    hooked = {s.kind: s.fast_calls for s in rep.sites if s.path == "transformer_blocks.0.attn1"}
    assert hooked == {"sana_video_linear_attention": 1, "sana_video_fused_linear_attention": 0}  # the gated forward
    torch.testing.assert_close(fast.float(), reference.float(), atol=2e-2, rtol=2e-2)
    accelpatch.remove(model)
    assert type(attn).__name__ == "Attention"
    assert torch.equal(_forward(model, inputs), reference)
    remove_hook_from_module(attn)
    assert torch.equal(_forward(model, inputs), reference)


def test_a_bound_forward_on_the_instance_before_apply_is_followed():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    attn = model.transformer_blocks[1].attn1
    attn.forward = attn.forward  # what a foreign hook does: a bound forward on the instance
    with run_fast_paths_on_cpu():
        accelpatch.apply(model)
        with accelpatch.quality("high"):
            _forward(model, inputs)
    rep = accelpatch.report(model)
    assert all(s.mounted for s in rep.sites)
    followed = {s.kind: s.fast_calls for s in rep.sites if s.path == "transformer_blocks.1.attn1"}
    assert followed == {"sana_video_linear_attention": 1, "sana_video_fused_linear_attention": 0}
    accelpatch.remove(model)
    assert attn.forward.__func__ is type(attn).forward  # the instance slot holds the original forward again
    assert torch.equal(_forward(model, inputs), reference)


def test_an_instance_forward_that_cannot_be_followed_rejects_the_model_with_a_warning():
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    attn = model.transformer_blocks[1].attn1
    own = attn.forward
    attn.forward = lambda *args, **kwargs: own(*args, **kwargs)  # a wrapper hiding the bound forward
    with run_fast_paths_on_cpu():
        with pytest.warns(RuntimeWarning, match="was not mounted.*cannot follow.*apply accelpatch before"):
            accelpatch.apply(model)
    rep = accelpatch.report(model)
    for kind in ("sana_video_linear_attention", "sana_video_fused_linear_attention"):  # both paths on attn1
        first, second = _kind(rep, kind)
        assert not first.mounted and not second.mounted
        assert "apply accelpatch before adding that hook" in second.reason
        assert "model rejected at transformer_blocks.1.attn1" in first.reason
    # the block and GLUMB fusions sit on other modules, whose forwards are not wrapped
    assert all(s.mounted for s in _kind(rep, "sana_video_fused_block") + _kind(rep, "sana_video_fused_glumb"))


def test_torch_compile_of_a_patched_model_runs_and_stays_bit_identical():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    reference = _forward(model, inputs)
    accelpatch.apply(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    assert torch.equal(_forward(compiled, inputs), reference)
    with accelpatch.quality("exact"):
        assert torch.equal(_forward(compiled, inputs), reference)
    # per site kind over the 2 blocks: high never ran; the default call ran the block and attn1 paths (GLUMB's are
    # bf16 only: this model is float32), whose fused ops stood aside in the graph; the exact call ran no fusion
    rep = accelpatch.report(model)
    assert rep.reference_calls == {"tier lossless does not admit high": 2, "tier exact does not admit high": 2,
                                   EXACT_LOSSLESS: 3 * 2, GLUMB_FP32: 2, NO_FUSED_OP_COMPILED: 4}
    assert [s.reference_calls.get(NO_FUSED_OP_COMPILED) for s in _lossless(rep)
            if s.kind != "sana_video_fused_glumb"] == [1] * 4
    assert rep.fast_calls == 0
    # inside the compiled graph the fused ops ran their reference chains, counted with the reason
    fusions = {f.op: f for f in rep.models[0].fusions}
    assert fusions["modulate"].fused_calls == 0
    assert fusions["modulate"].reference_calls == {verify.IN_COMPILE: 2 * 2}  # 2 blocks × norm1/norm2
