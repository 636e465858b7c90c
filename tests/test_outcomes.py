"""Issue #33: one outcome vocabulary. Every call of a fast path is "ran", "declined: <reason>" or
"not applicable: <reason>", in the types a fast path returns, in the report's per-site outcomes and in its table."""
import pytest
import torch

import accelpatch
from accelpatch.core import outcomes
from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs


def test_an_outcome_text_is_one_of_the_three_kinds_and_anything_else_is_refused_naming_them():
    assert outcomes.kind_of("ran") == "ran"
    assert outcomes.kind_of(outcomes.declined("no CUDA")) == "declined"
    assert outcomes.kind_of(outcomes.not_applicable("dense step 0")) == "not applicable"
    assert str(outcomes.Declined("a guard")) == "declined: a guard"
    assert str(outcomes.NotApplicable("tier exact")) == "not applicable: tier exact"
    with pytest.raises(ValueError, match=r"'fused' is not an outcome: one of 'ran', 'declined: <reason>', "
                                         r"'not applicable: <reason>'"):
        outcomes.kind_of("fused")


def test_the_old_names_of_the_two_outcomes_are_the_new_types():
    from accelpatch.core.sites import Decline, Dense

    assert Decline is outcomes.Declined and Dense is outcomes.NotApplicable


def test_a_report_sorts_every_call_into_the_vocabulary():
    torch.manual_seed(0)
    model = tiny_wan_transformer()
    inputs = wan_transformer_inputs(model)
    accelpatch.apply(model)
    with torch.no_grad():
        with accelpatch.quality("exact"):
            model(**inputs)
        model(**inputs)
    report = accelpatch.report(model)
    blocks = [s for s in report.sites if s.path == "blocks.0"]
    assert len(blocks) == 1
    site = blocks[0]
    # the exact call: not applicable (the tier), never declined; the lossless call ran or was counted as one kind
    assert site.outcomes["not applicable"].get("tier exact does not admit lossless") == 1
    assert site.outcomes["declined"] == {}
    assert site.outcomes["ran"] + sum(site.outcomes["not applicable"].values()) == 2
    header, rows, notes = report.models[0].table()
    assert header[4:] == ("ran", "did not run: declined / not applicable (by reason)")
    assert "not applicable: tier exact does not admit lossless" in notes
    accelpatch.remove(model)


# -- issue #40, item 1: a kernel's by-design limits are "not applicable", a mismatch or an error is "declined" ------

def _stand_in(op, *, check=lambda *args: None, run=None):
    """``op``'s CPU kernel with another check or run, on a library that admits everything but the check."""
    from accelpatch.lossless.kernels.library import Kernel, KernelLibrary

    library = KernelLibrary("cpu", "CPU", lambda name, check, args, **options: check(*args))
    real = op.kernels["cpu"]
    return Kernel(op.name, library, run or real.run, check, real.options)


def _wan_bf16():
    torch.manual_seed(0)
    model = tiny_wan_transformer(dtype=torch.bfloat16)
    return model, wan_transformer_inputs(model)


def _outcomes_of(model, op_name):
    counts = {}
    for site in accelpatch.report(model).sites:
        for outcome, n in site.fused_ops.get(op_name, {}).items():
            counts[outcome] = counts.get(outcome, 0) + n
    return counts


def test_arguments_a_kernel_does_not_take_by_design_are_not_applicable_even_under_strict(recwarn):
    from accelpatch.lossless.ops import MODULATE

    model, inputs = _wan_bf16()
    with torch.no_grad():
        expected = model(**inputs).sample
    accelpatch.apply(model, strict=True)
    with MODULATE.substituted(_stand_in(MODULATE, check=lambda *args: "runs with one CPU thread only (a test)")):
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(model(**inputs).sample, expected)
        counts = _outcomes_of(model, "modulate")
    assert counts and set(counts) == {"not applicable: runs with one CPU thread only (a test)"}, counts
    assert not [w for w in recwarn if "modulate" in str(w.message)]
    assert not any(f.declined for f in accelpatch.report(model).models[0].fusions if f.op == "modulate")
    accelpatch.remove(model)


def test_a_kernel_that_gives_other_bits_is_declined_and_strict_raises():
    from accelpatch.core.errors import FastPathUnavailableError
    from accelpatch.lossless.ops import MODULATE

    model, inputs = _wan_bf16()
    accelpatch.apply(model, strict=True)
    wrong = _stand_in(MODULATE, run=lambda *args: MODULATE.reference(*args) + 1)
    with MODULATE.substituted(wrong), torch.no_grad():
        with pytest.raises(FastPathUnavailableError, match="lossless fusion modulate .* could not run: .*differ"):
            model(**inputs)
    accelpatch.remove(model)


def test_strict_sana_video2_runs_its_default_tier_on_several_threads():
    """SANA-Video 2.0's complex RoPE op reproduces eager on one thread only: on more it is not applicable, so
    strict=True runs the default tier instead of raising on every call (it did, from rotary_complex_pair)."""
    from accelpatch.testing import sana_video2_pipeline_call_kwargs, tiny_sana_video2_pipeline

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        reference = tiny_sana_video2_pipeline()(**sana_video2_pipeline_call_kwargs()).frames
        pipe = tiny_sana_video2_pipeline()
        accelpatch.apply(pipe, strict=True)
        frames = pipe(**sana_video2_pipeline_call_kwargs()).frames
        counts = _outcomes_of(pipe.transformer, "rotary_complex_pair")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(frames, reference)  # the unpatched pipeline on the same two threads
    assert counts and all(k.startswith("not applicable: rotary_complex_pair runs with one CPU thread only")
                          for k in counts), counts
    accelpatch.remove(pipe)


# -- issue #40, item 5: the default tier's size floor ----------------------------------------------------------------

def test_calls_under_the_size_floor_run_the_original_forward_counted_as_not_applicable(monkeypatch):
    """On the tiny pipelines the default tier ran ~8 % slower than unpatched: every call paid the restated forward
    and the fused ops' calls where no fused op can save anything. Calls whose largest tensor is under the floor
    (65,536 elements by default) run the original forward; the suite sets the floor to 0 (tests/conftest.py)."""
    from accelpatch.core import sites

    assert sites.DEFAULT_MIN_ELEMENTS == 65_536
    model, inputs = _wan_bf16()
    with torch.no_grad():
        expected = model(**inputs).sample
    accelpatch.apply(model)
    monkeypatch.setattr(sites, "MIN_ELEMENTS", 10**9)  # every call of the tiny model is under it
    with torch.no_grad():
        assert torch.equal(model(**inputs).sample, expected)
    lossless = [s for s in accelpatch.report(model).sites if s.tier == "lossless"]
    assert lossless and all(s.fast_calls == 0 for s in lossless)
    assert all(s.outcomes["not applicable"] == {sites.small_call_reason(10**9): 1} for s in lossless), [
        s.outcomes for s in lossless]
    assert "fewer than 1,000,000,000 elements" in sites.small_call_reason(10**9)
    assert not _outcomes_of(model, "modulate")  # no fused op was even asked
    monkeypatch.setattr(sites, "MIN_ELEMENTS", 1)  # every call is over it: the fused paths run
    with torch.no_grad():
        assert torch.equal(model(**inputs).sample, expected)
    assert _outcomes_of(model, "modulate").get("ran")
    accelpatch.remove(model)


def test_the_size_floor_is_read_from_the_environment_and_a_bad_value_is_named(monkeypatch):
    from accelpatch.core import sites

    monkeypatch.delenv("ACCELPATCH_FUSE_MIN_ELEMENTS", raising=False)
    assert sites._min_elements() == 65_536
    monkeypatch.setenv("ACCELPATCH_FUSE_MIN_ELEMENTS", "1_000")
    assert sites._min_elements() == 1000
    monkeypatch.setenv("ACCELPATCH_FUSE_MIN_ELEMENTS", "lots")
    with pytest.raises(ValueError, match=r"ACCELPATCH_FUSE_MIN_ELEMENTS='lots' is not a number of elements: give an "
                                         r"integer >= 0 \(0 fuses every call; unset: 65536\)"):
        sites._min_elements()
