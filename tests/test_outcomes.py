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
