"""QualityGatedFusion on bare modules: marking with the one site record, context-dependent enablement. The mount
decision itself (all or nothing per model, with reasons) is the patcher's: tests/test_sana_video_patching.py,
tests/test_wan_fusions.py."""
import torch

import accelpatch
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.tiers import Tier


class _Record:
    """The two mount fields of a site record (accelpatch's Site carries them)."""

    def __init__(self) -> None:
        self.mounted, self.reject_reason = True, None


def _fusion(tier=Tier.HIGH):
    return QualityGatedFusion(name="demo", marker_attr="_demo_site", enabled_attr="_demo_enabled", tier=tier)


def _model():
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))


def test_mark_keeps_the_record_and_starts_unmounted():
    fusion, model, record = _fusion(), _model(), _Record()
    fusion.mark(model[0], record)
    assert fusion.record(model[0]) is record and fusion.record(model[1]) is None
    assert record.mounted is False
    assert list(fusion.iter_sites(model)) == [model[0]]
    for tier in ("exact", "lossless", "high"):
        with accelpatch.quality(tier):
            assert not fusion.is_enabled(model[0])


def test_enabled_answer_follows_the_record_and_the_calling_context():
    high, lossless = _fusion(Tier.HIGH), QualityGatedFusion(
        name="l", marker_attr="_l_site", enabled_attr="_l_enabled", tier=Tier.LOSSLESS)
    model = _model()
    records = {}
    for fusion in (high, lossless):
        records[fusion.name] = _Record()
        fusion.mark(model[0], records[fusion.name])
        records[fusion.name].mounted = True  # the patcher's decision
    assert not high.is_enabled(model[0]) and lossless.is_enabled(model[0])
    with accelpatch.quality("high"):
        assert high.is_enabled(model[0]) and lossless.is_enabled(model[0])
        records["demo"].mounted = False
        assert not high.is_enabled(model[0]) and lossless.is_enabled(model[0])
    with accelpatch.quality("exact"):
        assert not high.is_enabled(model[0]) and not lossless.is_enabled(model[0])


def test_unmark_removes_every_attribute():
    fusion, model = _fusion(), _model()
    fusion.mark(model[0], _Record())
    fusion.unmark(model[0])
    assert not any(k.startswith("_demo") for k in vars(model[0]))
    assert list(fusion.iter_sites(model)) == []


def test_there_is_one_mount_path():
    """#41: the patcher decides each site; no second mount call, no record type of the fusion's own."""
    import accelpatch.core.gate as gate

    assert not hasattr(gate, "Mark")
    assert not any(hasattr(QualityGatedFusion, name) for name in ("mount", "unmount", "is_mounted", "metadata"))
