"""The memory plan's VAE decode (issue #44): traced on fake tensors it holds what the real decode holds (tiny VAEs of
the planned classes, whole and in tiles), tiling lowers a full-size decode's peak, and ``--vae-tiling`` plans it."""
from __future__ import annotations

import pytest
import torch

from accelpatch.memory.plan import memory_plan, trace_vae_decode

#: (family, a tiny configuration (None: the family's tiny builder's), a latent grid, tiles that cut it into several)
VAES = {
    "wan": ("wan", dict(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                        temperal_downsample=[False, True, True]), (3, 16, 24),
            dict(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                 tile_sample_stride_width=48)),
    "ltx2": ("ltx2", None, (3, 24, 32),
             dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                  tile_sample_stride_width=24)),
    "hunyuan-video15": ("hunyuan-video15", None, (3, 12, 16),
                        dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_latent_min_height=8,
                             tile_latent_min_width=8)),
    # LTX-2.3's decoder layout (SANA-Video 2.0's VAE): four stages, the third temporal only, the last spatial only,
    # no residual upsampling; its widths / 32
    "ltx2.3": ("sana-video2", dict(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 16, 32, 32),
        decoder_block_out_channels=(8, 16, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True,) * 4,
        decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
        downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
        upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
        upsample_factor=(2, 2, 1, 2), timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
        decoder_causal=False, decoder_spatial_padding_mode="zeros"), (2, 6, 8),
        dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
             tile_sample_stride_width=24)),
    # MiniMax-H3's VAE tiles by default (256 pixels): 2 x 2 tiles and 2 temporal chunks here; "tiled": smaller ones
    "minimax-h3": ("minimax-h3", None, (12, 24, 24),
                   dict(tile_sample_min_height=128, tile_sample_min_width=128, tile_sample_min_overlap_height=32,
                        tile_sample_min_overlap_width=32)),
}


def _vae(name):
    """(the family's VaeDecodeCase, a tiny config, a grid, tiles)."""
    from accelpatch.models.families import by_cli

    family, config, grid, tiles = VAES[name]
    if config is None:
        if name == "ltx2":
            from accelpatch.testing.ltx2 import LTX2_TINY_VIDEO_VAE_CONFIG as config
        elif name == "hunyuan-video15":
            from accelpatch.testing.hunyuan_video15 import HUNYUAN_VIDEO15_TINY_VAE_CONFIG as config
        else:
            from accelpatch.testing.minimax_h3 import MINIMAX_H3_TINY_VIDEO_VAE_CONFIG

            config = {**MINIMAX_H3_TINY_VIDEO_VAE_CONFIG, "latent_channels": 4}
    return by_cli(family).memory.vae, config, grid, tiles


@pytest.mark.parametrize("tiled", [False, True], ids=["whole", "tiled"])
@pytest.mark.parametrize("name", sorted(VAES))
def test_a_planned_vae_decode_holds_what_its_real_run_holds(name, tiled):
    """Planned as the planner plans it (each repeated decoder call traced once, HunyuanVideo 1.5's mask stood in
    for) against the real decode's peak."""
    torch.set_num_threads(1)
    case, config, grid, tiles = _vae(name)
    tiling = tiles if tiled else False
    planned = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32", tiling=tiling,
                               repeated=case.repeated, stand_ins=case.stand_ins)
    measured = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32", tiling=tiling, fake=False)
    assert measured[1] > 3 * grid[1] * grid[2] * 4, measured  # more than the latents
    assert planned[0] == measured[0] and abs(planned[1] - measured[1]) <= 0.10 * measured[1], (planned, measured)


@pytest.mark.parametrize("tiled", [False, True], ids=["whole", "tiled"])
@pytest.mark.parametrize("name,size", [("wan", (9, 128, 192)), ("hunyuan-video15", (1, 128, 192))])
def test_a_planned_vae_encode_holds_what_its_real_run_holds(name, size, tiled):
    """An image-to-video pipeline's encode at a tiny width, whole and in tiles: Wan's VAE on its conditioning video
    (9 frames of 128 x 192; its encoder's chunks replayed, as tracing each gives), HunyuanVideo 1.5's on its image
    (one frame); the fake trace against the real encode's peak, within 10 %."""
    from accelpatch.memory.plan import trace_vae_encode

    torch.set_num_threads(1)
    case, config, _, tiles = _vae(name)
    tiling = tiles if tiled else False
    planned = trace_vae_encode(case.class_name, config, size, batch=1, dtype="float32", tiling=tiling,
                               repeated=case.encode_repeated)
    if name == "wan":
        every = trace_vae_encode(case.class_name, config, size, batch=1, dtype="float32", tiling=tiling)
        assert case.encode_repeated == ("encoder",) and planned == every  # its chunks replayed: the same bytes
    measured = trace_vae_encode(case.class_name, config, size, batch=1, dtype="float32", tiling=tiling, fake=False)
    assert measured[1] > 3 * size[0] * size[1] * size[2] * 4, measured  # more than the video
    assert planned[0] == measured[0] and abs(planned[1] - measured[1]) <= 0.10 * measured[1], (planned, measured)


@pytest.mark.parametrize("name", ["wan", "ltx2"])
def test_a_sliced_vae_decode_holds_what_its_real_run_holds_and_less_than_the_batch(name):
    """``vae.enable_slicing()`` decodes a batch of 2 one video at a time, holding the decoded ones: the fake trace
    against the real decode's peak (within 10 %), and below the whole batch's."""
    torch.set_num_threads(1)
    case, config, grid, _ = _vae(name)
    sliced = trace_vae_decode(case.class_name, config, grid, batch=2, dtype="float32", slicing=True,
                              repeated=case.repeated)
    measured = trace_vae_decode(case.class_name, config, grid, batch=2, dtype="float32", slicing=True, fake=False)
    whole = trace_vae_decode(case.class_name, config, grid, batch=2, dtype="float32", repeated=case.repeated)
    assert sliced[0] == measured[0] and abs(sliced[1] - measured[1]) <= 0.10 * measured[1], (sliced, measured)
    assert sliced[1] < whole[1], (sliced, whole)


#: not LTX-2.3's layout at its tiny widths: its whole decode is mostly the 3-channel output, which tiles' blending
#: buffers outgrow (measured at a 96 x 128 output: 14.8 MB tiled, 8.8 MB whole); the planner's own figures for it are
#: checked against its real runs above, tiled and whole
@pytest.mark.parametrize("name", sorted(set(VAES) - {"ltx2.3"}))
def test_tiles_lower_the_decode_peak(name):
    case, config, grid, tiles = _vae(name)
    whole = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32")[1]
    tiled = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32", tiling=tiles)[1]
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


def _fake_decode_peak(case, config, grid, repeated=(), tiling=None):
    """(peak bytes, the RepeatedCalls, the output's shape) of a fake decode of ``case``'s class with ``repeated``
    traced once (``tiling``: vae.enable_tiling's arguments)."""
    import diffusers
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accelpatch.memory.live_bytes import LiveBytes
    from accelpatch.memory.repeats import RepeatedCalls, submodules

    with FakeTensorMode():
        vae = getattr(diffusers, case.class_name)(**config).eval()
        if tiling is not None:
            vae.enable_tiling(**tiling)
        latents = torch.zeros(1, int(getattr(vae.config, "latent_channels", None) or vae.config.z_dim), *grid)
        with torch.no_grad(), LiveBytes() as live, RepeatedCalls(live, submodules(vae, repeated)) as calls:
            out = vae.decode(latents, return_dict=False)[0]
    return live.peak, calls, tuple(out.shape)


#: (family, decoder calls traced, replayed): the calls are the tiles (and chunks); the traced, their distinct layouts
@pytest.mark.parametrize("name,traced,replayed", [("minimax-h3", 1, 7), ("ltx2", 4, 2), ("ltx2.3", 4, 44)])
def test_a_repeated_decoder_call_is_traced_once_and_plans_the_same_peak(name, traced, replayed):
    """A decoder run per tile (and chunk) on inputs of a few layouts, each traced once: MiniMax-H3's by default
    (2 x 2 tiles, 2 chunks here: 8 calls on one layout), LTX-2's and LTX-2.3's in diffusers' tiles; the peak and the
    output are what tracing every call gives."""
    case, config, grid, tiles = _vae(name)
    tiling = None if name == "minimax-h3" else tiles
    every, calls_every, shape = _fake_decode_peak(case, config, grid, tiling=tiling)
    once, calls, shape_once = _fake_decode_peak(case, config, grid, repeated=("decoder",), tiling=tiling)
    assert case.repeated == ("decoder",) and calls_every.traced == {}
    assert (calls.traced["decoder"], calls.repeated["decoder"]) == (traced, replayed), (calls.traced, calls.repeated)
    assert once == every and shape_once == shape, (once, every)
    assert not calls.not_repeatable


@pytest.mark.parametrize("tiled", [False, True], ids=["whole", "tiled"])
def test_wans_decoder_with_its_feature_cache_is_replayed_and_plans_the_same_peak(tiled):
    """Wan's decoder runs frame by frame and keeps its feature cache in two lists the VAE owns: the cache's layouts
    are part of a call's key and a replay writes fresh entries of the traced layouts, so after the first frames every
    call is replayed, and the peak and the output are what tracing every call gives (6 latent frames; tiled: 3 x 4
    tiles of them, each tile starting from an empty cache)."""
    case, config, _, tiles = _vae("wan")
    grid = (6, 16, 24)
    tiling = tiles if tiled else None
    every, _, shape = _fake_decode_peak(case, config, grid, tiling=tiling)
    once, calls, shape_once = _fake_decode_peak(case, config, grid, repeated=("decoder",), tiling=tiling)
    assert case.repeated == ("decoder",)
    calls_made = 6 * (12 if tiled else 1)  # 64-pixel tiles every 48 pixels over 128 x 192: 3 x 4
    assert not calls.not_repeatable and calls.repeated["decoder"] >= calls_made // 2, (calls.traced, calls.repeated)
    assert calls.traced["decoder"] + calls.repeated["decoder"] == calls_made
    assert once == every and shape_once == shape, (once, every)


class _Cached(torch.nn.Module):
    """A toy decoder step: ``how`` says what it keeps between calls: "own" a tensor on itself, "view" a view of its
    input in the caller's list, "list" a new tensor in the caller's list (replayable)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.kept = how, None

    def forward(self, x, cache):
        if self.how == "own":
            self.kept = x * 2
        elif self.how == "view":
            cache[0] = x[:, :1]
        else:
            cache[0] = torch.cat([x, x], 1) if cache[0] is None else x * 3
        return x + 1


@pytest.mark.parametrize("how", ["own", "view", "list"])
def test_a_call_that_keeps_state_outside_its_caller_s_lists_is_traced_every_time(how):
    """Only state in list arguments is replayed: a module that keeps a tensor on itself, or puts a view of its input
    into the list, is traced every call; one that writes new tensors into the list is replayed, leaving entries of
    the traced layouts there. Each way, the peak is the one tracing every call gives."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accelpatch.memory.live_bytes import LiveBytes
    from accelpatch.memory.repeats import RepeatedCalls

    def run(repeated):
        module, cache = _Cached(how), [None]
        with FakeTensorMode(), torch.no_grad(), LiveBytes() as live, \
                RepeatedCalls(live, {"step": module} if repeated else {}) as calls:
            x = torch.zeros(4, 8)
            outs, entries = [], []
            for _ in range(5):
                outs.append(module(x, cache))
                entries.append(cache[0])  # held: each call's entry must be a new tensor for the peaks to agree
        assert len({id(entry) for entry in entries}) == (1 if how == "own" else 5)
        return live.peak, calls, [tuple(t.shape) for t in outs], getattr(cache[0], "shape", None)

    peak, _, shapes, cached = run(False)
    peak_once, calls, shapes_once, cached_once = run(True)
    assert (peak_once, shapes_once, cached_once) == (peak, shapes, cached)
    if how == "list":
        # traced while the cache's layout changes: empty, (4, 16), then (4, 8) from the third call on
        assert calls.traced["step"] == 3 and calls.repeated["step"] == 2 and not calls.not_repeatable
        assert cached_once == (4, 8)
    else:
        assert calls.not_repeatable == {"step"} and calls.traced["step"] == 5 and calls.repeated["step"] == 0


def test_repeated_names_a_missing_submodule_with_the_choices():
    from accelpatch.memory.repeats import submodules

    with pytest.raises(AttributeError, match="has no submodule 'decodr' \\(its children: .*decoder"):
        submodules(_TinyVae(), ["decodr"])


class _TinyVae(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Identity()


MASK = ("diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15:"
        "HunyuanVideo15AttnBlock.prepare_causal_attention_mask")


def test_the_causal_mask_stand_in_runs_only_on_fake_tensors_and_is_put_back():
    """HunyuanVideo 1.5's mask: while the stand-in is installed a real call still gets diffusers' own mask (equal
    values), a fake one a tensor of the same shape and dtype; afterwards the class holds diffusers' function again."""
    import inspect

    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock
    from torch._subclasses.fake_tensor import FakeTensorMode

    from accelpatch.memory.stand_ins import standing_in

    case, *_ = _vae("hunyuan-video15")
    assert case.stand_ins[0][0] == MASK
    before = inspect.getattr_static(HunyuanVideo15AttnBlock, "prepare_causal_attention_mask")
    own = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(3, 4, torch.float32, "cpu", batch_size=2)
    with standing_in(case.stand_ins) as skipped:
        assert skipped == []
        assert inspect.getattr_static(HunyuanVideo15AttnBlock, "prepare_causal_attention_mask") is not before
        real = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(3, 4, torch.float32, "cpu", batch_size=2)
        with FakeTensorMode():
            fake = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(3, 4, torch.float32, "cpu", batch_size=2)
    assert torch.equal(real, own) and (own == 0).any() and torch.isinf(own).any()
    assert fake.shape == own.shape == (2, 12, 12) and fake.dtype == own.dtype and fake.stride() == own.stride()
    assert inspect.getattr_static(HunyuanVideo15AttnBlock, "prepare_causal_attention_mask") is before


def test_a_changed_diffusers_function_is_traced_as_it_is_with_the_reason(monkeypatch):
    """A prepare_causal_attention_mask that is not the recorded code (a newer diffusers) is not stood in for: the
    decode is traced with diffusers' own function and the plan's notes say why."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    original = HunyuanVideo15AttnBlock.prepare_causal_attention_mask
    calls = []

    def changed(n_frame, n_hw, dtype, device, batch_size=None):
        calls.append(n_frame)
        return original(n_frame, n_hw, dtype, device, batch_size=batch_size)

    monkeypatch.setattr(HunyuanVideo15AttnBlock, "prepare_causal_attention_mask", staticmethod(changed))
    case, config, grid, _ = _vae("hunyuan-video15")
    notes = []
    planned = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32", stand_ins=case.stand_ins,
                               notes=notes)
    plain = trace_vae_decode(case.class_name, config, grid, batch=1, dtype="float32")
    assert calls and planned == plain
    assert len(notes) == 1 and "prepare_causal_attention_mask traced as it is (slowly)" in notes[0], notes


def test_hunyuan_video15_and_minimax_h3_plans_trace_their_vae_decodes():
    """Both VAE decodes are planned at a small size (their release classes at diffusers' defaults): HunyuanVideo
    1.5's whole (its mid-block attends over every latent frame) and, when the call does not fit, in diffusers' tiles
    for less, after the encode of its image-to-video image; MiniMax-H3's in the tiles it always uses, so tiling is no move there, and the plan says so."""
    hunyuan = memory_plan("hunyuan-video15-step-distilled", height=320, width=320, frames=9, patched=False,
                          budget="1GiB")
    vae, tiled = hunyuan.stages[-1], hunyuan.details["vae_tiled"]
    assert vae.planned and vae.activations > 9 * 320 * 320 * 3 * 2 and vae.weights > 2 * 2 ** 30, vae
    encode = hunyuan.stages[1]  # its image-to-video pipeline encodes the image, one frame, before denoising
    assert encode.name == "VAE encode" and encode.shares == "VAE decode" and encode.weights == vae.weights
    assert 320 * 320 * 3 * 2 < encode.activations < vae.activations and "conditioning image" in encode.note
    assert tiled.activations < vae.activations and "no VAE tiling" in hunyuan.table()
    minimax = memory_plan("minimax-h3-turbo-5step", height=320, width=320, frames=22, patched=False, budget="1GiB")
    vae = next(stage for stage in minimax.stages if stage.name == "VAE decode")  # the audio decode comes after it
    assert vae.planned and vae.note == "tiled (its default)" and vae.weights > 5 * 2 ** 30, vae
    assert "vae_tiled" not in minimax.details and "the VAE decoded in the tiles it uses by default" in minimax.table()
