"""The Triton kernel's resource model (resources.py): tiles per target, refusal with the numbers, and what a refused
call does: the op and a patched site run the PyTorch implementation, with the reason recorded. GPUs are simulated
(resources.device_arch and the shared-memory table are the probes); the model itself is checked against compiled
kernels in test_sol_attn_aot.py."""

import pytest
import torch

import accelpatch
from accelpatch.sol_attn.op import sol_attn
from accelpatch.sol_attn.op.fallbacks import ImplFallbacks
from accelpatch.sol_attn.op import resources
from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer


@pytest.fixture(autouse=True)
def fresh_fallback_state(monkeypatch):
    monkeypatch.setattr(resources, "FALLBACKS", ImplFallbacks(resources.FALLBACKS.what))


@pytest.fixture
def gpu(monkeypatch):
    """gpu(arch, limit=None): CPU tensors report compute capability `arch` (and that shared-memory limit)."""

    def simulate(arch, limit=None):
        monkeypatch.setattr(resources, "device_arch", lambda device: arch)
        if limit is not None:
            monkeypatch.setitem(resources.SHARED_LIMIT, arch, limit)

    return simulate


def test_the_tiles_of_the_issue_did_not_fit_an_a100_and_the_chosen_ones_do():
    # the kernel as it was: 64-key tiles, no pipelining -> q, K, V of [64, 256] fp32 = 196,608 B > 166,912 B
    assert resources.shared_bytes(80, torch.float32, 256, 64, 1, 32) == 196_608 > resources.SHARED_LIMIT[80]
    for arch in (80, 90):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for d in (64, 80, 128, 256):
                t = resources.choose_tiles(dtype, d, arch)
                need = resources.shared_bytes(arch, dtype, t.block_d, t.block_n, t.num_stages, t.group)
                assert need <= resources.SHARED_LIMIT[arch], (arch, dtype, d, t)
    assert resources.choose_tiles(torch.float32, 256, 80).block_n == 32  # smaller key tiles on the A100
    assert resources.choose_tiles(torch.bfloat16, 256, 90) == resources.Tiles(64, 2, 32, 8, 256)
    assert resources.choose_tiles(torch.float32, 80, None).block_d == 128  # no target (interpreter): no limit


@pytest.mark.parametrize("arch,dtype,d,fits", [(80, torch.float32, 512, 256), (90, torch.float32, 1024, 512),
                                               (80, torch.bfloat16, 1024, 512)])
def test_what_cannot_fit_is_refused_with_the_numbers_and_the_head_dims_that_fit(arch, dtype, d, fits):
    with pytest.raises(resources.TilesDoNotFit) as info:
        resources.choose_tiles(dtype, d, arch)
    message = str(info.value)
    assert f"head dim {d}" in message and f"sm_{arch}" in message
    assert f"the limit is {resources.SHARED_LIMIT[arch]:,} B" in message
    assert f"head dims up to {fits} fit" in message and "impl='torch'" in message
    assert resources.max_head_dim(dtype, arch) == fits


def test_unfit_reason_is_pure_and_none_off_gpu():
    q = torch.zeros(1, 64, 1, 512)
    assert resources.unfit_reason(q) is None  # a CPU tensor: no GPU limit applies
    assert resources.FALLBACKS.last_reason is None and not resources.FALLBACKS.counts


def qkv(t, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, t, 2, d, generator=g).to(dtype) for _ in range(3)]


def test_a_call_no_tiles_can_hold_runs_the_pytorch_implementation_recorded(gpu):
    gpu(80)
    q, k, v = qkv(100, 512)
    with pytest.warns(RuntimeWarning, match="PyTorch implementation instead of the Triton kernel.*head dim 512"):
        out, stats = sol_attn(q, k, v, tau=0.5, impl="triton", return_stats=True)
    ref, ref_stats = sol_attn(q, k, v, tau=0.5, impl="torch", return_stats=True)
    assert torch.equal(out, ref) and torch.equal(stats.exact_pairs, ref_stats.exact_pairs)
    assert resources.FALLBACKS.counts == {resources.FALLBACKS.last_reason: 1}
    assert "sm_80" in resources.FALLBACKS.last_reason and "166,912 B" in resources.FALLBACKS.last_reason
    sol_attn(q, k, v, tau=0.5, impl="triton")  # warned once; counted again
    assert sum(resources.FALLBACKS.counts.values()) == 2


def test_a_call_that_fits_still_runs_the_kernel(gpu):
    gpu(80)
    q, k, v = qkv(100, 64, seed=1)
    out = sol_attn(q, k, v, tau=0.5, impl="triton")
    torch.testing.assert_close(out, sol_attn(q, k, v, tau=0.5, impl="torch"), atol=2e-5, rtol=2e-5)
    assert not resources.FALLBACKS.counts


def test_a_patched_site_runs_the_pytorch_implementation_not_dense_and_notes_why(gpu):
    """A GPU whose shared memory holds no tiles of the bf16 head-dim-128 kernel: the H3 layers run Sol-Attn in
    PyTorch (output equal to impl='torch', every call fast, no fallback to dense) and the report says why."""
    model = tiny_minimax_h3_transformer(dtype=torch.bfloat16)
    inputs = minimax_h3_transformer_inputs(model, num_video=200)
    options = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=1.0)
    accelpatch.apply(model, impl="torch", **options)
    with torch.no_grad():
        ours = model(**inputs).sample
    gpu(80, limit=20_000)
    accelpatch.apply(model, impl="triton", **options)
    with pytest.warns(RuntimeWarning, match="instead of the Triton kernel"), torch.no_grad():
        assert torch.equal(model(**inputs).sample, ours)
    rep = accelpatch.report(model)
    sol_sites = [s for s in rep.sites if s.kind == "sol_attn"]  # the lossless fused sites ran too (not counted here)
    assert sum(s.fast_calls for s in sol_sites) == 2 and rep.fallback_calls == {}
    notes = [n for s in rep.sites for n in s.notes]
    assert len(notes) == 2 and all("impl='triton' ran the PyTorch implementation" in n and "20,000 B" in n
                                   for n in notes)
