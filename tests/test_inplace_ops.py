"""In-place fused ops (issue #44). The in-place GELU of diffusers' ``GELU`` feed-forward module
(accelpatch/lossless/gelu.py): at the default tier it writes the GELU over the projection's output, so the module holds one hidden-sized tensor where diffusers
holds two, with the same bits; a forward hook that could keep the projection's output, autograd and a kernel that
does not match keep diffusers' out-of-place GELU; a memory trace holds what the real run holds. SANA-Video's GLUMB
writes its bf16 SiLU over its inverted convolution's output the same way."""
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _model_fusion_checks import bits_equal, fresh_verdicts, fusion_of  # noqa: F401 - fixture
import accelpatch
from accelpatch.lossless.gelu import HOOKED
from accelpatch.lossless.kernels.library import Kernel, KernelLibrary
from accelpatch.lossless.ops import GELU_INPLACE
from accelpatch.memory.live_bytes import LiveBytes
from accelpatch.memory.plan import TransformerCase
from accelpatch.testing import tiny_wan_transformer
from accelpatch.testing.wan import WAN_SOL_CONFIG


def _model(dtype=torch.bfloat16):
    return tiny_wan_transformer(dtype=dtype, num_layers=2)


def _gelu_input(model, tokens=256):
    torch.manual_seed(0)
    module = model.blocks[0].ffn.net[0]
    return module, torch.randn(1, tokens, module.proj.in_features).to(module.proj.weight.dtype)


def _call_bytes(module, x) -> int:
    with torch.no_grad(), LiveBytes() as live:
        out = module(x)
    del out
    return live.peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_feed_forward_holds_one_hidden_state_less_with_the_same_bits(dtype):
    model = _model(dtype)
    module, x = _gelu_input(model)
    with torch.no_grad():
        expected = module(x)
    hidden = expected.untyped_storage().nbytes()
    GELU_INPLACE.unsupported("cpu", expected, "tanh")  # builds and self-checks the CPU kernels (a one-off, held)
    unpatched = _call_bytes(module, x)
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")
        first = _call_bytes(module, x)  # first sight: the reference and the kernel, both held
        steady = _call_bytes(module, x)
        with torch.no_grad():
            got = module(x)
    assert bits_equal(got, expected)
    assert unpatched == 2 * hidden and first == 2 * hidden and steady == hidden, (unpatched, first, steady, hidden)
    fusion = fusion_of(accelpatch.report(model), "gelu_inplace")
    assert fusion.fused_calls == 3 and not fusion.declined and len(fusion.verified) == 1, fusion


def test_a_hook_that_could_keep_the_projection_output_keeps_diffusers_gelu():
    """A forward hook on ``proj`` sees the projection's output: the in-place GELU would overwrite what it kept, so
    the module's own forward runs, counted with the reason; a global forward hook likewise."""
    model = _model()
    module, x = _gelu_input(model)
    with torch.no_grad():
        expected = module(x)
        projected = module.proj(x)
    accelpatch.apply(model)
    kept = []
    handle = module.proj.register_forward_hook(lambda mod, args, out: kept.append(out))
    with torch.no_grad():
        got = module(x)
    handle.remove()
    assert bits_equal(got, expected) and bits_equal(kept[0], projected)  # what the hook kept is the projection
    global_kept = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: global_kept.append(out) if mod is module.proj else None)
    try:
        with torch.no_grad():
            got = module(x)
    finally:
        handle.remove()
    assert bits_equal(got, expected) and bits_equal(global_kept[0], projected)
    site = next(s for s in accelpatch.report(model).sites if s.path == "blocks.0.ffn.net.0")
    assert site.reference_calls.get(HOOKED) == 2 and site.fast_calls == 0, site


def test_autograd_runs_the_out_of_place_gelu_and_its_gradient_is_diffusers():
    model = _model(torch.float32)
    module, x = _gelu_input(model)
    x.requires_grad_(True)
    module(x).square().sum().backward()
    expected = x.grad.clone()
    x.grad = None
    accelpatch.apply(model)
    module(x).square().sum().backward()
    assert torch.equal(x.grad, expected)
    fusion = fusion_of(accelpatch.report(model), "gelu_inplace")
    assert fusion.fused_calls == 0 and any("require grad" in reason for reason in fusion.reference_calls), fusion


def test_a_kernel_that_does_not_match_is_declined_on_first_sight():
    """A stand-in kernel that writes a wrong value in place: the first sight sees it and declines the signature for
    good; the calls give diffusers' bits (the reference runs before the kernel writes)."""
    model = _model()
    module, x = _gelu_input(model)
    with torch.no_grad():
        expected = module(x)

    def wrong(h, approximate):
        torch.ops.aten.gelu_(h, approximate=approximate)
        h.view(-1)[0] += 1.0
        return h

    library = KernelLibrary("cpu", "CPU", lambda name, check, args: check(*args))
    with GELU_INPLACE.substituted(Kernel("gelu_inplace", library, wrong, lambda *args: None)):
        accelpatch.apply(model)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with torch.no_grad():
                first, second = module(x), module(x)
        fusion = fusion_of(accelpatch.report(model), "gelu_inplace")
    assert bits_equal(first, expected) and bits_equal(second, expected)
    assert fusion.fused_calls == 0 and fusion.declined, fusion
    assert any("gelu_inplace" in str(w.message) for w in record)


def test_a_memory_trace_holds_what_the_real_run_holds():
    """On fake tensors (the model built and patched inside the fake mode, as the planner does) the in-place op
    allocates nothing (its kernel writes over its input), and a traced first call holds the reference's result
    beside it, as the real first sight does."""
    from accelpatch.lossless.verify import traced_first_call

    model = _model()
    module, x = _gelu_input(model)
    accelpatch.apply(model)
    real_first, real_steady = _call_bytes(module, x), _call_bytes(module, x)
    with FakeTensorMode() as mode:
        fake_model = TransformerCase("wan", {**WAN_SOL_CONFIG, "num_layers": 2}, 1, 8, 8, 8).build()
        accelpatch.apply(fake_model)
        fake_module, fake_x = fake_model.blocks[0].ffn.net[0], mode.from_tensor(x)
        with traced_first_call():
            fake_first = _call_bytes(fake_module, fake_x)
        fake_steady = _call_bytes(fake_module, fake_x)
    assert (fake_first, fake_steady) == (real_first, real_steady) and real_steady < real_first


def _glumb_call(dtype=torch.bfloat16):
    from accelpatch.testing import tiny_sana_video_transformer

    model = tiny_sana_video_transformer(dtype=dtype)
    ff = model.transformer_blocks[0].ff
    torch.manual_seed(0)
    channels = ff.conv_inverted.in_channels
    return model, ff, torch.randn(1, 2, 16, 16, channels).to(dtype)  # [B, F, H, W, C], as the block calls it


def test_sana_videos_glumb_writes_its_silu_over_the_inverted_convolution():
    """GLUMB's SiLU (bf16, by the table) over conv_inverted's output: diffusers' bits, and no more memory than
    diffusers even on the first call, where the check holds the reference's SiLU beside the kernel's (out of place,
    that held one more GLUMB-wide tensor: at 720p SANA-Video's first call peaked 35 % above diffusers'); a hook on
    conv_inverted keeps the out-of-place SiLU."""
    model, ff, x = _glumb_call()
    with torch.no_grad():
        expected = ff(x)
    unpatched = _call_bytes(ff, x)
    accelpatch.apply(model)
    with torch.no_grad():  # another signature first: the kernels' library and SiLU tables (held once per process)
        ff(x[:, :1])
    first, steady = _call_bytes(ff, x), _call_bytes(ff, x)
    with torch.no_grad():
        got = ff(x)
    assert bits_equal(got, expected) and first <= unpatched and steady <= unpatched, (first, steady, unpatched)
    report = accelpatch.report(model)
    assert fusion_of(report, "silu_inplace").fused_calls == 4 and fusion_of(report, "silu").fused_calls == 0
    handle = ff.conv_inverted.register_forward_hook(lambda mod, args, out: None)
    with torch.no_grad():
        hooked = ff(x)
    handle.remove()
    report = accelpatch.report(model)
    assert bits_equal(hooked, expected) and fusion_of(report, "silu").fused_calls == 1
