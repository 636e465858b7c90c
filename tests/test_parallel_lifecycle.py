"""apply()/remove() on a model split over processes (accelpatch.parallel.lifecycle), two real gloo processes on
CPU with MiniMax-H3 (diffusers gives it a plan): remove() undoes parallelism enabled after apply and leaves the
model as unpatched and unsplit as it was; ranks patched differently, or running different tiers in one call, are
refused on every rank with the reason instead of hanging in a collective."""
import textwrap

import torch
from _multiprocess import START, run_ranks

SCRIPT = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer
        out = {}
        model = tiny_minimax_h3_transformer()
        inputs = minimax_h3_transformer_inputs(model, num_video=1100)
        untouched = {name: type(m) for name, m in model.named_modules()}
        forwards = {name for name, m in model.named_modules() if "forward" in m.__dict__}
        with torch.no_grad():
            out["one_process"] = model(**inputs).sample
            accelpatch.apply(model)
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
            out["split"] = model(**inputs).sample
            try:  # re-patching in place would lose the split half-way: refused, the model left as it is
                accelpatch.apply(model, tier="exact")
            except RuntimeError as error:
                out["repatch_error"] = str(error)
            out["still_split"] = torch.equal(model(**inputs).sample, out["split"])
            # a tier that differs between the ranks in one call: refused on every rank
            try:
                with accelpatch.quality("exact" if rank == 0 else "lossless"):
                    model(**inputs)
            except RuntimeError as error:
                out["tier_error"] = str(error)
            accelpatch.remove(model)
            out["config_after_remove"] = model._parallel_config
            out["hooks_after_remove"] = [n for n, m in model.named_modules() if hasattr(m, "_diffusers_hook")]
            out["classes_restored"] = {n: type(m) for n, m in model.named_modules()} == untouched
            out["forwards_after_remove"] = sorted(
                {n for n, m in model.named_modules() if "forward" in m.__dict__} - forwards)
            out["processor_configs"] = [n for n, m in model.named_modules()
                                        if getattr(getattr(m, "processor", None), "_parallel_config", None)]
            out["after_remove"] = model(**inputs).sample  # unsplit again: the whole sequence on this rank
            # ranks patched differently: refused on every rank at the first split call
            accelpatch.apply(model, tier="exact" if rank == 0 else "lossless")
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
            try:
                model(**inputs)
            except RuntimeError as error:
                out["patch_error"] = str(error)
        # a SANA-Video split by a plan of the user's before apply(): refused, naming the order that works
        from accelpatch.testing import tiny_sana_video_transformer
        from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
        sana = tiny_sana_video_transformer()
        sana.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world), cp_plan={
            "transformer_blocks.0": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)})
        try:
            accelpatch.apply(sana)
        except RuntimeError as error:
            out["foreign_plan_error"] = str(error)
        out["foreign_untouched"] = "_accelpatch_state" not in sana.__dict__
        # remove() also takes CFG parallelism off
        cfg_model = tiny_minimax_h3_transformer()
        accelpatch.apply(cfg_model)
        accelpatch.parallel.enable_cfg_parallel(cfg_model)
        accelpatch.remove(cfg_model)
        out["cfg_after_remove"] = accelpatch.parallel.cfg.cfg_parallel_of(cfg_model)
        out["cfg_hooks_after_remove"] = len(cfg_model._forward_pre_hooks) + len(cfg_model._forward_hooks)
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


def test_remove_undoes_parallelism_and_mismatched_ranks_are_refused(tmp_path):
    for out in run_ranks(tmp_path, SCRIPT, 2):
        torch.testing.assert_close(out["split"], out["one_process"], atol=1e-5, rtol=1e-5)  # really split, still right
        assert "different tiers" in out["tier_error"] and "['exact', 'lossless']" in out["tier_error"]
        assert out["config_after_remove"] is None and out["processor_configs"] == []
        assert out["hooks_after_remove"] == [] and out["forwards_after_remove"] == []
        assert out["classes_restored"]
        assert torch.equal(out["after_remove"], out["one_process"])  # the untouched model, bit for bit
        assert "ranks [1] are patched differently from rank 0" in out["patch_error"]
        assert "after accelpatch.apply(): apply() with other arguments cannot re-patch" in out["repatch_error"]
        assert out["still_split"]
        assert "parallelised (enable_parallelism) before accelpatch.apply()" in out["foreign_plan_error"]
        assert out["foreign_untouched"]
        assert out["cfg_after_remove"] is None and out["cfg_hooks_after_remove"] == 0


def test_a_split_that_leaves_processes_out_is_refused_before_any_collective(monkeypatch):
    import types

    from accelpatch.parallel import lifecycle

    mesh = types.SimpleNamespace(get_group=lambda: None, get_local_rank=lambda: 0, size=lambda: 2)
    config = types.SimpleNamespace(context_parallel_config=types.SimpleNamespace(_flattened_mesh=mesh))
    monkeypatch.setattr(lifecycle.dist, "get_world_size", lambda group=None: 3)
    model = torch.nn.Linear(1, 1)
    try:
        lifecycle.refuse_world_mismatch(model, config)
    except RuntimeError as error:
        message = str(error)
    else:
        raise AssertionError("a 2-way split of a 3-process job was accepted")
    assert "split 2 ways over the sequence" in message and "the job has 3 processes" in message
    assert "--nproc_per_node=2" in message
    monkeypatch.setattr(lifecycle.dist, "get_world_size", lambda group=None: 2)
    lifecycle.refuse_world_mismatch(model, config)  # every process used: accepted
