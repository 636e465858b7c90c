"""report()'s table says each thing once and plainly (once: one cause showed as two notes, with a block-0 reason
on every other row; a model with no sites printed an empty table under "opts in to the approximate fast paths";
SANA-Video 2.0's header printed a Python set)."""
import warnings

import pytest
from diffusers.models.attention_processor import AttnProcessor2_0

import accelpatch
from accelpatch.sites.base import run_fast_paths_on_cpu
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
    assert text.count("rejected [1]") == 2 and "model rejected at" not in text


def test_a_model_without_sites_shows_no_empty_table_and_promises_nothing():
    text = str(accelpatch.apply(tiny_minimax_h3_transformer()))
    assert "site  kind" not in text and "opts in" not in text, text
    assert "0 sites" in text and "runs unchanged" in text


def test_layer_sets_read_as_a_user_writes_them():
    model = tiny_sana_video2_transformer()
    assert "anchor_fp32_layers=none" in str(accelpatch.apply(model, anchor_fp32_layers=""))
    assert "anchor_fp32_layers=3:" in str(accelpatch.apply(model, anchor_fp32_layers="3"))
