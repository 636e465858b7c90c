"""report()'s table says each thing once and plainly (once: one cause showed as two notes, with a block-0 reason
on every other row; a model with no sites printed an empty table under "opts in to the approximate fast paths";
SANA-Video 2.0's header printed a Python set)."""
import warnings

import pytest
from diffusers.models.attention_processor import AttnProcessor2_0
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.testing import tiny_minimax_h3_transformer, tiny_sana_video2_transformer, tiny_sana_video_transformer


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_one_rejected_site_is_one_note():
    model = tiny_sana_video_transformer()
    model.transformer_blocks[1].attn1.processor = AttnProcessor2_0()
    with run_fast_paths_on_cpu():
        text = str(accelpatch.apply(model))
    notes = [line for line in text.splitlines() if line.strip().startswith("[")]
    assert len(notes) == 1, text
    assert "AttnProcessor2_0" in notes[0] and "at transformer_blocks.1.attn1" in notes[0]
    # every attn1 row of both blocks, the high site and the lossless one stacked below it, refers to that one note;
    # the block and GLUMB sites do not read the processor and stay mounted
    rows = {(line.split()[0], line.split()[1]): line for line in text.splitlines()
            if line.strip().startswith("transformer_blocks.")}
    rejected = {key for key, line in rows.items() if "rejected [1]" in line}
    assert rejected == {(f"transformer_blocks.{i}.attn1", kind) for i in (0, 1)
                        for kind in ("sana_video_linear_attention", "sana_video_fused_linear_attention")}, text
    assert len(rows) == 8 and text.count("rejected [1]") == 4 and "model rejected at" not in text


def test_a_model_without_sites_shows_no_empty_table_and_promises_nothing():
    # every block of a model carries lossless sites now, so only a model without blocks has none
    text = str(accelpatch.apply(tiny_minimax_h3_transformer(num_layers=0)))
    assert "site  kind" not in text and "opts in" not in text and "lossless fusions" not in text, text
    assert "0 sites" in text and "runs unchanged" in text


def test_minimax_h3_without_a_backend_lists_its_lossless_sites():
    text = str(accelpatch.apply(tiny_minimax_h3_transformer()))
    assert "6 sites" in text and "runs at tier lossless by default" in text and "runs unchanged" not in text, text
    kinds = [line.split()[1] for line in text.splitlines() if line.strip().startswith("transformer_blocks.")]
    assert kinds == ["minimax_h3_fused_block", "minimax_h3_fused_attention", "fused_swiglu"] * 2, text


def test_layer_sets_read_as_a_user_writes_them():
    model = tiny_sana_video2_transformer()
    assert "anchor_fp32_layers=none" in str(accelpatch.apply(model, anchor_fp32_layers=""))
    assert "anchor_fp32_layers=3:" in str(accelpatch.apply(model, anchor_fp32_layers="3"))


def test_one_cause_one_note_and_no_saving_claimed():
    """#40: a rejected site's calls got a second note ("declined: not mounted: ...") for the cause the site's own
    note already gave, one per site path; the fusion lines claimed "saved ≈" / "cost ≈ 0.0 ms more" from the ops'
    own first-sight times (the gate's time not counted); an op never called had a line with no reason."""
    import warnings

    from accelpatch.testing import sana_video2_pipeline_call_kwargs, tiny_sana_video2_pipeline

    pipe = tiny_sana_video2_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not mounted here: no CUDA
        accelpatch.apply(pipe)
        with accelpatch.quality("high"):
            pipe(**sana_video2_pipeline_call_kwargs())
    model = accelpatch.report(pipe).models[0]
    _, rows, notes = model.table()
    assert not [n for n in notes if "not mounted" in n], notes
    cuda = [i for i, n in enumerate(notes, 1) if n.startswith("CUDA is unavailable")]
    assert len(cuda) == 1, notes
    high = [row for row in rows if row[2] == "high"]
    assert high and all(row[3] == f"rejected [{cuda[0]}]" and row[5] == f"2×[{cuda[0]}]" for row in high), high
    text = str(accelpatch.report(pipe))
    assert "saved ≈" not in text and "cost ≈" not in text and "their net speed: accelpatch.bench" in text
    accelpatch.remove(pipe)


def test_a_fused_op_never_called_says_why_it_has_no_counts():
    from accelpatch.core.reporting import FusionReport

    line = FusionReport(op="glu_gate", description="", sites=4, fused_calls=0, reference_calls={}, verified=(),
                        declined=()).line()
    assert line.startswith("glu_gate on 4 site(s): not called (no call of its sites reached it")
