"""SANA-Video split by whole frames through diffusers' own ``enable_parallelism`` after ``accelpatch.apply``.

- World size 1: diffusers' ``ContextParallelConfig`` refuses a degree of 1, so the split layers are turned on with
  ``sequence_parallel.one_process_split(model, shards_of_group())`` on a one-process gloo group: every tier equals the unpatched
  model bit for bit, text-to-video and image-to-video (per-token timesteps), and the split code really ran.
- 2 and 4 real processes on gloo (``ContextParallelConfig(ulysses_degree=N)``), fp32 tiny model, CFG batch 2 with the
  text mask: every tier equals one process within :data:`TOLERANCE`; the same fast-path counts on every rank; with the
  all-reduce or the frame halo disabled on purpose the comparison fails; a frame count that does not divide is refused
  naming the valid counts; ``remove()`` leaves nothing of ours; a model split before ``apply`` is refused. The
  ``high`` tier (bf16 first GEMM, its CPU emulation) runs on a bf16 model, compared with one-process ``high``.

Tolerance (fp32). Splitting changes only summation order: per block, the two all-reduced token sums (P partial sums
added instead of one sum over all tokens) and the boundary frames of ``conv_temp`` (one extra addition); the GEMMs
run on fewer rows. Each reordered sum moves its result by a few units of roundoff (2^-24 relative), and two blocks
carry that to outputs of magnitude ≤ 2.5 (ulp 2.4e-7): we allow 1e-5, about 40 ulps of the largest output. Measured:
≤ 6e-7 at 2 and 4 processes; a layer left local moves outputs by ≥ 5e-3 (no halo) and ~0.13 (no all-reduce).
"""
import textwrap

import pytest
import torch
import torch.distributed as dist
from _multiprocess import LAUNCH, run_ranks

import accelpatch
from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer

#: max |Δ| allowed between a split fp32 output and one process (see the module docstring)
TOLERANCE = 1e-5
#: bf16 (high tier): the split moves outputs by bf16 roundings; 4 ulps of the largest outputs (2^-7 in [2, 4)), where
#: 1 ulp is measured; a local linear attention moves them by ~0.1 (one process: high vs fp32 exact ~7e-2)
BF16_TOLERANCE = 0.03
FRAMES = 4


def _i2v(inputs: dict, model) -> dict:
    """The image-to-video call of ``pipeline_sana_video_i2v``: a per-token timestep [B, 1, F, H', W'], 0 on the
    conditioning frame."""
    b, _, f, h, w = inputs["hidden_states"].shape
    _, ph, pw = model.config.patch_size
    mask = torch.zeros(b, 1, f, h // ph, w // pw)
    mask[:, :, 0] = 1.0
    return {**inputs, "timestep": inputs["timestep"].view(b, 1, 1, 1, 1).expand(mask.shape) * (1 - mask)}


def _cases(model, dtype=torch.float32):
    t2v = sana_video_transformer_inputs(model, batch_size=2, num_frames=FRAMES, with_mask=True, dtype=dtype)
    return {"t2v": t2v, "i2v": _i2v(t2v, model)}


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_world_size_one_changes_no_bit(one_process_group, monkeypatch):
    from accelpatch.models.sana_video import restated_attention, sequence_parallel
    from accelpatch.parallel.sequence import shards_of_group, sum_over_ranks

    model = tiny_sana_video_transformer()
    cases = _cases(model)
    reference = {name: _run(model, inputs) for name, inputs in cases.items()}
    accelpatch.apply(model)
    reduced, halos = [], []
    monkeypatch.setattr(restated_attention, "sum_over_ranks", lambda x, s: reduced.append(s) or sum_over_ranks(x, s))
    monkeypatch.setattr(sequence_parallel, "exchange_halo", lambda f, l, s: halos.append(s) or (None, None))
    sequence_parallel.one_process_split(model, shards_of_group())
    for tier in ("exact", "lossless", "high"):
        for name, inputs in cases.items():
            with accelpatch.quality(tier):
                out = _run(model, inputs)
            assert out.dtype == reference[name].dtype and out.stride() == reference[name].stride()
            assert torch.equal(out.view(torch.int32), reference[name].view(torch.int32)), (tier, name)
    runs = 3 * len(cases) * len(model.transformer_blocks)
    assert len(reduced) == 2 * runs and len(halos) == runs  # the split layers ran: two sums, one halo per block
    with pytest.raises(RuntimeError, match="inference only"):
        model(**cases["t2v"])  # autograd on
    accelpatch.remove(model)  # undoes the one-process split with the rest
    assert "_sequence_shards" not in vars(model)
    unsplit = {name: _run(model, inputs) for name, inputs in cases.items()}
    assert len(reduced) == 2 * runs and all(torch.equal(unsplit[n], reference[n]) for n in cases)


def test_apply_and_remove_leave_the_unsplit_model_alone():
    from accelpatch.models.sana_video.split_processors import LocalCrossAttnProcessor, SplitLinearAttnProcessor

    model = tiny_sana_video_transformer()
    originals = [(b.attn1.processor, b.attn2.processor) for b in model.transformer_blocks]
    accelpatch.apply(model)
    assert model._cp_plan.keys() == {"rope", "transformer_blocks.0", "proj_out"} and "_cp_plan" in vars(model)
    assert all(type(b.attn1.processor) is SplitLinearAttnProcessor
               and type(b.attn2.processor) is LocalCrossAttnProcessor for b in model.transformer_blocks)
    accelpatch.remove(model)
    assert [(b.attn1.processor, b.attn2.processor) for b in model.transformer_blocks] == originals
    assert "_cp_plan" not in vars(model) and model._cp_plan is None
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


SCRIPT = LAUNCH + textwrap.dedent("""
    import os, sys, warnings
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def worker(rank, world, port, folder, tests, full):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)
        sys.path.insert(0, tests)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.models.sana_video import linear_attention, restated_attention, sequence_parallel
        from accelpatch.models.sana_video.split_processors import SplitLinearAttnProcessor
        from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer
        from test_sequence_parallel_sana_video import FRAMES, _cases, _run
        from _cpu_fast_paths import run_fast_paths_on_cpu
        config = lambda: ContextParallelConfig(ulysses_degree=world)
        out = {}

        model = tiny_sana_video_transformer()
        cases = _cases(model)
        out["one_process"] = {name: _run(model, inputs) for name, inputs in cases.items()}
        originals = [(b.attn1.processor, b.attn2.processor) for b in model.transformer_blocks]
        accelpatch.apply(model)
        model.enable_parallelism(config=config())
        for tier in ("exact", "lossless", "high"):
            with accelpatch.quality(tier):
                out[tier] = {name: _run(model, inputs) for name, inputs in cases.items()}
        report = accelpatch.report(model)
        out["sites"] = {(s.path, s.kind): (s.fast_calls, s.reference_calls) for s in report.sites}
        out["fusions"] = {f.op: f.fused_calls for f in report.models[0].fusions}

        sum_over_ranks, exchange_halo = restated_attention.sum_over_ranks, sequence_parallel.exchange_halo
        restated_attention.sum_over_ranks = lambda x, shards: x  # deliberately local linear attention
        with accelpatch.quality("exact"):
            out["no_all_reduce"] = {name: _run(model, inputs) for name, inputs in cases.items()}
        restated_attention.sum_over_ranks = sum_over_ranks
        # deliberately no halo: zero frames from the neighbours, as a conv left local would pad its shard
        sequence_parallel.exchange_halo = lambda first, last, shards: (
            torch.zeros_like(last) if shards.rank > 0 else None,
            torch.zeros_like(first) if shards.rank < shards.world - 1 else None)
        out["no_halo"] = {name: _run(model, inputs) for name, inputs in cases.items()}
        sequence_parallel.exchange_halo = exchange_halo

        try:
            _run(model, sana_video_transformer_inputs(model, num_frames=3 * world - 1))
        except ValueError as error:
            out["frames_error"] = str(error)

        accelpatch.remove(model)
        ours = (sequence_parallel.SplitEntry, sequence_parallel.LocalFrames, sequence_parallel.TemporalHalo)
        out["removed"] = dict(
            processors=[(b.attn1.processor, b.attn2.processor) for b in model.transformer_blocks] == originals,
            plan="_cp_plan" not in vars(model),
            hooks=not any(isinstance(getattr(h, "__self__", h), ours) for m in model.modules()
                          for h in [*m._forward_pre_hooks.values(), *m._forward_hooks.values()]))

        if not full:  # the checks below do not depend on the world size: run once, at 2 processes
            torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
            return
        bf16 = tiny_sana_video_transformer(dtype=torch.bfloat16)
        bf16_cases = _cases(bf16, torch.bfloat16)
        with run_fast_paths_on_cpu(), accelpatch.quality("high"):
            accelpatch.apply(bf16)
            out["bf16_one_process"] = {name: _run(bf16, inputs) for name, inputs in bf16_cases.items()}
            bf16.enable_parallelism(config=config())
            out["bf16_high"] = {name: _run(bf16, inputs) for name, inputs in bf16_cases.items()}
        out["bf16_high_calls"] = sum(s.fast_calls for s in accelpatch.report(bf16).sites if s.tier == "high")

        from accelpatch.testing import sana_video_pipeline_call_kwargs, tiny_sana_video_pipeline
        pipe = tiny_sana_video_pipeline()
        call = lambda: pipe(**sana_video_pipeline_call_kwargs(frames=4 * (FRAMES - 1) + 1)).frames  # CFG: B = 2
        out["pipeline_one_process"] = call()
        accelpatch.apply(pipe)
        pipe.transformer.enable_parallelism(config=config())
        out["pipeline"] = call()

        late = tiny_sana_video_transformer()
        late.enable_parallelism(config=config(), cp_plan=sequence_parallel.cp_plan(late))
        try:
            accelpatch.apply(late)
        except RuntimeError as error:
            out["late_apply"] = str(error)
        out["late_apply_left"] = type(late.transformer_blocks[0].attn1.processor).__name__
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        world = int(sys.argv[3])
        launch(worker, args=(world, int(sys.argv[2]), sys.argv[1], sys.argv[4], world == 2), nprocs=world)
""")


def _max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("world", [2, 4])
def test_split_over_processes_matches_one_process(tmp_path, world):
    from pathlib import Path

    ranks = run_ranks(tmp_path, SCRIPT, world, str(world), str(Path(__file__).parent), timeout=300)
    for out in ranks:
        for name, expected in out["one_process"].items():
            for tier in ("exact", "lossless", "high"):
                got = out[tier][name]
                assert got.shape == expected.shape and got.dtype == expected.dtype
                assert _max_diff(got, expected) <= TOLERANCE, (tier, name, _max_diff(got, expected))
            assert _max_diff(out["no_all_reduce"][name], expected) > 100 * TOLERANCE, name  # caught
            assert _max_diff(out["no_halo"][name], expected) > 100 * TOLERANCE, name  # caught
        assert f"{3 * world - 1} latent frames do not split over {world} ranks" in out["frames_error"]
        assert f"divisible by {world}" in out["frames_error"]
        assert out["removed"] == dict(processors=True, plan=True, hooks=True)
        if world == 2:
            for name, expected in out["bf16_one_process"].items():
                assert _max_diff(out["bf16_high"][name], expected) <= BF16_TOLERANCE, name
            assert out["bf16_high_calls"] == 2 * 2 * 2  # 2 cases, unsplit and split, 2 blocks: the high path ran
            assert _max_diff(out["pipeline"], out["pipeline_one_process"]) <= TOLERANCE
            assert "before accelpatch.apply" in out["late_apply"]
            assert out["late_apply_left"] == "SanaLinearAttnProcessor3_0"
    assert all(out["sites"] == ranks[0]["sites"] and out["fusions"] == ranks[0]["fusions"] for out in ranks)
    sites = ranks[0]["sites"]  # per block: lossless and high calls of both cases (high declines fp32 to lossless)
    assert sites[("transformer_blocks.0", "sana_video_fused_block")][0] == 4
    assert sites[("transformer_blocks.0.attn1", "sana_video_fused_linear_attention")][0] == 4
