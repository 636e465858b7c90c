"""QualityGatedFusion on bare modules: marking, all-or-nothing mounting, context-dependent enablement."""
import torch

import accelpatch
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.tiers import Tier


def _fusion(tier=Tier.HIGH):
    return QualityGatedFusion(name="demo", marker_attr="_demo_site", enabled_attr="_demo_enabled", tier=tier)


def _model():
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))


def test_mark_preserves_metadata_and_starts_unmounted():
    fusion, model = _fusion(), _model()
    fusion.mark(model[0], {"layer": 0})
    assert fusion.metadata(model[0]) == {"layer": 0}
    assert fusion.metadata(model[1], default="none") == "none"
    assert not fusion.is_enabled(model[0]) and model[0]._demo_enabled is False
    assert list(fusion.iter_sites(model)) == [model[0]]


def test_mount_and_unmount_toggle_every_site():
    fusion, model = _fusion(), _model()
    fusion.mark(model[0])
    fusion.mark(model[2])
    assert fusion.mount(model) is True
    assert all(fusion.is_mounted(m) for m in (model[0], model[2]))
    with accelpatch.quality("high"):
        assert all(fusion.is_enabled(m) for m in (model[0], model[2]))
    fusion.unmount(model)
    with accelpatch.quality("high"):
        assert not any(fusion.is_enabled(m) for m in (model[0], model[2]))


def test_one_rejected_site_keeps_every_site_off(caplog):
    fusion, model = _fusion(), _model()
    fusion.mark(model[0])
    fusion.mark(model[2])
    with caplog.at_level("INFO", logger="accelpatch"):
        ok = fusion.mount(model, reject_reason=lambda m: "too small" if m is model[2] else None)
    assert ok is False
    assert not fusion.is_mounted(model[0]) and not fusion.is_mounted(model[2])
    assert "too small" in caplog.text and "reference path" in caplog.text


def test_no_sites_mounts_nothing():
    assert _fusion().mount(_model()) is False


def test_enabled_answer_follows_the_calling_context():
    high, lossless = _fusion(Tier.HIGH), QualityGatedFusion(
        name="l", marker_attr="_l_site", enabled_attr="_l_enabled", tier=Tier.LOSSLESS)
    model = _model()
    for fusion in (high, lossless):
        fusion.mark(model[0])
        fusion.mount(model)
    assert not high.is_enabled(model[0]) and lossless.is_enabled(model[0])
    with accelpatch.quality("high"):
        assert high.is_enabled(model[0]) and lossless.is_enabled(model[0])
    with accelpatch.quality("exact"):
        assert not high.is_enabled(model[0]) and not lossless.is_enabled(model[0])


def test_unmark_removes_every_attribute():
    fusion, model = _fusion(), _model()
    fusion.mark(model[0])
    fusion.mount(model)
    fusion.unmark(model[0])
    assert not any(k.startswith("_demo") for k in vars(model[0]))
