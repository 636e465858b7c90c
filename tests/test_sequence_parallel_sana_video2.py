"""SANA-Video 2.0 split over ranks through diffusers' own ``enable_parallelism`` (the model's ``_cp_plan``): real
processes on gloo, fp32 tiny models, compared with the unsplit model run in this (single, non-distributed) process.

Tolerance. The split changes the arithmetic in one place by design: each linear-attention layer's token sums (the
state Σ v·k̃ᵀ and Σ ReLU(k)) are taken per rank and added by the all-reduce, another summation order than one
process's single sum. Everything else is per token or per head over the whole sequence (the anchors under Ulysses),
so it differs at most where a kernel blocks a shorter row count differently. A reordered fp32 sum of n terms
differs by at most about n·u·Σ|terms| (u = 2^-24): with n = 96 tokens, 6e-6 relative to the sums' magnitudes, a
worst case that random rounding reaches only as √n·u ≈ 6e-7. Three linear layers pass their differences through the
later layers, the o_norm and the projections at O(1) gain, on outputs of magnitude ≲ 2 (the pipeline: two steps
and the VAE). Hence max |Δ| ≤ 1e-5. Measured: ≤ 2.1e-6 on 2 ranks, ≤ 5.4e-6 on 4 (the pipeline's frames; the
transformer alone ≤ 3.7e-6). A layer left local is off by 0.7–1.7 (checked below), five orders of magnitude away.
The same models in float64 agree to ≤ 1e-13 (measured 3.9e-15): the split is exact arithmetic, only its rounding
differs.

BF16 anchors exchange BF16 q/k/v and upcast after (``attention.anchor_core``): compared bit for bit with diffusers'
own Ulysses exchange of the FP32 tensors, run in the same processes.
"""
import textwrap

import pytest
import torch
from _multiprocess import LAUNCH, free_port, run_ranks

TOLERANCE = 1e-5
#: float64: the same reordering argument at u = 2^-53
F64_TOLERANCE = 1e-13
#: a layer left local (no all-reduce, misaligned per-frame modulation) is off by far more than this
WRONG = 1e-2

#: the sol_attn backend with every anchor call sparse (min_tokens=0: the tiny inputs lie below the default floor)
SOL_ATTN = {"backend": "sol_attn", "dense_steps": 0, "dense_layers": "", "min_tokens": 0, "tau": 3.0}

SCRIPT = LAUNCH + textwrap.dedent("""
    import os, sys, warnings
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    def run(name, world, build, inputs_of, *, apply=None, no_allreduce=False, whole_timesteps=False, pipeline=False,
            fp32_exchange=False, perturbed_exchange=False, anything=False):
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.models.sana_video2.modeling import attention, transformer as sv2
        from accelpatch.parallel import sequence
        target = build()
        model = target.transformer if pipeline else target
        if apply is not None:
            accelpatch.apply(target, **apply)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world, ulysses_anything=anything))
        saved = (attention.sum_over_ranks, sv2.local_frames, attention._own_ulysses, sequence.all_to_all,
                 attention.heads_to_ranks)
        exchanged = []
        def recording(send, group):
            exchanged.append((send.dtype, send.numel() * send.element_size()))
            return saved[3](send, group)
        sequence.all_to_all = recording  # the anchors' own exchange (diffusers' has its own)
        if fp32_exchange:  # the anchors' q/k/v upcast before diffusers' Ulysses exchange, as diffusers alone does
            attention._own_ulysses = lambda *args: None
        if perturbed_exchange:  # the anchors' exchange deliberately off by one BF16 step
            attention.heads_to_ranks = lambda x, shards: saved[4](x, shards) * (1 + 2 ** -7)
        if no_allreduce:  # the linear attention's token sums deliberately left local
            attention.sum_over_ranks = lambda x, shards: x
        if whole_timesteps:  # the per-frame timesteps deliberately left whole: modulation misses its tokens
            sv2.local_frames = lambda t, shards: t
        try:
            with torch.no_grad():
                out = target(**inputs_of(model))
            out = out.frames if pipeline else out.sample
        finally:
            (attention.sum_over_ranks, sv2.local_frames, attention._own_ulysses, sequence.all_to_all,
             attention.heads_to_ranks) = saved
        result = {"out": out, "exchanged": exchanged}
        if apply is not None:
            report = accelpatch.report(target)
            result["sites"] = {(s.path, s.kind): (s.fast_calls, s.fallback_calls) for s in report.sites}
            result["fast_calls"] = report.fast_calls
        return result

    def refused(call):
        try:
            call()
        except (ValueError, RuntimeError) as error:
            return f"{type(error).__name__}: {error}"
        return None

    SOL_ATTN = {"backend": "sol_attn", "dense_steps": 0, "dense_layers": "", "min_tokens": 0, "tau": 3.0}

    def worker(rank, world, port, folder, config, full):
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a wrong size fails here, not the machine
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.accelerator.device_count = lambda: 1  # diffusers computes rank % device_count (0 on CPU)
        from diffusers import ContextParallelConfig
        from accelpatch.testing import (SANA_VIDEO2_TINY_CONFIG, sana_video2_pipeline_call_kwargs,
                                        sana_video2_transformer_inputs, tiny_sana_video2_pipeline,
                                        tiny_sana_video2_transformer)
        build = lambda: tiny_sana_video2_transformer(**config)
        t2v = lambda model, **kw: sana_video2_transformer_inputs(model, frames=4, **kw)
        ti2v = lambda model: t2v(model, per_frame_timesteps=True)
        out = {}
        from accelpatch.parallel.sequence import heads_to_ranks, ranks_to_heads, shards_of_group
        whole = torch.randn(2, 3 * world, 2 * world, 4, generator=torch.Generator().manual_seed(0)).bfloat16()
        shard = whole.chunk(world, dim=1)[rank]  # [B, N/W, H, D]: this rank's tokens of every head
        heads = heads_to_ranks(shard, shards_of_group())
        out["exchange"] = (torch.equal(heads, whole[:, :, 2 * rank:2 * rank + 2]),
                           torch.equal(ranks_to_heads(heads, shards_of_group()), shard), heads.dtype)
        out["t2v"] = run("t2v", world, build, t2v)
        out["ti2v"] = run("ti2v", world, build, ti2v)
        out["t2v_3_frames"] = run("t2v_3_frames", world, build,
                                  lambda m: sana_video2_transformer_inputs(m, frames=3))  # a token split: fine
        both = (("t2v", t2v), ("ti2v", ti2v))
        for tier in ("lossless", "high") if full else ("lossless",):
            for kind, inputs in both if full else both[:1]:
                out[f"{tier}_{kind}"] = run(kind, world, build, inputs, apply={"tier": tier})
        bf16 = lambda: tiny_sana_video2_transformer(**config, dtype=torch.bfloat16)
        for kind, inputs in both if full else both[:1]:
            out[f"bf16_{kind}"] = run(kind, world, bf16, inputs)
            if full:  # diffusers' own FP32 exchange needs heads that divide (the 4-rank run pads them)
                out[f"bf16_{kind}_fp32_exchange"] = run(kind, world, bf16, inputs, fp32_exchange=True)
        if full:  # Sol-Attn on the anchors: per rank, on the whole sequence of its heads
            out["sol_attn_t2v"] = run("t2v", world, build, lambda m: t2v(m, height=16, width=16), apply=SOL_ATTN)
        f64 = lambda: tiny_sana_video2_transformer(**config, dtype=torch.float64)
        for kind, inputs in both if full else ():
            out[f"f64_{kind}"] = run(kind, world, f64, inputs)
        odd = lambda m: sana_video2_transformer_inputs(m, frames=3, height=3, width=5)  # 45 tokens
        if full:  # uneven token shards (diffusers' ulysses_anything) are refused, before diffusers' gather fails
            out["anything_t2v_45_tokens"] = refused(lambda: run("t2v", world, build, odd, anything=True))
            out["anything_ti2v_3_frames"] = refused(lambda: run("ti2v", world, build, lambda m: (
                sana_video2_transformer_inputs(m, frames=3, per_frame_timesteps=True)), anything=True))
            # the step cache runs on a split model: its ranks take each reuse decision together (tested in
            # test_cfg_parallel under CFG x Ulysses); at the default tier it only waits, and changes no bit
            out["step_cache"] = run("t2v", world, build, t2v, apply={"cache": "first_block"})
            out["bf16_lossless_t2v"] = run("t2v", world, bf16, t2v, apply={})
            out["bf16_t2v_perturbed"] = run("t2v", world, bf16, t2v, perturbed_exchange=True)
        out["no_allreduce"] = run("t2v", world, build, t2v, no_allreduce=True)
        out["whole_timesteps"] = run("ti2v", world, build, ti2v, whole_timesteps=True)
        out["pipeline"] = run("pipeline", world, lambda: tiny_sana_video2_pipeline(
                                  transformer_config={**SANA_VIDEO2_TINY_CONFIG, **config}),
                              lambda model: dict(sana_video2_pipeline_call_kwargs(seed=rank), decode_on_every_rank=True),
                              pipeline=True)
        # (seeded per rank on purpose: the pipeline denoises rank 0's noise on every rank; every rank decodes here,
        # to compare them all: by default only the first does, tested in test_cfg_parallel.py)
        model = build()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        with torch.no_grad():
            out["ti2v_3_frames"] = refused(lambda: model(**sana_video2_transformer_inputs(
                model, frames=3, per_frame_timesteps=True)))
            out["t2v_odd_tokens"] = refused(lambda: model(**sana_video2_transformer_inputs(
                model, frames=3, height=3, width=5)))
        out["with_grad"] = refused(lambda: model(**t2v(model)))
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        import json
        world = int(sys.argv[3])
        launch(worker, args=(world, int(sys.argv[2]), sys.argv[1], json.loads(sys.argv[4]), sys.argv[5] == "full"),
                 nprocs=world)
""")


def _run_ranks(tmp_path, world: int, config: dict, full: bool) -> list[dict]:
    """Run the script on ``world`` processes; ``full`` adds the cases that one world size covers (the high tier,
    TI2V in BF16, the lossless BF16 anchors, the perturbed exchange)."""
    import json

    return run_ranks(tmp_path, SCRIPT, world, str(world), json.dumps(config), "full" if full else "quick",
                     timeout=300)


def _one_process(config: dict) -> dict:
    """The unsplit outputs, in this process (no process group at all)."""
    import accelpatch
    from accelpatch.testing import (SANA_VIDEO2_TINY_CONFIG, sana_video2_pipeline_call_kwargs,
                                    sana_video2_transformer_inputs, tiny_sana_video2_pipeline,
                                    tiny_sana_video2_transformer)

    model = tiny_sana_video2_transformer(**config)
    expected = {}
    with torch.no_grad():
        f64 = tiny_sana_video2_transformer(**config, dtype=torch.float64)
        expected["f64_t2v"] = f64(**sana_video2_transformer_inputs(f64, frames=4)).sample
        expected["f64_ti2v"] = f64(**sana_video2_transformer_inputs(f64, frames=4, per_frame_timesteps=True)).sample
        expected["t2v"] = model(**sana_video2_transformer_inputs(model, frames=4)).sample
        expected["ti2v"] = model(**sana_video2_transformer_inputs(model, frames=4, per_frame_timesteps=True)).sample
        expected["t2v_3_frames"] = model(**sana_video2_transformer_inputs(model, frames=3)).sample
        sparse = tiny_sana_video2_transformer(**config)
        accelpatch.apply(sparse, **SOL_ATTN)
        large = sana_video2_transformer_inputs(sparse, frames=4, height=16, width=16)  # 1024 tokens: sparse blocks
        expected["sol_attn_t2v"] = sparse(**large).sample
        expected["sol_attn_dense"] = model(**large).sample
        expected["pipeline"] = tiny_sana_video2_pipeline(transformer_config={**SANA_VIDEO2_TINY_CONFIG, **config})(
            **sana_video2_pipeline_call_kwargs()).frames
    assert accelpatch.report  # imported: the reference never touches it
    return expected


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    return (a - b).abs().max().item()


def _check(ranks: list[dict], expected: dict) -> dict:
    diffs = {}
    for name in ("t2v", "ti2v", "t2v_3_frames", "lossless_t2v", "lossless_ti2v", "high_t2v", "high_ti2v",
                 "pipeline", "sol_attn_t2v"):
        if name not in ranks[0]:
            continue
        reference = expected[name.split("_", 1)[1] if name.startswith(("lossless_", "high_")) else name]
        for rank in ranks:
            diffs[name] = max(diffs.get(name, 0.0), _max_diff(rank[name]["out"], reference))
        assert all(torch.equal(rank[name]["out"], ranks[0][name]["out"]) for rank in ranks), name  # one gather
    assert max(diffs.values()) <= TOLERANCE, diffs
    for name in ("f64_t2v", "f64_ti2v"):  # the split is exact arithmetic: in float64 only rounding at 1e-16 is left
        if name in ranks[0]:
            diffs[name] = max(_max_diff(rank[name]["out"], expected[name]) for rank in ranks)
            assert ranks[0][name]["out"].dtype == torch.float64 and diffs[name] <= F64_TOLERANCE, diffs
    if "sol_attn_t2v" in ranks[0]:
        assert not torch.allclose(ranks[0]["sol_attn_t2v"]["out"], expected["sol_attn_dense"], atol=1e-3)  # sparse
    for name in ("lossless_t2v", "lossless_ti2v", "high_t2v", "high_ti2v", "sol_attn_t2v"):
        if name not in ranks[0]:
            continue
        assert ranks[0][name]["fast_calls"] > 0, name
        assert all(rank[name]["sites"] == ranks[0][name]["sites"] for rank in ranks), name  # the same paths
    assert all(rank["exchange"] == (True, True, torch.bfloat16) for rank in ranks)  # the Ulysses exchange
    # a layer left local is caught
    diffs["no_allreduce"] = _max_diff(ranks[0]["no_allreduce"]["out"], expected["t2v"])
    diffs["whole_timesteps"] = _max_diff(ranks[0]["whole_timesteps"]["out"], expected["ti2v"])
    assert diffs["no_allreduce"] > WRONG and diffs["whole_timesteps"] > WRONG, diffs
    # inputs the split would get wrong are refused, with the counts that work
    world = len(ranks)
    assert "3 latent frames do not split over" in ranks[0]["ti2v_3_frames"], ranks[0]["ti2v_3_frames"]
    assert "per-frame timesteps" in ranks[0]["ti2v_3_frames"]
    assert f"45 latent tokens do not split evenly over {world} ranks" in ranks[0]["t2v_odd_tokens"]
    assert "for inference only" in ranks[0]["with_grad"]
    if "anything_ti2v_3_frames" in ranks[0]:
        assert "3 latent frames do not split over" in ranks[0]["anything_ti2v_3_frames"]
        assert "45 latent tokens do not split evenly" in ranks[0]["anything_t2v_45_tokens"]
        assert torch.equal(ranks[0]["step_cache"]["out"], ranks[0]["lossless_t2v"]["out"])
    # BF16 anchors: q/k/v and the output cross the ranks in BF16, with diffusers' FP32-exchange bits
    for rank in ranks:
        for kind in ("t2v", "ti2v") if "bf16_ti2v" in rank else ("t2v",):
            narrow = rank[f"bf16_{kind}"]
            assert narrow["out"].dtype == torch.bfloat16
            assert [dtype for dtype, _ in narrow["exchanged"]] == [torch.bfloat16] * 4
            if f"bf16_{kind}_fp32_exchange" in rank:
                wide = rank[f"bf16_{kind}_fp32_exchange"]
                assert torch.equal(narrow["out"].view(torch.int16), wide["out"].view(torch.int16)), kind
                assert wide["exchanged"] == []
        if "bf16_lossless_t2v" not in rank:
            continue
        assert torch.equal(rank["bf16_lossless_t2v"]["out"].view(torch.int16),
                           rank["bf16_t2v"]["out"].view(torch.int16))
        assert len(rank["bf16_lossless_t2v"]["exchanged"]) == 4  # the lossless anchor path exchanges BF16 too
        assert not torch.equal(rank["bf16_t2v_perturbed"]["out"], rank["bf16_t2v_fp32_exchange"]["out"])  # can fail
    return diffs


def test_two_processes_match_one(tmp_path):
    config = {}
    ranks = _run_ranks(tmp_path, 2, config, full=True)
    diffs = _check(ranks, _one_process(config))
    print("max |delta| vs one process, 2 ranks:", diffs)


def test_four_processes_match_one(tmp_path):
    config = {}  # 2 anchor heads on 4 ranks: padded with 2 zero heads (the 5B model's 10 on 4 or 8 ranks alike)
    ranks = _run_ranks(tmp_path, 4, config, full=False)
    diffs = _check(ranks, _one_process(config))
    print("max |delta| vs one process, 4 ranks:", diffs)


@pytest.fixture
def one_process_group():
    """A gloo group of this process alone (diffusers' ContextParallelConfig refuses a degree of 1, so world size 1
    goes through the model's ``enable_sequence_shards``)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("per_frame", [False, True], ids=["t2v", "ti2v"])
@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "lossless"])
def test_world_size_one_is_bit_identical(one_process_group, per_frame, patched):
    import accelpatch
    from accelpatch.models.sana_video2.modeling import attention
    from accelpatch.parallel.sequence import shards_of_group
    from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer

    unsplit = tiny_sana_video2_transformer()
    inputs = sana_video2_transformer_inputs(unsplit, frames=4, per_frame_timesteps=per_frame)
    with torch.no_grad():
        expected = unsplit(**inputs).sample
    model = tiny_sana_video2_transformer()
    if patched:
        accelpatch.apply(model)
    model.enable_sequence_shards(shards_of_group())
    reductions = []
    original = attention.sum_over_ranks
    attention.sum_over_ranks = lambda x, shards: reductions.append(shards.world) or original(x, shards)
    try:
        with torch.no_grad():
            out = model(**inputs).sample
    finally:
        attention.sum_over_ranks = original
    assert reductions == [1, 1, 1]  # the three linear layers went through the group's all-reduce
    assert out.dtype == expected.dtype and out.shape == expected.shape and out.stride() == expected.stride()
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
    if patched:
        assert accelpatch.report(model).fast_calls > 0


def test_a_perturbed_reduction_is_seen_at_world_size_one(one_process_group):
    """The world-size-1 comparison can fail: a state all-reduce that adds a rounding-sized error is caught."""
    from accelpatch.models.sana_video2.modeling import attention
    from accelpatch.parallel.sequence import shards_of_group
    from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer

    model = tiny_sana_video2_transformer()
    inputs = sana_video2_transformer_inputs(model, frames=4)
    with torch.no_grad():
        expected = model(**inputs).sample
    model.enable_sequence_shards(shards_of_group())
    original = attention.sum_over_ranks
    attention.sum_over_ranks = lambda x, shards: original(x, shards) * (1 + 2 ** -20)
    try:
        with torch.no_grad():
            out = model(**inputs).sample
    finally:
        attention.sum_over_ranks = original
    assert not torch.equal(out, expected)


def test_anchor_heads_and_ring_are_checked_before_the_model_is_touched():
    """Ring attention cannot run FP32 anchors: refused before diffusers touches the model. A Ulysses degree that
    does not divide the anchor heads passes the check (the anchors pad their heads: the 4-process test runs 2 heads
    on 4 ranks)."""
    from diffusers import ContextParallelConfig

    from accelpatch.models.sana_video2.modeling.sequence_parallel import check_parallel_config
    from accelpatch.testing import sana_video2_transformer_on_meta, tiny_sana_video2_transformer

    release = sana_video2_transformer_on_meta()  # the 5B model: 10 anchor heads
    for degree in (4, 8):
        check_parallel_config(release, ContextParallelConfig(ulysses_degree=degree))
    tiny = tiny_sana_video2_transformer()  # 2 anchor heads
    with pytest.raises(ValueError, match="ring_degree=2 cannot run its FP32 anchor attention"):
        tiny.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
    assert tiny._parallel_config is None and release._parallel_config is None  # refused before diffusers ran


def test_world_size_one_entry_point_refuses_more_ranks():
    from accelpatch.parallel.sequence import SequenceShards
    from accelpatch.testing import tiny_sana_video2_transformer

    with pytest.raises(ValueError, match="enable_parallelism"):
        tiny_sana_video2_transformer().enable_sequence_shards(SequenceShards(None, 0, 2))


def test_every_linear_attention_caller_passes_its_shards():
    """``shards`` has no default, so a fast path cannot silently call the linear attention unsplit."""
    import inspect

    from accelpatch.models.sana_video2.modeling.attention import gated_linear_attention

    parameter = inspect.signature(gated_linear_attention).parameters["shards"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is inspect.Parameter.empty
