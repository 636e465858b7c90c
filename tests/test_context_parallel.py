"""diffusers' context parallelism with the fast paths: under Ulysses each rank attends over the whole sequence for a
share of the heads, so Sol-Attn runs per rank unchanged (once, every call declined with "context parallelism is
configured"), and the lossless fused sites run on every rank alike. Two real processes with the gloo backend on
CPU."""
import textwrap
import types

import pytest
import torch

from _multiprocess import START, run_ranks
from accelpatch.parallel import sequence
from accelpatch.parallel.sequence import SequenceShards
from accelpatch.sol_attn import sites as sol_attention

SCRIPT = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer
        model = tiny_minimax_h3_transformer()
        inputs = minimax_h3_transformer_inputs(model, num_video=1100)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        out = {}
        with torch.no_grad():
            out["unpatched"] = model(**inputs).sample.clone()  # clone() waits for the gather; torch.save would not
            accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
            for tier in ("exact", "lossless"):
                with accelpatch.quality(tier):
                    out[tier] = model(**inputs).sample.clone()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                high = model(**inputs)
                out["high"], out["high_audio"] = high.sample.clone(), high.audio_sample.clone()
        out["deprecations"] = [str(w.message) for w in caught if "torch.distributed.nn.functional" in str(w.message)]
        report = accelpatch.report(model)
        out["fast_calls"] = report.fast_calls
        out["fallbacks"] = report.fallback_calls
        out["sites"] = {(s.path, s.kind): (s.fast_calls, s.reference_calls) for s in report.sites}
        out["fusions"] = {f.op: (f.fused_calls, f.reference_calls, len(f.declined)) for f in report.models[0].fusions}
        out["exact_fraction"] = [s.stats.get("exact_fraction") for s in report.sites if s.kind == "sol_attn"]
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


EXACT_NO_HIGH, LOSSLESS_NO_HIGH = "tier exact does not admit high", "tier lossless does not admit high"
EXACT_NO_LOSSLESS = "tier exact does not admit lossless"
#: the lossless sites after one exact, one lossless and one high call of the fp32 model (each rank alike): the blocks
#: run fused under lossless and high, the attention under lossless only (Sol-Attn takes the high call), the SwiGLU
#: gate (a bf16 table) keeps the reference on fp32
LOSSLESS_SITES = {key: counts for n in (0, 1) for key, counts in (
    ((f"transformer_blocks.{n}", "minimax_h3_fused_block"), (2, {EXACT_NO_LOSSLESS: 1})),
    ((f"transformer_blocks.{n}.attn", "minimax_h3_fused_attention"), (1, {EXACT_NO_LOSSLESS: 1})),
    ((f"transformer_blocks.{n}.ff.net.0", "fused_swiglu"),
     (0, {EXACT_NO_LOSSLESS: 1, "activations are torch.float32: the fused SiLU tables are bfloat16": 2})))}


def test_ulysses_on_two_processes_runs_sol_attn_on_every_rank(tmp_path):
    ranks = run_ranks(tmp_path, SCRIPT, 2)

    import accelpatch
    from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer

    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=1100)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    with torch.no_grad():
        one = model(**inputs)
        one_process, one_process_audio = one.sample, one.audio_sample
    assert ranks[0]["sites"] == ranks[1]["sites"] and ranks[0]["fusions"] == ranks[1]["fusions"]  # one path
    for out in ranks:
        assert torch.equal(out["exact"], out["unpatched"]) and torch.equal(out["lossless"], out["unpatched"])
        torch.testing.assert_close(out["high"], one_process, atol=1e-5, rtol=1e-5)
        # the audio rows are dense (dense_rows="text_audio") on every rank as in one process: the layout holds there
        torch.testing.assert_close(out["high_audio"], one_process_audio, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out["high"], out["unpatched"], atol=1e-4, rtol=1e-4)  # really sparse
        assert out["fallbacks"] == {}
        sites = out["sites"]
        assert [sites[(f"transformer_blocks.{n}.attn", "sol_attn")][0] for n in (0, 1)] == [1, 1]  # on this rank
        assert {key: counts for key, counts in sites.items() if key[1] != "sol_attn_refiner"} == {
            **{(f"transformer_blocks.{n}.attn", "sol_attn"): (1, {EXACT_NO_HIGH: 1, LOSSLESS_NO_HIGH: 1})
               for n in (0, 1)},
            **LOSSLESS_SITES}
        assert out["fast_calls"] == 2 + 2 * (2 + 1)  # Sol-Attn in both layers; per layer 2 block + 1 attention calls
        assert out["fusions"] == {"modulate": (2 * 2 * 2, {}, 0), "gated_residual": (2 * 2 * 2, {}, 0),
                                  "rotate_half_pair": (2 + 2, {}, 0),  # Sol-Attn builds q/k/v with it too
                                  "glu_gate": (0, {}, 0)}
        assert all(0 < f < 0.7 for f in out["exact_fraction"])
        assert out["deprecations"] == []  # once, our all-to-all warned on every rank (diffusers' own gathers still warn)


def _config(ring=1, ulysses=2, anything=False):
    cp = types.SimpleNamespace(ring_degree=ring, ulysses_degree=ulysses, ulysses_anything=anything,
                               _ulysses_mesh=types.SimpleNamespace(get_group=lambda: "group", get_local_rank=lambda: 1))
    return types.SimpleNamespace(context_parallel_config=cp)


def test_only_pure_ulysses_keeps_the_sparse_path():
    assert sol_attention.ulysses_group(_config()) == SequenceShards("group", 1, 2)
    assert sol_attention.ulysses_group(_config(ring=2, ulysses=1)).reason == sol_attention.ULYSSES_ONLY
    assert "ulysses_anything" in sol_attention.ulysses_group(_config(anything=True)).reason
    assert "without context parallelism" in sol_attention.ulysses_group(types.SimpleNamespace()).reason


def _exchange(monkeypatch, fn, per_rank, world):
    """Run ``fn`` on every rank's tensor with a simulated all-to-all: chunk j (dim 0) of rank i's send buffer
    arrives as chunk i of rank j's receive buffer."""
    sends = []
    monkeypatch.setattr(sequence, "all_to_all", lambda tensor, group: sends.append(tensor) or tensor)
    for rank, x in enumerate(per_rank):
        fn(x, SequenceShards(None, rank, world))
    received = [torch.cat([sends[src].chunk(world)[dst] for src in range(world)]) for dst in range(world)]
    monkeypatch.setattr(sequence, "all_to_all", lambda tensor, group: received.pop(0))
    return [fn(x, SequenceShards(None, rank, world)) for rank, x in enumerate(per_rank)]


@pytest.mark.parametrize("world", [2, 4])
def test_the_head_exchange_is_the_all_to_all_it_claims(monkeypatch, world):
    full = torch.randn(1, 8 * world, 2 * world, 4, generator=torch.Generator().manual_seed(0))  # [B, S, H, D]
    shards = list(full.chunk(world, dim=1))  # rank r holds sequence shard r of every head
    by_heads = _exchange(monkeypatch, sequence.heads_to_ranks, shards, world)  # the one Sol-Attn's sites run
    for rank, got in enumerate(by_heads):  # rank r: the whole sequence of its share of the heads
        assert torch.equal(got, full[:, :, rank * 2:(rank + 1) * 2])
    back = _exchange(monkeypatch, sequence.ranks_to_heads, by_heads, world)
    assert all(torch.equal(a, b) for a, b in zip(back, shards))
