"""Code written against sglang diffusion's quality-gated site protocol finds accelpatch's ports of its sites by the
same marker names, and its mount/unmount agrees with accelpatch's tiers.

:class:`ReferenceFusion` restates sglang's ``QualityGatedFusion(name, marker_attr, enabled_attr)`` from its names
and documented semantics alone (../shared/reference/quality_tiers.md, section 2), not from accelpatch's code: sites
are the modules carrying ``marker_attr``; a site is enabled when ``enabled_attr`` is true; mount sets it on every
site (all or nothing), unmount clears it.
"""
from __future__ import annotations

import pytest
import torch
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.core.patcher import UNMOUNTED_AFTER_APPLY
from accelpatch.testing import (sana_video2_transformer_inputs, sana_video_transformer_inputs,
                                tiny_sana_video2_transformer, tiny_sana_video_transformer)


class ReferenceFusion:
    """sglang's site protocol, restated from its names."""

    def __init__(self, *, name: str, marker_attr: str, enabled_attr: str) -> None:
        self.name, self.marker_attr, self.enabled_attr = name, marker_attr, enabled_attr

    def metadata(self, module, default=None):
        return getattr(module, self.marker_attr, default)

    def is_enabled(self, module) -> bool:
        return bool(getattr(module, self.enabled_attr, False))

    def iter_sites(self, root):
        return (m for m in root.modules() if getattr(m, self.marker_attr, None) is not None)

    def mount(self, root, *, reject_reason=None, logger=None) -> bool:
        sites = list(self.iter_sites(root))
        if not sites or (reject_reason is not None and any(reject_reason(s) is not None for s in sites)):
            self.unmount(root)
            return False
        for site in sites:
            setattr(site, self.enabled_attr, True)
        return True

    def unmount(self, root) -> None:
        for site in self.iter_sites(root):
            setattr(site, self.enabled_attr, False)


#: family -> (sglang's fusion, the tiny model, its inputs)
SGLANG_SITES = {
    "sana_video": (ReferenceFusion(name="sana_video_linear_attention",
                                   marker_attr="_sgl_sana_video_linear_attention_site",
                                   enabled_attr="_sgl_sana_video_linear_attention_enabled"),
                   lambda: tiny_sana_video_transformer(dtype=torch.bfloat16), sana_video_transformer_inputs),
    "sana_video2": (ReferenceFusion(name="sana_video2_softmax_attention",
                                    marker_attr="_sgl_sana_video2_softmax_attention_site",
                                    enabled_attr="_sgl_sana_video2_softmax_attention_enabled"),
                    lambda: tiny_sana_video2_transformer(dtype=torch.bfloat16), sana_video2_transformer_inputs),
}

#: a transformer call alone has no denoising step: SANA-Video 2.0's anchors would keep FP32 for want of one
APPLY = {"sana_video2": {"anchor_fp32_steps": 0}}


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _site_reports(model, kind):
    return {s.path: s for s in accelpatch.report(model).sites if s.kind == kind}


@pytest.mark.parametrize("family", sorted(SGLANG_SITES))
def test_the_reference_protocol_finds_exactly_the_patched_sites(family):
    fusion, build, _ = SGLANG_SITES[family]
    model = build()
    assert list(fusion.iter_sites(model)) == []
    accelpatch.apply(model)
    sites = {name for name, m in model.named_modules() if m in set(fusion.iter_sites(model))}
    assert sites and sites == set(_site_reports(model, fusion.name))
    assert all(fusion.metadata(m).path == name for name, m in model.named_modules() if name in sites)
    accelpatch.remove(model)
    assert list(fusion.iter_sites(model)) == []
    assert not any(hasattr(m, fusion.enabled_attr) for m in model.modules())


@pytest.mark.parametrize("family", sorted(SGLANG_SITES))
def test_enabled_answers_for_the_calling_tier_and_the_reference_mount_agrees(family):
    fusion, build, make_inputs = SGLANG_SITES[family]
    model = build()
    inputs = make_inputs(model)
    exact = _forward(model, inputs)
    with run_fast_paths_on_cpu():  # the sites' guards want CUDA; the switch lets them mount here
        accelpatch.apply(model, **APPLY.get(family, {}))
        sites = list(fusion.iter_sites(model))
        for tier, enabled in (("exact", False), ("lossless", False), ("high", True)):
            with accelpatch.quality(tier):
                assert [fusion.is_enabled(s) for s in sites] == [enabled] * len(sites), tier
        with accelpatch.quality("high"):
            high = _forward(model, inputs)
            fusion.unmount(model)  # the reference's unmount: accelpatch's sites stand down, saying why
            assert not any(fusion.is_enabled(s) for s in sites)
            with pytest.warns(RuntimeWarning, match="unmounted after apply"):
                assert torch.equal(_forward(model, inputs), exact)
            assert fusion.mount(model)  # and mount again: the fast path runs again, with the same output
            assert all(fusion.is_enabled(s) for s in sites)
            assert torch.equal(_forward(model, inputs), high)
        with accelpatch.quality("lossless"):  # mounted, but this tier does not admit it
            assert not any(fusion.is_enabled(s) for s in sites)
    reports = _site_reports(model, fusion.name).values()
    assert sum(s.fast_calls for s in reports) == 2 * len(sites)
    assert all(s.fallback_calls == {f"not mounted: {UNMOUNTED_AFTER_APPLY}": 1} for s in reports), [
        s.fallback_calls for s in reports]
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), exact)


@pytest.mark.parametrize("family", sorted(SGLANG_SITES))
def test_a_reference_mount_cannot_mount_a_site_accelpatch_rejected(family):
    """On a CPU the sites are rejected (their guards want CUDA): another caller's mount leaves them off, with
    accelpatch's reason, and the output stays the reference's."""
    fusion, build, make_inputs = SGLANG_SITES[family]
    model = build()
    inputs = make_inputs(model)
    exact = _forward(model, inputs)
    with pytest.warns(RuntimeWarning, match="CUDA is unavailable"):
        accelpatch.apply(model, **APPLY.get(family, {}))
    fusion.mount(model)
    with accelpatch.quality("high"):
        assert not any(fusion.is_enabled(s) for s in fusion.iter_sites(model))
        assert torch.equal(_forward(model, inputs), exact)
    for site in _site_reports(model, fusion.name).values():
        assert not site.mounted and "CUDA is unavailable" in site.reason
        assert site.fast_calls == 0 and [r.startswith(f"not mounted: {site.reason}") for r in site.fallback_calls] == [
            True]
    accelpatch.remove(model)
