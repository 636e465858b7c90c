"""The memory plan's VAE decode (issue #44): traced on fake tensors it holds what the real decode holds (tiny VAEs of
the planned classes, whole and in tiles), tiling lowers a full-size decode's peak, and ``--vae-tiling`` plans it."""
from __future__ import annotations

import pytest
import torch

from accelpatch.memory.plan import memory_plan, trace_vae_decode

#: (class, a tiny configuration, a latent grid, tiles that cut its frames into several)
VAES = {
    "wan": ("AutoencoderKLWan", dict(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True]), (3, 16, 24),
            dict(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                 tile_sample_stride_width=48)),
    "ltx2": ("AutoencoderKLLTX2Video", None, (3, 24, 32),
             dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                  tile_sample_stride_width=24)),
}


def _vae(name):
    class_name, config, grid, tiles = VAES[name]
    if config is None:
        from accelpatch.testing.ltx2 import LTX2_TINY_VIDEO_VAE_CONFIG

        config = LTX2_TINY_VIDEO_VAE_CONFIG
    return class_name, config, grid, tiles


@pytest.mark.parametrize("tiled", [False, True], ids=["whole", "tiled"])
@pytest.mark.parametrize("name", sorted(VAES))
def test_a_planned_vae_decode_holds_what_its_real_run_holds(name, tiled):
    torch.set_num_threads(1)
    class_name, config, grid, tiles = _vae(name)
    tiling = tiles if tiled else False
    planned = trace_vae_decode(class_name, config, grid, batch=1, dtype="float32", tiling=tiling)
    measured = trace_vae_decode(class_name, config, grid, batch=1, dtype="float32", tiling=tiling, fake=False)
    assert measured[1] > 3 * grid[1] * grid[2] * 4, measured  # more than the latents
    assert planned[0] == measured[0] and abs(planned[1] - measured[1]) <= 0.10 * measured[1], (planned, measured)


@pytest.mark.parametrize("name", sorted(VAES))
def test_tiles_lower_the_decode_peak(name):
    class_name, config, grid, tiles = _vae(name)
    whole = trace_vae_decode(class_name, config, grid, batch=1, dtype="float32")[1]
    tiled = trace_vae_decode(class_name, config, grid, batch=1, dtype="float32", tiling=tiles)[1]
    assert tiled < whole, (tiled, whole)


def test_a_plan_with_vae_tiling_traces_the_decode_in_tiles_and_says_so():
    """Wan's VAE at 272 x 480 (diffusers' default tiles of 256 pixels cut it): the tiled decode holds less than the
    whole one, and the table and the assumptions say the VAE is tiled."""
    size = dict(height=272, width=480, frames=9, patched=False)
    whole = memory_plan("wan2.1-t2v-1.3b-sol-attn", **size)
    tiled = memory_plan("wan2.1-t2v-1.3b-sol-attn", vae_tiling=True, **size)
    assert tiled.stages[-1].activations < whole.stages[-1].activations
    assert tiled.stages[-1].weights == whole.stages[-1].weights
    assert "tiled (vae.enable_tiling())" in tiled.table() and "default tiles" in tiled.table()
    assert "no VAE tiling" in whole.table()
