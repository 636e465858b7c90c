"""sol_attn's ``dense_rows`` on MiniMax-H3: with "text_audio" (the default) the text and audio query rows are the
model's own dense attention bit for bit and the video rows are the plain sparse ones; "none" leaves every row sparse.
A split that is off by one row is caught; rows that are not one contiguous range are gathered (counted); the report's
``sparse_row_fraction`` counts video rows only; bad values are refused before any module is touched."""

import pytest
import torch

import accelpatch
from accelpatch.models.minimax_h3 import high as h3_high
from accelpatch.testing import minimax_h3_layout, minimax_h3_transformer_inputs, tiny_minimax_h3_transformer

ROWS = 1100  # video rows: with 6 text and 8 audio rows, 1,114 rows (18 blocks of 64), enough to be sparse
#: sparse from the first step and layer on, at every length (1,114 rows lie below the default min_tokens floor)
SPARSE = dict(dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)


@pytest.fixture(scope="module")
def setup():
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=ROWS)
    shuffled = minimax_h3_transformer_inputs(model, num_video=ROWS, layout="shuffled")
    hidden = torch.randn(1, inputs["position_ids"].shape[0], model.config.hidden_size,
                         generator=torch.Generator().manual_seed(0))
    return model, inputs, shuffled, hidden


def _attention(model, inputs, hidden, **options):
    """Layer 0's attention module on ``hidden`` with the packed layout of ``inputs``: unpatched (no options), or
    patched with sol_attn and ``options`` at a sparse step. Returns (output, report)."""
    attn = model.transformer_blocks[0].attn
    rope = model.rope(inputs["position_ids"])
    try:
        with torch.no_grad():
            if not options:
                return attn(hidden, rope), None
            accelpatch.apply(model, backend="sol_attn", **{**SPARSE, **options})
            with accelpatch.denoising_step(5):
                token = h3_high._layout.set(h3_high.layout_from_token_tags(inputs["token_tags"]))
                try:
                    out = attn(hidden, rope)
                finally:
                    h3_high._layout.reset(token)
            return out, accelpatch.report(model)
    finally:
        accelpatch.remove(model)


def _same(a, b):
    """Bit identity with dtype, shape and stride checks (fp32: compared as int32 bits)."""
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)))


def _rows_check(out, dense, sparse_only, rows):
    """The dense_rows contract: ``rows`` of ``out`` are the dense attention's, every other row is the all-sparse
    run's (``sparse_only``). Returns a list of what fails (empty when it holds)."""
    others = torch.ones(out.shape[1], dtype=torch.bool)
    others[rows] = False
    failures = []
    if not _same(out[:, rows], dense[:, rows]):
        failures.append("text/audio rows differ from the dense attention")
    if not _same(out[:, others], sparse_only[:, others]):
        failures.append("video rows differ from the sparse output")
    return failures


@pytest.fixture(scope="module")
def runs(setup):
    model, inputs, _, hidden = setup
    dense, _ = _attention(model, inputs, hidden)
    text_audio, report = _attention(model, inputs, hidden, dense_rows="text_audio")
    plain, plain_report = _attention(model, inputs, hidden, dense_rows="none")
    default, default_report = _attention(model, inputs, hidden, tau=SPARSE["tau"])  # dense_rows left to its default
    return dict(dense=dense, text_audio=text_audio, report=report, plain=plain, plain_report=plain_report,
                default=default, default_report=default_report)


def test_text_audio_rows_are_the_models_dense_rows_and_video_rows_the_sparse_ones(setup, runs):
    _, inputs, _, _ = setup
    layout = minimax_h3_layout(inputs)  # independent of the adapter: from the index tensors
    assert layout.prefix_rows == 14 and layout.video_start == 14
    rows = torch.arange(layout.prefix_rows)
    assert _rows_check(runs["text_audio"], runs["dense"], runs["plain"], rows) == []
    # the video rows really ran sparse, and with dense_rows="none" the text/audio rows do too
    video = slice(layout.video_start, None)
    assert not torch.allclose(runs["plain"][:, video], runs["dense"][:, video], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(runs["plain"][:, rows], runs["dense"][:, rows], atol=1e-6, rtol=1e-6)


def test_a_split_off_by_one_row_is_caught(setup, runs, monkeypatch):
    model, inputs, _, hidden = setup
    rows = torch.arange(minimax_h3_layout(inputs).prefix_rows)
    for shift, failure in ((-1, "text/audio rows differ from the dense attention"),
                           (1, "video rows differ from the sparse output")):
        monkeypatch.setattr(h3_high.PackedLayout, "dense_rows",
                            lambda self, s=shift: slice(self.sink_start, self.sink_start + self.sink_tokens + s))
        wrong, _ = _attention(model, inputs, hidden, dense_rows="text_audio")
        assert failure in _rows_check(wrong, runs["dense"], runs["plain"], rows), shift


def test_the_default_is_text_audio_and_none_is_sol_attn_alone(runs):
    assert accelpatch.SolAttnConfig().dense_rows == "text_audio"
    assert _same(runs["default"], runs["text_audio"])
    assert runs["plain_report"].fallback_calls == {} and runs["report"].fallback_calls == {}


def test_the_report_counts_only_video_rows_as_sparse(setup, runs):
    _, inputs, _, _ = setup
    layout = minimax_h3_layout(inputs)
    site = next(s for s in runs["report"].sites if s.path == "transformer_blocks.0.attn" and s.kind == "sol_attn")
    plain = next(s for s in runs["plain_report"].sites
                 if s.path == "transformer_blocks.0.attn" and s.kind == "sol_attn")
    assert site.fast_calls == plain.fast_calls == 1
    assert site.stats["sparse_row_fraction"] == pytest.approx(layout.num_video / layout.sequence_length, abs=1e-12)
    assert plain.stats["sparse_row_fraction"] == 1.0
    assert 0 < site.stats["exact_fraction"] < 1 and site.notes == {}
    assert "sparse_row_fraction" in str(runs["report"])


def test_rows_that_are_not_contiguous_are_gathered_and_counted(setup):
    model, _, shuffled, hidden = setup
    layout = minimax_h3_layout(shuffled)
    assert layout.prefix_rows is None  # not a prefix
    rows = torch.cat([shuffled["text_indices"], shuffled["audio_indices"]]).sort().values
    dense, _ = _attention(model, shuffled, hidden)
    plain, _ = _attention(model, shuffled, hidden, dense_rows="none")
    out, report = _attention(model, shuffled, hidden, dense_rows="text_audio")
    assert _rows_check(out, dense, plain, rows) == []
    site = next(s for s in report.sites if s.path == "transformer_blocks.0.attn" and s.kind == "sol_attn")
    assert site.notes == {h3_high.GATHERED_ROWS: 1} and report.fallback_calls == {}
    assert site.stats["sparse_row_fraction"] == pytest.approx(1 - rows.numel() / layout.sequence_length, abs=1e-12)


def test_a_call_without_a_layout_says_its_rows_ran_sparse(setup):
    model, inputs, _, hidden = setup
    attn = model.transformer_blocks[0].attn
    rope = model.rope(inputs["position_ids"])
    for option, notes in (("text_audio", {h3_high.NO_LAYOUT_ROWS: 1}), ("none", {})):
        accelpatch.apply(model, backend="sol_attn", dense_rows=option, **SPARSE)
        try:
            with torch.no_grad(), accelpatch.denoising_step(5):
                attn(hidden, rope)  # no model forward, so no token_tags: no layout
            site = next(s for s in accelpatch.report(model).sites
                        if s.path == "transformer_blocks.0.attn" and s.kind == "sol_attn")
        finally:
            accelpatch.remove(model)
        assert site.fast_calls == 1 and site.notes == notes and site.stats["sparse_row_fraction"] == 1.0


def test_whole_model_forward_outside_high_is_the_reference_and_high_differs_by_option(setup):
    model, inputs, _, _ = setup
    with torch.no_grad():
        reference = model(**inputs).sample
        outs = {}
        for option in ("text_audio", "none"):
            accelpatch.apply(model, backend="sol_attn", dense_rows=option, **SPARSE)
            try:
                for tier in ("exact", "lossless"):
                    with accelpatch.quality(tier):
                        assert _same(model(**inputs).sample, reference), (option, tier)
                outs[option] = model(**inputs).sample
            finally:
                accelpatch.remove(model)
    assert not torch.equal(outs["text_audio"], outs["none"])  # the option reaches the model's sparse calls


@pytest.mark.parametrize("value,match", [
    ("audio", r"dense_rows must be one of 'text_audio', 'none' .*got 'audio'$"),
    (False, r"got False \(a string: in YAML write dense_rows: none"),
    (None, r"got None \(a string"),
])
def test_bad_dense_rows_are_refused_before_any_module_is_touched(value, match):
    model = tiny_minimax_h3_transformer()
    with pytest.raises(ValueError, match=match):
        accelpatch.apply(model, backend="sol_attn", dense_rows=value)
    assert not hasattr(model, "_accelpatch_state")
    assert all(type(m).__name__ == "MiniMaxH3Attention" for n, m in model.named_modules() if n.endswith(".attn"))
    with pytest.raises(TypeError, match=r"did you mean 'dense_row' → 'dense_rows'"):
        accelpatch.SolAttnConfig(dense_row="none")


def test_a_recipe_with_a_yaml_boolean_dense_rows_is_refused_with_the_fix():
    import yaml

    from accelpatch.recipes import load_recipe

    recipe = load_recipe({"name": "rows", "model": "tiny:minimax-h3", "backend": "sol_attn",
                          "options": yaml.safe_load("{dense_steps: 0, dense_rows: false}")})
    model = tiny_minimax_h3_transformer()
    with pytest.raises(ValueError, match=r"dense_rows must be one of 'text_audio', 'none' .*got False .*in YAML"):
        accelpatch.apply(model, recipe=recipe)
    assert not hasattr(model, "_accelpatch_state")
    accelpatch.apply(model, recipe=load_recipe({**recipe.model_dump(exclude_defaults=True),
                                                "options": {"dense_rows": "none", "dense_layers": ""}}))
    from accelpatch.core.patcher import patch_of

    assert patch_of(model).backend.dense_rows == "none"
    accelpatch.remove(model)


# --- the dense-row count inside a compiled region (torch 2.11's Dynamo refuses slice.indices) -------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from accelpatch.sol_attn.sites import slice_length  # noqa: E402

_bound = st.one_of(st.none(), st.integers(-12, 12))


@settings(max_examples=300, deadline=None)
@given(start=_bound, stop=_bound, step=st.one_of(st.none(), st.integers(-4, 4).filter(bool)), n=st.integers(0, 10))
def test_slice_length_is_the_length_of_the_rows_the_slice_takes(start, stop, step, n):
    rows = slice(start, stop, step)
    assert slice_length(rows, n) == len(range(*rows.indices(n))) == len(list(range(n))[rows])


def test_slice_length_refuses_a_zero_step_as_slice_indices_does():
    with pytest.raises(ValueError):
        slice(0, 3, 0).indices(4)
    with pytest.raises(ValueError, match="zero"):
        slice_length(slice(0, 3, 0), 4)


def test_slice_length_traces_under_fullgraph_compile():
    """The count runs inside compiled attention: it must trace without a break (slice.indices does not, on 2.11)."""
    def count(x):
        return x * slice_length(slice(1, x.shape[0] - 1), x.shape[0])

    x = torch.ones(6)
    compiled = torch.compile(count, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), x * 4)
