"""Sequence and CFG parallelism together, and with the compiler, on real gloo processes.

- 2 × 2: the SANA-Video pipeline on a ``parallel_mesh(cfg=2, ulysses=2)``, diffusers' sequence split and
  accelpatch's CFG split on one mesh, against one process (fp32, relative to the output's magnitude).
- torch.compile of the blocks (Dynamo with the eager backend; diffusers' regional ``compile_repeated_blocks`` on a
  split SANA-Video 2.0, ``block.compile()`` per block on a split SANA-Video, whose diffusers class names none): the eager split's bits and counts (the collectives in compiled blocks
  are traced or broken around as Dynamo decides; Inductor on a split model ran once by hand, within 1e-5 of the
  eager split).
- offloading on each rank: diffusers' group offloading to disk, block by block, on a split SANA-Video (the weights
  come back from disk at every onload, its hooks wrap the blocks' forwards around the split's): the eager split's
  bits.
"""
import textwrap

import pytest
import torch
from _multiprocess import START, run_ranks

BOTH = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import sana_video_pipeline_call_kwargs, tiny_sana_video_pipeline
        pipe = tiny_sana_video_pipeline()
        accelpatch.apply(pipe)
        mesh = accelpatch.parallel.parallel_mesh(cfg=2, ulysses=2)
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh))
        accelpatch.parallel.enable_cfg_parallel(pipe, mesh=mesh)
        out = {"frames": pipe(**sana_video_pipeline_call_kwargs(frames=13, output_type="latent")).frames}
        report = accelpatch.report(pipe)
        out["parallel"] = report.models[0].parallel
        out["sites"] = {(s.path, s.kind): (s.fast_calls, s.reference_calls) for s in report.sites}
        accelpatch.remove(pipe)
        out["left"] = (pipe.transformer._parallel_config, accelpatch.parallel.cfg.cfg_parallel_of(pipe.transformer))
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(4, int(sys.argv[2]), sys.argv[1]), nprocs=4)
""")

COMPILED = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer
        model = tiny_sana_video2_transformer()
        accelpatch.apply(model)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        inputs = sana_video2_transformer_inputs(model, frames=4)
        out = {}
        with torch.no_grad():
            out["eager"] = model(**inputs).sample
            eager = accelpatch.report(model, reset=True)
            model.compile_repeated_blocks(backend="eager")  # Dynamo's tracing of the split; Inductor is not the point
            out["compiled"] = model(**inputs).sample
            out["blocks_compiled"] = all(getattr(b, "_compiled_call_impl", None) is not None for b in model.blocks)
            compiled = accelpatch.report(model)
        out["counts"] = [{(s.path, s.kind, s.tier): (s.fast_calls, dict(s.reference_calls)) for s in r.sites}
                         for r in (eager, compiled)]

        from diffusers.hooks import apply_group_offloading
        from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer
        sana = {}
        for name in ("compiled", "offloaded"):
            model = tiny_sana_video_transformer()
            accelpatch.apply(model)
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
            inputs = sana_video_transformer_inputs(model, num_frames=4)
            with torch.no_grad():
                sana[name + "_eager"] = model(**inputs).sample
                if name == "compiled":  # diffusers' SANA-Video declares no _repeated_blocks: compile each block
                    for block in model.transformer_blocks:
                        block.compile(backend="eager")
                    sana["blocks_compiled"] = all(getattr(b, "_compiled_call_impl", None) is not None
                                                  for b in model.transformer_blocks)
                else:
                    apply_group_offloading(model, onload_device=torch.device("cpu"), offload_type="block_level",
                                           num_blocks_per_group=1,
                                           offload_to_disk_path=os.path.join(folder, f"offload{rank}"))
                sana[name] = model(**inputs).sample
                if name == "offloaded":  # the blocks went to disk after their first use and come back from it
                    sana["offloaded_files"] = len(os.listdir(os.path.join(folder, f"offload{rank}")))
                sana[name + "_again"] = model(**inputs).sample
        out["sana_video"] = sana
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


def test_cfg_and_sequence_parallelism_on_one_mesh_match_one_process(tmp_path):
    import accelpatch
    from accelpatch.testing import sana_video_pipeline_call_kwargs, tiny_sana_video_pipeline

    ranks = run_ranks(tmp_path, BOTH, 4)
    pipe = tiny_sana_video_pipeline()
    one = pipe(**sana_video_pipeline_call_kwargs(frames=13, output_type="latent")).frames
    for rank in ranks:
        # the sequence split's summation order plus CFG parallelism's batch-1 kernels, amplified by guidance and the
        # solver: the scaled fp32 tolerance of tests/test_cfg_parallel.py (measured 2.9e-7; the sequence split
        # alone 2.2e-7, CFG alone 2.9e-7, on these latents of magnitude ~1e3)
        assert (rank["frames"] - one).abs().max() <= 5e-6 * one.abs().max()
        assert rank["parallel"] == {"sequence": 2, "cfg": {"split": 2, "whole": {}}}
        assert rank["sites"] == ranks[0]["sites"] and rank["left"] == (None, None)
    assert not torch.equal(one, tiny_sana_video_pipeline()(**sana_video_pipeline_call_kwargs(
        frames=13, output_type="latent", guidance_scale=1.0)).frames)  # guidance changes the output: CFG ran
    del accelpatch


@pytest.mark.timeout(600)  # compiles in each of the processes: ~1 min here
def test_compiled_and_offloaded_blocks_on_a_split_model_match_the_eager_split(tmp_path):
    from accelpatch.core.sites import NO_FUSED_OP_COMPILED

    for rank in run_ranks(tmp_path, COMPILED, 2):
        assert rank["blocks_compiled"]
        assert torch.equal(rank["compiled"], rank["eager"])  # the eager backend: the same ops, the same bits
        eager, compiled = rank["counts"]
        assert eager.keys() == compiled.keys()
        for site, (fast, reference) in eager.items():  # every site ran as often, compiled or not
            assert fast + sum(reference.values()) == compiled[site][0] + sum(compiled[site][1].values()), site
            if site[2] == "lossless" and fast:  # the compiled graph runs no fused op of ours: not a fast call there
                assert compiled[site] == (0, {**reference, NO_FUSED_OP_COMPILED: fast}), site
            else:
                assert compiled[site] == (fast, reference), site
        sana = rank["sana_video"]
        assert sana["blocks_compiled"] and sana["offloaded_files"] >= 2  # a safetensors file per block group
        for name in ("compiled", "compiled_again", "offloaded", "offloaded_again"):
            assert torch.equal(sana[name], sana[name.split("_")[0] + "_eager"]), name
