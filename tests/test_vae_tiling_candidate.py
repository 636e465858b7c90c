"""VAE tiling as a ``validate`` candidate (issue #44 part 3): diffusers' ``vae.enable_tiling()`` is the lossy way down
for a VAE decode that does not fit, so ``validate`` measures what it costs against the reference: judged by the
floors whatever its tier, its arguments checked against the VAE's ``enable_tiling``, and the VAE left as it came."""
from __future__ import annotations

import pytest
import torch

from accelpatch import testing
from accelpatch.eval.candidates import PatchSwitcher, parse_candidate
from accelpatch.tiny_models.shipped import trained_call_kwargs

#: tiles of 64 pixels every 48 on the trained Wan's 128 x 256 frames (diffusers' default, 256, tiles nothing there)
TILES = {"tile_sample_min_height": 64, "tile_sample_min_width": 64, "tile_sample_stride_height": 48,
         "tile_sample_stride_width": 48}


@pytest.fixture(scope="module")
def trained_wan():
    torch.set_num_threads(1)
    return testing.tiny_wan_pipeline(trained=True)


def _untiled(vae) -> bool:
    return vae.use_tiling is False and vae.tile_sample_min_height == 256 and vae.tile_sample_stride_width == 192


def test_validate_measures_what_vae_tiling_costs_and_judges_it_by_the_floors(trained_wan):
    """On the trained Wan, an exact candidate whose VAE decodes in 64-pixel tiles: its frames are not the
    reference's (the tiles are blended), so it is judged by the per-frame floors, not bit identity, and the report
    gives its cost (measured 2026-12-06: worst frame SSIM 0.98, PSNR 35 dB at 8 steps); the VAE is untiled after."""
    from accelpatch.eval.validate import validate

    kwargs = trained_call_kwargs("wan", "a red square moves right", num_inference_steps=2)
    kwargs.pop("generator", None)
    report = validate(trained_wan, kwargs, [{"tier": "exact", "vae_tiling": TILES}], seeds=[0], progress=False)
    (tiled,) = report.candidates
    assert tiled.spec.label == ("exact+vae_tiling(tile_sample_min_height=64,tile_sample_min_width=64,"
                                "tile_sample_stride_height=48,tile_sample_stride_width=48)")
    assert tiled.gate == "floors" and not tiled.identical, str(report)
    worst = min(tiled.scores[0].ssim)
    assert 0.9 < worst < 1.0, str(report)  # changed, and measurably so, but not noise
    assert _untiled(trained_wan.vae)


def test_the_switcher_tiles_for_the_candidate_and_puts_the_vae_back(trained_wan):
    switcher = PatchSwitcher(trained_wan)
    switcher.enter(parse_candidate({"tier": "exact", "vae_tiling": TILES}))
    vae = trained_wan.vae
    assert vae.use_tiling is True and vae.tile_sample_min_height == 64 and isinstance(vae.tile_sample_min_height, int)
    switcher.enter(parse_candidate("exact"))  # the next candidate decodes as the pipeline came
    assert _untiled(vae)
    switcher.enter(parse_candidate({"tier": "exact", "vae_tiling": True}))  # diffusers' default tiles
    assert vae.use_tiling is True and vae.tile_sample_min_height == 256
    switcher.restore()
    assert _untiled(vae)


def test_a_bad_tiling_argument_names_it_and_the_valid_ones(trained_wan):
    from accelpatch.eval.preflight import check_candidates

    with pytest.raises(ValueError, match=r"takes no tile_height \(did you mean 'tile_sample_min_height'\?\); it "
                                         r"takes tile_sample_min_height, tile_sample_min_width"):
        check_candidates(trained_wan, [parse_candidate({"tier": "exact", "vae_tiling": {"tile_height": 64}})])
    assert _untiled(trained_wan.vae)


def test_a_pipeline_whose_vae_cannot_tile_says_so(trained_wan, monkeypatch):
    class Plain(torch.nn.Module):
        pass

    monkeypatch.setattr(trained_wan, "vae", Plain())
    switcher = PatchSwitcher(trained_wan)
    with pytest.raises(ValueError, match="vae_tiling asks WanPipeline's VAE to decode in tiles, but Plain has no "
                                         r"enable_tiling\(\)"):
        switcher.enter(parse_candidate({"vae_tiling": True}))


def test_an_unpatched_candidate_may_tile_its_vae():
    spec = parse_candidate({"unpatched": True, "tier": "exact", "vae_tiling": True})
    assert spec.label == "unpatched+vae_tiling"
    with pytest.raises(ValueError, match="unpatched candidate takes no backend or options"):
        parse_candidate({"unpatched": True, "options": {"tau": 1}})
