"""What a user sees: the tier a given model runs under, options that cannot apply refused with the valid range,
errors that name the right function, readable notebook output, and the upstream kernel's fallbacks in the report."""
import sys
import types

import pytest
import torch

import accelpatch
from accelpatch.sol_attn.op import upstream
from accelpatch.testing import (minimax_h3_transformer_inputs, tiny_minimax_h3_pipeline, tiny_minimax_h3_transformer,
                                tiny_sana_video_pipeline, tiny_sana_video_transformer)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def test_current_quality_of_a_model_says_the_tier_it_runs_under():
    h3 = tiny_minimax_h3_pipeline()
    sana = tiny_sana_video_transformer()
    assert accelpatch.current_quality(h3) == "exact"  # not patched: untouched diffusers
    accelpatch.apply(h3, backend="sol_attn")
    accelpatch.apply(sana)
    assert accelpatch.current_quality() == "lossless"  # the context's tier ...
    assert accelpatch.current_quality(h3) == "high"  # ... is not what sol_attn-patched MiniMax-H3 runs at
    assert accelpatch.current_quality(h3.transformer) == "high"
    assert accelpatch.current_quality(sana) == "lossless"
    with accelpatch.quality("lossless"):
        assert accelpatch.current_quality(h3) == "lossless"
    with accelpatch.quality("high"):
        assert accelpatch.current_quality(sana) == "high"
    text = str(accelpatch.report(h3))
    assert "runs at tier high by default (backend sol_attn is approximate)" in text
    assert "runs at tier lossless by default" in str(accelpatch.report(sana))
    with pytest.raises(TypeError, match=r"^current_quality\(\) expects a diffusers pipeline"):
        accelpatch.current_quality(object())


def test_dense_layers_beyond_the_model_are_refused_naming_the_valid_range():
    model = tiny_minimax_h3_transformer()
    with pytest.raises(ValueError, match=r"dense_layers names layer\(s\) \[2, 7\].*2 transformer blocks, valid "
                                         r"layer indices are 0-1"):
        accelpatch.apply(model, backend="sol_attn", dense_layers="0,2,7")
    assert not hasattr(model, "_accelpatch_state")
    assert all(type(m).__name__ == "MiniMaxH3Attention" for n, m in model.named_modules() if n.endswith(".attn"))


@pytest.mark.parametrize("sink", [dict(sink_tokens=5000), dict(sink_tokens=64, sink_start=2000),
                                  dict(sink_tokens=10, sink_start=415)])
def test_a_sink_beyond_the_sequence_falls_back_with_the_valid_range(sink):
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=400)  # 420 rows: 6 text, 14 audio, 400 video
    seq = inputs["position_ids"].shape[0]
    reference = _forward(model, inputs)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, **sink)
    with pytest.warns(RuntimeWarning, match=rf"reaches past the sequence of {seq} rows; valid: "
                                            rf"sink_tokens <= {seq} and sink_start \+ sink_tokens <= {seq}"):
        assert torch.equal(_forward(model, inputs), reference)
    (reason, count), = accelpatch.report(model).fallback_calls.items()
    assert count == 2 and f"sink_tokens={sink['sink_tokens']}" in reason


def test_a_sink_inside_the_sequence_runs_sparse():
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=400)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, sink_tokens=20,
                     sink_start=0)
    _forward(model, inputs)
    rep = accelpatch.report(model)
    assert {s.path: s.fast_calls for s in rep.sites if s.kind == "sol_attn"} == {
        "transformer_blocks.0.attn": 1, "transformer_blocks.1.attn": 1}
    # Sol-Attn took both calls, so the lossless attention below it ran none
    assert [s.fast_calls for s in rep.sites if s.kind == "minimax_h3_fused_attention"] == [0, 0]


def test_errors_name_the_function_that_was_called():
    for name in ("remove", "report", "apply"):
        with pytest.raises(TypeError, match=rf"^{name}\(\) expects a diffusers pipeline .* got NoneType"):
            getattr(accelpatch, name)(None)


def test_unknown_sol_attn_options_are_named_with_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown sol_attn option\(s\) \['bogus'\]; valid options: tau, "
                                        r"thresh_type, dense_steps"):
        accelpatch.SolAttnConfig(bogus=1)
    with pytest.raises(TypeError, match=r"did you mean 'dense_step' → 'dense_steps'"):
        accelpatch.SolAttnConfig(dense_step=1)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['taus'\].*did you mean 'taus' → 'tau'"):
        accelpatch.apply(tiny_minimax_h3_transformer(), backend="sol_attn", taus=2.0)
    assert accelpatch.SolAttnConfig(tau=2.0).tau == 2.0


def test_notebook_output_is_the_report_table_not_the_pipeline():
    pipe = tiny_sana_video_pipeline()
    shown = accelpatch.apply(pipe)  # the last line of a notebook cell
    assert isinstance(shown, type(accelpatch.report(pipe)))
    text = repr(shown)
    assert text == str(shown) and text.startswith("SanaVideoTransformer3DModel (SANA-Video)")
    # eight fused-op lines and the site table: a page, not the pipeline's repr
    assert "transformer_blocks.0.attn1" in text and "AutoencoderKLWan" not in text and len(text) < 2500
    html = shown._repr_html_()
    # a header row and one row per site: per block, its lossless block, attn1's high and lossless sites, ff's GLUMB
    rows = [(s.path, s.tier) for s in shown.sites]
    assert rows == [(f"transformer_blocks.{n}{sub}", tier) for n in (0, 1) for sub, tier in
                    (("", "lossless"), (".attn1", "high"), (".attn1", "lossless"), (".ff", "lossless"))]
    assert html.count("<tr>") == 1 + len(rows) and "<table>" in html and "transformer_blocks.1.attn1" in html
    assert all(f"<td>{s.kind}</td>" in html for s in shown.sites)
    assert "<script" not in accelpatch.report(pipe)._repr_html_()
    assert accelpatch.remove(pipe) is None
    assert repr(accelpatch.report(pipe)) == "accelpatch: nothing is patched"


@pytest.fixture
def simulated_sm90(monkeypatch):
    """An SM 9.0 GPU with the CuTe runtime and an upstream package that must never be reached."""
    stub = types.ModuleType("sol_attn")

    def never(*args, **kwargs):
        raise AssertionError("upstream was called although it cannot run this call")

    stub.sol_attn = never
    monkeypatch.setitem(sys.modules, "sol_attn", stub)
    monkeypatch.setattr(upstream, "importable", lambda: True)
    monkeypatch.setattr(upstream, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(upstream, "cute_runtime_available", lambda: True)
    monkeypatch.setattr(upstream, "FALLBACKS", type(upstream.FALLBACKS)(upstream.FALLBACKS.what))


def test_upstream_that_cannot_run_a_layer_falls_back_to_our_kernel_not_to_dense(simulated_sm90):
    model = tiny_minimax_h3_transformer(dtype=torch.bfloat16)  # bf16, head dim 128: upstream's own format
    inputs = minimax_h3_transformer_inputs(model, num_video=1100)
    options = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    accelpatch.apply(model, impl="torch", **options)
    ours = _forward(model, inputs)
    accelpatch.apply(model, impl="upstream", kv_splits=2, **options)  # 2 splits need T > 4096 upstream
    with pytest.warns(RuntimeWarning, match="falls back to our implementation.*route group"):
        assert torch.equal(_forward(model, inputs), ours)
    rep = accelpatch.report(model)
    assert [s.fast_calls for s in rep.sites if s.kind == "sol_attn"] == [1, 1] and rep.fallback_calls == {}
    # bf16: the lossless blocks and SwiGLU gates ran too; the lossless attention below Sol-Attn got no call
    assert {(s.path, s.kind): s.fast_calls for s in rep.sites if s.tier == "lossless"} == {
        (f"transformer_blocks.{n}{sub}", kind): calls for n in (0, 1) for sub, kind, calls in
        (("", "minimax_h3_fused_block", 1), (".attn", "minimax_h3_fused_attention", 0),
         (".ff.net.0", "fused_swiglu", 1))}
    assert rep.fast_calls == 2 + 2 * 2
    notes = [n for s in rep.sites for n in s.notes]
    assert len(notes) == 2 and all("impl='upstream' ran our own kernel" in n and "route group" in n for n in notes)
    assert "impl='upstream' ran our own kernel" in str(rep)
