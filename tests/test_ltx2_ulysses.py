"""LTX-2 with backend="sol_attn" under diffusers' own context parallelism (its ``_cp_plan``, Ulysses over 2 gloo
processes): exact is the split model's own output, high runs Sol-Attn on every rank and gives the one-process
sparse output, lossless (the fused RoPE of the video self-attention) keeps the split model's bits. (Ring attention
declines for every model alike, tests/test_context_parallel.py; on CPU diffusers' ring attention cannot run at all:
its native backend returns no LSE.)

diffusers 0.42.1's LTX-2 ``_cp_plan`` runs only with ``isolate_modalities=True`` and no text mask: it splits the
video but not the cross-modal RoPE tables (the audio-to-video attention then fails, 512 rows against 1,024), a
text mask reaches the split heads unsplit, and a ``_cp_plan`` input that is not passed fails diffusers' hook. The
first test pins those failures on the unpatched model, so the day diffusers mends them this file says so."""
import textwrap

import pytest
import torch

import accelpatch
from _multiprocess import START, run_ranks
from accelpatch.testing import ltx2_transformer_inputs, tiny_ltx2_transformer

#: sparse from the first step and layer on, at every length (the tiny sequences are shorter than the default
#: min_tokens floor, under which every call runs dense)
SPARSE = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)

SCRIPT = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import tiny_ltx2_transformer, ltx2_transformer_inputs
        model = tiny_ltx2_transformer()
        inputs = {**ltx2_transformer_inputs(model), "return_dict": False}
        out = {}
        # diffusers' output gather returns a functional collective's tensor; clone() waits for it (torch.save
        # would read it before gloo has filled it in)
        forward = lambda: tuple(t.clone() for t in model(**inputs))
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        limits = out["diffusers_limits"] = {}
        for name, extra in (("no mask argument", {}),
                            ("cross-modal", {"encoder_attention_mask": None}),
                            ("text mask", {"encoder_attention_mask": torch.ones(1, 8, dtype=torch.long),
                                           "isolate_modalities": True})):
            try:  # each fails on both ranks at the same point, after any collective has completed
                with torch.no_grad():
                    model(**inputs, **extra)
                limits[name] = "ran"
            except Exception as error:  # noqa: BLE001 - diffusers' own failure is what is recorded
                limits[name] = f"{type(error).__name__}: {error}"
        inputs.update(encoder_attention_mask=None, isolate_modalities=True)
        with torch.no_grad():
            out["unpatched"] = forward()
            accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
            with accelpatch.quality("exact"):
                out["exact"] = forward()
            out["high"] = forward()
            with accelpatch.quality("lossless"):
                out["lossless"] = forward()
        report = accelpatch.report(model)
        out["sites"] = {s.path: (s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_sol_attn"}
        out["fused_attention"] = {s.path: (s.fast_calls, s.reference_calls) for s in report.sites
                                  if s.kind == "ltx2_fused_attention"}
        out["fallbacks"] = report.fallback_calls
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(tmp_path_factory.mktemp("ltx2_ulysses"), SCRIPT, 2)


@pytest.fixture(scope="module")
def one_process():
    """The unsplit model's sparse output on the inputs diffusers' LTX-2 plan can split."""
    model = tiny_ltx2_transformer()
    inputs = {**ltx2_transformer_inputs(model), "return_dict": False, "encoder_attention_mask": None,
              "isolate_modalities": True}
    accelpatch.apply(model, **SPARSE)
    with torch.no_grad():
        return model(**inputs)


def test_diffusers_own_ltx2_plan_fails_where_this_file_says(ranks):
    for out in ranks:
        limits = out["diffusers_limits"]
        assert limits["no mask argument"].startswith("ValueError: Expected"), limits["no mask argument"]
        assert "must match the size" in limits["cross-modal"], limits["cross-modal"]
        assert "doesn't match the broadcast shape" in limits["text mask"], limits["text mask"]


def test_ulysses_runs_sol_attn_on_every_rank_and_equals_one_process(ranks, one_process):
    for out in ranks:
        assert out["fallbacks"] == {}
        for got, unpatched in zip(out["exact"], out["unpatched"]):
            assert torch.equal(got, unpatched)  # exact under the split is the split model's own bits
        video, audio = out["high"]
        torch.testing.assert_close(video, one_process[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(audio, one_process[1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(video, out["unpatched"][0], atol=1e-4, rtol=1e-4)  # the sparse path changed it
        assert out["sites"] == {f"transformer_blocks.{i}.attn1": (1, {"tier exact does not admit high": 1,
                                                                      "tier lossless does not admit high": 1})
                                for i in (0, 1)}


def test_ulysses_lossless_fuses_the_rope_and_keeps_the_split_models_bits(ranks):
    """Under the split the fused video self-attention (its RoPE on each rank's sequence shard, the dispatcher with
    the processor's parallel config) gives the split model's own bits."""
    for out in ranks:
        for got, unpatched in zip(out["lossless"], out["unpatched"], strict=True):
            assert got.dtype == unpatched.dtype and torch.equal(got.view(torch.int32), unpatched.view(torch.int32))
        once_exact = {"tier exact does not admit lossless": 1}
        assert out["fused_attention"] == {f"transformer_blocks.{i}.attn1": (1, once_exact) for i in (0, 1)}

