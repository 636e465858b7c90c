"""CFG parallelism (accelpatch.parallel.cfg) on real processes with the gloo backend on CPU, fp32 tiny models.

Expected values come from one process: the pipeline (or transformer) running batched CFG unchanged, and the same
model called once per branch at batch B. The split is bitwise equal to the per-branch calls. Against the batched
call it is bitwise equal for MiniMax-H3 only: SANA-Video's patch-embedding Conv3d and SANA-Video 2.0's timestep MLP
(a Linear on [B, 256]: a matrix-vector product at B=1, a matrix product at B=2) pick batch-size-dependent CPU
kernels whose accumulation order differs, so one batch-1 branch differs from its half of the batch-2 call by a few
ulps there (measured max |Δ| 7e-7 and 2.4e-7 in the first layer; after the whole pipeline see SCALED_TOLERANCE).
"""
import textwrap

import pytest
import torch
from _multiprocess import LAUNCH, run_ranks

#: max |Δ| / max |reference| allowed against the batched call (fp32 eps 1.2e-7: a few ulps per call, amplified by
#: the guidance scale (4.5 / 8) and the solver's steps). Measured: SANA-Video 4.3e-7, its image-to-video 3.7e-7,
#: SANA-Video 2.0 6.4e-7 (pipelines); one SANA-Video 2.0 call with per-frame timesteps 1.2e-6; MiniMax-H3 under
#: Ulysses 1.4e-7
SCALED_TOLERANCE = 5e-6

#: SANA-Video 2.0's tiny tokenizer encodes the prompt and the negative prompt alike: the call gets distinct random
#: text embeddings instead, so that the two branches differ (a swapped gather would go unseen otherwise)
HELPERS = textwrap.dedent("""
    def sana2_kwargs(pipe):
        import torch
        from accelpatch.testing import sana_video2_pipeline_call_kwargs
        g = torch.Generator().manual_seed(2)
        embeds = lambda: torch.randn(1, 8, pipe.transformer.config.caption_channels, generator=g)  # noqa: E731
        mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
        return dict(sana_video2_pipeline_call_kwargs(output_type="latent"), prompt=None, prompt_embeds=embeds(),
                    prompt_attention_mask=mask, negative_prompt_embeds=embeds(),
                    negative_prompt_attention_mask=mask.flip(1))
""")
exec(HELPERS)

COMMON = HELPERS + LAUNCH + textwrap.dedent("""
    import datetime, os, sys, warnings
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def start(rank, world, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)

    def hooks(model):
        return (list(model._forward_pre_hooks), list(model._forward_hooks), "_accelpatch_cfg_parallel" in vars(model))

    def decide_alone(would_reuse):
        # this rank's own threshold test says would_reuse (the same cache settings everywhere: ranks patched
        # differently are refused); the ranks then decide together
        from accelpatch.step_cache.cache import StepCache
        original = StepCache._may_reuse
        StepCache._may_reuse = lambda self, state, unchanged: original(self, state, lambda: would_reuse)

    def error(fn):
        try:
            fn()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None
""")

TWO = COMMON + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from accelpatch import testing as T
        from accelpatch.parallel.cfg import cfg_parallel_counts
        from diffusers import SanaImageToVideoPipeline
        out = {}

        def counts(target):
            report = accelpatch.report(target)
            return (report.fast_calls, report.fallback_calls,
                    {(s.path, s.kind): (s.fast_calls, s.reference_calls) for s in report.sites})

        pipe = T.tiny_sana_video_pipeline()
        before = hooks(pipe.transformer)
        accelpatch.parallel.enable_cfg_parallel(pipe)
        accelpatch.parallel.enable_cfg_parallel(pipe)  # again: nothing changes
        out["sana"] = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames
        out["sana_no_guidance"] = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent",
                                                                          guidance_scale=1.0)).frames
        out["sana_counts"] = cfg_parallel_counts(pipe)
        accelpatch.apply(pipe)  # the default tier: bit-identical, the same fast-path counts on both ranks
        out["sana_applied"] = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames
        out["sana_report"] = counts(pipe)
        accelpatch.remove(pipe)  # CFG parallelism off too: on again
        accelpatch.parallel.enable_cfg_parallel(pipe)
        # the step cache: rank 0 alone would reuse, rank 1 alone never
        decide_alone(rank == 0)
        accelpatch.apply(pipe, tier="high", cache="first_block", cache_warmup_steps=0, cache_final_steps=0,
                         cache_max_reuse=1)
        out["sana_cache"] = pipe(**T.sana_video_pipeline_call_kwargs(4, output_type="latent")).frames
        out["cache_counts"] = accelpatch.report(pipe).models[0].cache
        accelpatch.remove(pipe)
        accelpatch.parallel.enable_cfg_parallel(pipe)
        from diffusers import MagCacheConfig  # ratios of 1: alone, MagCache would skip whenever the guards allow
        accelpatch.apply(pipe, tier="high", cache=MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4,
                                                                 retention_ratio=0.0, max_skip_steps=2),
                         cache_warmup_steps=0, cache_final_steps=0)
        pipe(**T.sana_video_pipeline_call_kwargs(4, output_type="latent"))
        out["mag_counts"] = accelpatch.report(pipe).models[0].cache
        accelpatch.remove(pipe)
        accelpatch.parallel.disable_cfg_parallel(pipe)
        out["sana_undone"] = (before, hooks(pipe.transformer))
        i2v = SanaImageToVideoPipeline(**pipe.components)
        accelpatch.parallel.enable_cfg_parallel(i2v)
        kwargs = T.sana_video_pipeline_call_kwargs(output_type="latent")
        kwargs["image"] = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        out["i2v"] = i2v(**kwargs).frames
        accelpatch.parallel.disable_cfg_parallel(i2v)

        pipe2 = T.tiny_sana_video2_pipeline()
        accelpatch.parallel.enable_cfg_parallel(pipe2)
        accelpatch.apply(pipe2)  # the default tier: bit-identical to the unpatched per-branch reference
        out["sana2"] = pipe2(**sana2_kwargs(pipe2)).frames
        out["sana2_report"] = counts(pipe2)
        accelpatch.remove(pipe2)  # CFG parallelism off too: on again
        accelpatch.parallel.enable_cfg_parallel(pipe2)
        seeds = sana2_kwargs(pipe2)
        seeds["generator"] = torch.Generator().manual_seed(rank)  # each rank its own noise: rank 0's is denoised
        out["different_seeds"] = pipe2(**seeds).frames
        out["decoded"] = pipe2(**dict(sana2_kwargs(pipe2), output_type="pt")).frames  # rank 0 decodes, alone
        out["decoded_everywhere"] = pipe2(**dict(sana2_kwargs(pipe2), output_type="pt"),
                                          decode_on_every_rank=True).frames
        with torch.no_grad():  # per-frame timesteps [2B, 1, F, 1, 1] (image-to-video), straight into the model
            out["sana2_per_frame"] = pipe2.transformer(**T.sana_video2_transformer_inputs(
                pipe2.transformer, per_frame_timesteps=True), return_dict=False)
        accelpatch.parallel.disable_cfg_parallel(pipe2)

        model = T.tiny_minimax_h3_transformer()
        before = hooks(model)
        accelpatch.parallel.enable_cfg_parallel(model)
        accelpatch.apply(model)
        with torch.no_grad():
            out["minimax"] = model(**T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=40))
        out["minimax_report"] = counts(model)
        accelpatch.remove(model)  # CFG parallelism off too: on again
        accelpatch.parallel.enable_cfg_parallel(model)
        with torch.no_grad():
            out["minimax_batch1"] = model(**T.minimax_h3_transformer_inputs(model, batch_size=1, num_video=40))
            out["odd_batch"] = error(lambda: model(**T.minimax_h3_transformer_inputs(model, batch_size=3)))
        out["minimax_counts"] = cfg_parallel_counts(model)
        import copy
        out["copy"] = error(lambda: copy.deepcopy(model))
        out["no_cfg_dim"] = error(lambda: accelpatch.parallel.enable_cfg_parallel(model, mesh=accelpatch.parallel.parallel_mesh(
            cfg=1, ulysses=2)))
        accelpatch.parallel.disable_cfg_parallel(model)
        out["minimax_undone"] = (before, hooks(model))
        mesh = accelpatch.parallel.parallel_mesh(cfg=1, ulysses=2)  # a cfg degree of 1: calls run whole, counted
        accelpatch.parallel.enable_cfg_parallel(model, mesh=mesh)
        with torch.no_grad():
            out["minimax_degree1"] = model(**T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=40))
        out["degree1_counts"] = cfg_parallel_counts(model)
        out["bad_mesh"] = error(lambda: accelpatch.parallel.parallel_mesh(cfg=2, ulysses=2))
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("cfg2"), TWO, 2, timeout=120)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and torch.equal(a.view(torch.int32), b.view(torch.int32)))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a`` within :data:`SCALED_TOLERANCE` of ``b``, relative to ``b``'s largest magnitude."""
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    scaled = float((a - b).abs().max() / b.abs().max())
    print(f"max |delta| / max |reference| = {scaled:.2e}")
    assert scaled <= SCALED_TOLERANCE, scaled


def _per_branch(model: torch.nn.Module, shared=frozenset()):
    """One process, CFG's two branches called one after another at batch B (the reference of a split): the
    arguments whose dim 0 is the batch, cut in two; the outputs concatenated."""
    forward = model.forward

    def run(*args, **kwargs):
        batch = args[0].shape[0] if args else kwargs["hidden_states"].shape[0]
        cut = lambda v, i: v.chunk(2)[i] if torch.is_tensor(v) and v.dim() and v.shape[0] == batch else v  # noqa
        outs = [forward(*[cut(a, i) for a in args], **{k: v if k in shared else cut(v, i) for k, v in kwargs.items()})
                for i in (0, 1)]
        return tuple(torch.cat([o[j] for o in outs]) for j in range(len(outs[0])))
    model.forward = run
    return model


def test_sana_video_pipeline_matches_one_process(two):
    from accelpatch import testing as T

    pipe = T.tiny_sana_video_pipeline()
    batched = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames
    _per_branch(pipe.transformer)
    per_branch = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames
    for rank in two:
        assert _same_tensor(rank["sana"], per_branch)
        _close(rank["sana"], batched)
        assert _same_tensor(rank["sana_applied"], rank["sana"])  # apply() at lossless: bit-identical
    assert not torch.equal(per_branch, batched)  # the batch-size-dependent kernels of the module docstring


def test_image_to_video_splits_the_per_frame_timestep(two):
    from diffusers import SanaImageToVideoPipeline

    from accelpatch import testing as T

    def kwargs():  # a fresh generator each call
        return dict(T.sana_video_pipeline_call_kwargs(output_type="latent"),
                    image=torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)))

    pipe = SanaImageToVideoPipeline(**T.tiny_sana_video_pipeline().components)
    batched = pipe(**kwargs()).frames
    _per_branch(pipe.transformer)
    per_branch = pipe(**kwargs()).frames
    for rank in two:
        assert _same_tensor(rank["i2v"], per_branch)
        _close(rank["i2v"], batched)


def test_sana_video2_pipeline_matches_one_process(two):
    from accelpatch import testing as T

    pipe = T.tiny_sana_video2_pipeline()
    batched = pipe(**sana2_kwargs(pipe)).frames  # noqa: F821 (from HELPERS)
    _per_branch(pipe.transformer)
    per_branch = pipe(**sana2_kwargs(pipe)).frames  # noqa: F821
    for rank in two:
        assert _same_tensor(rank["sana2"], per_branch)
        _close(rank["sana2"], batched)
        assert _same_tensor(rank["different_seeds"], rank["sana2"])  # seeded per rank: rank 0's noise (seed 0)
    decoded = pipe(**dict(sana2_kwargs(pipe), output_type="pt")).frames  # noqa: F821
    assert _same_tensor(two[0]["decoded"], decoded) and two[1]["decoded"] is None  # only the first rank decodes
    assert all(_same_tensor(rank["decoded_everywhere"], decoded) for rank in two)


def test_sana_video2_per_frame_timesteps(two):
    from accelpatch import testing as T

    model = T.tiny_sana_video2_pipeline().transformer
    inputs = T.sana_video2_transformer_inputs(model, per_frame_timesteps=True)
    assert inputs["timestep"].shape[0] == 2 and inputs["timestep"].dim() == 5
    with torch.no_grad():
        (batched,) = model(**inputs, return_dict=False)
        (per_branch,) = _per_branch(model)(**inputs, return_dict=False)
    assert not batched.is_contiguous()  # channels-last 3-D: the split keeps it
    per_branch = torch.empty_like(batched).copy_(per_branch)  # in the batched call's layout (cat's is contiguous)
    for rank in two:
        assert _same_tensor(rank["sana2_per_frame"][0], per_branch)
        _close(rank["sana2_per_frame"][0], batched)


def test_minimax_h3_transformer_is_bitwise_the_batched_call(two):
    from accelpatch import testing as T

    from accelpatch.parallel.cfg import SHARED_ARGUMENTS

    model = T.tiny_minimax_h3_transformer()
    inputs = T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=40)
    with torch.no_grad():
        batched = model(**inputs)
        alone = model(**T.minimax_h3_transformer_inputs(model, batch_size=1, num_video=40))
        per_branch = _per_branch(model, SHARED_ARGUMENTS[type(model).__name__])(**inputs)
    for rank in two:
        # bit for bit what one process computes branch by branch; the batched call rounds alike only where the
        # CPU's kernels do not block by batch size (AVX2 machines: equal; AVX-512: SDPA differs by ~3e-7)
        for got, want, whole in zip(rank["minimax"].to_tuple(), per_branch, batched.to_tuple()):
            assert _same_tensor(got, want)
            _close(got, whole)
        for got, want in zip(rank["minimax_degree1"].to_tuple(), batched.to_tuple()):
            assert _same_tensor(got, want)
        for got, want in zip(rank["minimax_batch1"].to_tuple(), alone.to_tuple()):
            assert _same_tensor(got, want)
        assert type(rank["minimax"]).__name__ == "MiniMaxH3TransformerOutput"


def test_minimax_h3_shares_its_timestep_across_the_batch():
    """MiniMax-H3's ``timestep`` lists the distinct noise levels (2 here, as many as the batch): a split that cut
    every tensor whose dim 0 is the batch would cut it too (hence the table of shared arguments)."""
    from accelpatch import testing as T
    from accelpatch.parallel.cfg import SHARED_ARGUMENTS

    model = T.tiny_minimax_h3_transformer()
    inputs = T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=40)
    assert inputs["timestep"].shape[0] == 2 and "timestep" in SHARED_ARGUMENTS[type(model).__name__]
    with torch.no_grad(), pytest.raises(IndexError):
        _per_branch(model)(**inputs)  # the timestep cut in two: a row's noise level index points past it
    model.forward = type(model).forward.__get__(model)
    shared = SHARED_ARGUMENTS[type(model).__name__]
    with torch.no_grad():
        batched = model(**inputs).to_tuple()
        split = _per_branch(model, shared)(**inputs)
    for a, b in zip(split, batched):  # within rounding: a row with the other row's noise level is off by ~1e-2
        _close(a, b)


def test_the_checks_catch_a_perturbed_reference():
    reference = torch.randn(2, 4, 3, 8, 8, generator=torch.Generator().manual_seed(0)).contiguous(
        memory_format=torch.channels_last_3d)
    one_ulp = reference.clone()
    one_ulp[1, 2, 0, 3, 4] = torch.nextafter(one_ulp[1, 2, 0, 3, 4], torch.tensor(float("inf")))
    assert _same_tensor(reference, reference.clone()) and not _same_tensor(one_ulp, reference)
    assert not _same_tensor(reference.contiguous(), reference)  # same values, other strides
    _close(one_ulp, reference)
    off = reference.clone()
    off[1, 2, 0, 3, 4] += 1e-4 * reference.abs().max()
    with pytest.raises(AssertionError):
        _close(off, reference)


def test_calls_without_branches_run_whole_and_are_counted(two):
    from accelpatch.parallel import cfg

    for rank in two:
        assert rank["sana_counts"] == {"transformer": {"split": 2, "whole": {cfg.NO_GUIDANCE: 2}}}
        assert rank["minimax_counts"] == {"": {"split": 0, "whole": {cfg.BATCH_OF_ONE: 1}}}  # enabled again after remove()
        assert rank["degree1_counts"] == {"": {"split": 0, "whole": {cfg.DEGREE_ONE: 1}}}
    assert torch.equal(two[0]["sana_no_guidance"], two[1]["sana_no_guidance"])


@pytest.mark.parametrize("model", ["sana", "sana2", "minimax"])
def test_every_rank_reports_the_same_counts(two, model):
    assert two[0][f"{model}_report"] == two[1][f"{model}_report"]
    assert two[0][f"{model}_report"][0] > 0  # fast paths ran


def test_the_step_cache_decides_together(two):
    """Alone, rank 0 would reuse and rank 1 never (their threshold tests forced so): together, both compute."""
    counts = [rank["cache_counts"] for rank in two]
    assert counts[0]["computed"] == counts[1]["computed"] == 4 and counts[0]["reused"] == counts[1]["reused"] == 0
    assert any("another rank computes" in reason for reason in counts[0]["reasons"])
    assert torch.equal(two[0]["sana_cache"], two[1]["sana_cache"])
    from accelpatch.step_cache.config import MAG_SPLIT

    for rank in two:  # MagCache decides inside diffusers' hook, per rank: on a split model it computes, saying why
        assert (rank["mag_counts"]["computed"], rank["mag_counts"]["reused"]) == (4, 0)
        assert rank["mag_counts"]["reasons"] == {MAG_SPLIT: 4}


def test_misuse_gets_a_clear_error(two):
    for rank in two:
        assert "batch of 3" in rank["odd_batch"] and "does not split over the 2 cfg ranks" in rank["odd_batch"]
        assert "already enabled" in rank["no_cfg_dim"]
        assert "product of the degrees must equal the world size" in rank["bad_mesh"]
        assert "cannot be copied or pickled" in rank["copy"] and "disable_cfg_parallel()" in rank["copy"]


def test_no_process_group():
    import accelpatch
    from accelpatch import testing as T

    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        accelpatch.parallel.enable_cfg_parallel(T.tiny_minimax_h3_transformer())
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        accelpatch.parallel.parallel_mesh()


def test_undo_leaves_nothing_registered(two):
    for rank in two:
        for key in ("sana_undone", "minimax_undone"):
            before, after = rank[key]
            assert after == before and after[2] is False


FOUR = COMMON + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from accelpatch import testing as T
        from diffusers import ContextParallelConfig
        from torch.distributed.device_mesh import init_device_mesh
        out = {}
        inputs = lambda model, seed=0: T.minimax_h3_transformer_inputs(  # noqa: E731
            model, batch_size=2, num_video=40, seed=seed)
        mesh = accelpatch.parallel.parallel_mesh(cfg=2, ulysses=2)

        model = T.tiny_minimax_h3_transformer()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh))
        accelpatch.parallel.enable_cfg_parallel(model, mesh=mesh)
        with torch.no_grad():
            out["both"] = model(**inputs(model)).to_tuple()
        out["no_mesh"] = error(lambda: accelpatch.parallel.enable_cfg_parallel(T.tiny_minimax_h3_transformer()))

        # the step cache under CFG x sequence: alone, ranks 0 and 2 would reuse, 1 and 3 never
        model = T.tiny_minimax_h3_transformer()
        decide_alone(rank % 2 == 0)
        accelpatch.apply(model, tier="high", cache="first_block", cache_warmup_steps=0, cache_final_steps=0,
                         cache_max_reuse=1)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh))
        accelpatch.parallel.enable_cfg_parallel(model, mesh=mesh)
        with torch.no_grad():
            for step in range(4):
                with accelpatch.denoising_step(step):
                    out["cached"] = model(**inputs(model, seed=step)).to_tuple()  # the residual moves
        out["cache_counts"] = accelpatch.report(model).models[0].cache

        # a cfg mesh whose cfg slices are not diffusers' sequence groups: refused before any collective
        other = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("ulysses", "cfg", "ring"))
        model = T.tiny_minimax_h3_transformer()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh))
        accelpatch.parallel.enable_cfg_parallel(model, mesh=other)
        with torch.no_grad():
            out["other_mesh"] = error(lambda: model(**inputs(model)))
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(4, int(sys.argv[2]), sys.argv[1]), nprocs=4)
""")


def test_cfg_times_ulysses_on_four_processes(tmp_path):
    """MiniMax-H3 (diffusers' own context-parallel plan) on a 2 (cfg) x 2 (ulysses) mesh: the output matches one
    process (Ulysses reorders nothing within a head, but its all-to-all changes the batch of heads each attention
    call sees: measured max |Δ| / max |reference| 1.4e-7), and a step cache whose ranks would decide differently
    alone (a hang in the next all-to-all) decides together: the run finishes within the timeout."""
    ranks = run_ranks(tmp_path, FOUR, 4, timeout=150)
    from accelpatch import testing as T

    model = T.tiny_minimax_h3_transformer()
    with torch.no_grad():
        batched = model(**T.minimax_h3_transformer_inputs(model, batch_size=2, num_video=40)).to_tuple()
    for rank in ranks:
        for got, want in zip(rank["both"], batched):
            _close(got, want)
        assert "the world has 4" in rank["no_mesh"] and "parallel_mesh(cfg=2" in rank["no_mesh"]
        assert "must be the ranks sharing this rank's cfg index" in rank["other_mesh"]
        counts = rank["cache_counts"]
        assert (counts["computed"], counts["reused"]) == (4, 0)
    assert any("another rank computes" in reason for reason in ranks[0]["cache_counts"]["reasons"])
    assert all(torch.equal(a, b) for r in ranks[1:] for a, b in zip(r["cached"], ranks[0]["cached"]))


ONE = COMMON + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from accelpatch import testing as T
        pipe = T.tiny_sana_video_pipeline()
        out = {"plain": pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accelpatch.parallel.enable_cfg_parallel(pipe)
            out["enabled"] = pipe(**T.sana_video_pipeline_call_kwargs(output_type="latent")).frames
        out["warnings"] = [str(w.message) for w in caught if "CFG parallelism" in str(w.message)]
        out["counts"] = accelpatch.parallel.cfg_parallel_counts(pipe)
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(1, int(sys.argv[2]), sys.argv[1]), nprocs=1)
""")


def test_world_size_one_runs_unchanged_and_says_so(tmp_path):
    from accelpatch.parallel import cfg

    (rank,) = run_ranks(tmp_path, ONE, 1, timeout=120)
    assert _same_tensor(rank["enabled"], rank["plain"])
    assert rank["counts"] == {"transformer": {"split": 0, "whole": {cfg.DEGREE_ONE: 2}}}
    assert len(rank["warnings"]) == 1 and cfg.DEGREE_ONE in rank["warnings"][0]


def test_the_gathered_buffer_keeps_every_dtype_and_size():
    """Outputs of odd byte counts and mixed dtypes travel in one buffer; each comes back bit for bit."""
    from accelpatch.parallel.cfg import ALIGN, pack, unpack

    g = torch.Generator().manual_seed(0)
    tensors = [torch.tensor([3, -7], dtype=torch.int64), torch.randn(3, 5, generator=g).to(torch.bfloat16),
               torch.randn(2, 3, 7, generator=g), torch.randn(1, generator=g).to(torch.float16),
               torch.randn(4, 3, generator=g).t()]  # non-contiguous
    buffer, sizes = pack(tensors)
    assert buffer.dtype == torch.uint8 and all(size % ALIGN == 0 for size in sizes)
    for got, want in zip(unpack(buffer.clone(), sizes, tensors), tensors):
        assert got.dtype == want.dtype and got.shape == want.shape
        raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        assert torch.equal(raw(got), raw(want))  # bit for bit
