"""diffusers' own switch: ``model.set_attention_backend("sol_attn")`` after ``accelpatch.sol_attn.register_attention_backend()``,
no apply().

A tiny WanTransformer3DModel (built here from a config dict; its self- and cross-attention go through diffusers'
``dispatch_attention_fn``): outside ``quality("high")`` bit-identical to the native backend; under ``high`` the
self-attention runs the Sol-Attn op (checked against the op called directly on the q/k/v the processor passed, and
that check is shown to catch a wrong kernel); cross-attention stays dense with its reason; a second model in the
same process never runs it (diffusers' process-global active backend, diffusers#14249); counts in ``report()``;
back to "native" leaves no trace; the registration (only when asked) and its version check; torch.compile.
"""
import subprocess
import sys
import warnings

import pytest
import torch

import accelpatch
from accelpatch.sol_attn.config import NOTHING_SKIPPED, SHORT_SEQUENCE, TOTAL_UNKNOWN
from accelpatch.sol_attn import diffusers_backend as ab
from accelpatch.sol_attn import registration as ar

diffusers = pytest.importorskip("diffusers")
from diffusers.models import attention_dispatch as ad  # noqa: E402

WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
           rope_max_seq_len=32)
#: 8 latent frames of 8×8 patches: 512 self-attention rows, 8 key blocks of 64
FRAMES = 8


def sparse_at_every_length(**options):
    """Configure the backend (``options``) with ``min_tokens=0``: the tiny models' calls lie far below the default
    floor (12,288 tokens), under which every call runs dense."""
    accelpatch.sol_attn.configure_sol_attn_backend(min_tokens=0, **options)


def tiny_wan(seed=0, dtype=torch.float32):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(**WAN).eval()
    return model if dtype == torch.float32 else model.to(dtype)


def wan_inputs(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(1, 4, FRAMES, 16, 16, generator=g).to(dtype),
                encoder_hidden_states=torch.randn(1, 8, 16, generator=g).to(dtype), timestep=torch.tensor([500]))


def forward(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    view = torch.int16 if a.dtype in (torch.bfloat16, torch.float16) else torch.int32
    assert torch.equal(a.view(view), b.view(view))


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts and ends with the backend registered, default options, zero counts, native global."""
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.simplefilter("ignore")
    ar.register()
    accelpatch.sol_attn.configure_sol_attn_backend()
    ab.COUNTERS.reset()
    ad._AttentionBackendRegistry._active_backend = ad.AttentionBackendName.NATIVE
    yield
    ar.register()
    accelpatch.sol_attn.configure_sol_attn_backend()
    ab.COUNTERS.reset()
    ad._AttentionBackendRegistry._active_backend = ad.AttentionBackendName.NATIVE
    quiet.__exit__(None, None, None)


@pytest.fixture
def recorder(monkeypatch):
    """Records every call of the registered sol_attn backend: (kwargs, output)."""
    calls = []
    member = ad.AttentionBackendName.SOL_ATTN
    real = ad._AttentionBackendRegistry._backends[member]

    def record(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
               return_lse=False, _parallel_config=None):
        kwargs = dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                      is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=return_lse,
                      _parallel_config=_parallel_config)
        out = real(**kwargs)
        calls.append((kwargs, out))
        return out

    monkeypatch.setitem(ad._AttentionBackendRegistry._backends, member, record)
    return calls


def check_calls_against_independent_math(calls, tau):
    """Each self-attention call's output equals the Sol-Attn op run here on the same q/k/v; each cross-attention
    call's equals torch's SDPA run here. Raises AssertionError otherwise."""
    from accelpatch.sol_attn.op import sol_attn

    selfs = crosses = 0
    for kwargs, out in calls:
        q, k, v = kwargs["query"], kwargs["key"], kwargs["value"]
        if q.shape == k.shape:
            expected = sol_attn(q, k, v, tau=tau, impl="torch")
            selfs += 1
        else:
            expected = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
            crosses += 1
        assert torch.equal(out, expected), (q.shape, k.shape)
    assert selfs and crosses
    return selfs, crosses


# ---------------------------------------------------------------- registration


def test_the_name_is_registered_after_import():
    member = ad.AttentionBackendName("sol_attn")
    assert member is ad.AttentionBackendName.SOL_ATTN and member == "sol_attn"
    assert "SOL_ATTN" in ad.AttentionBackendName.__members__ and member in list(ad.AttentionBackendName)
    registry = ad._AttentionBackendRegistry
    assert registry._backends[member] is ab.sol_attn_backend
    assert registry._constraints[member] == []
    assert {"query", "key", "value", "attn_mask", "scale", "_parallel_config"} <= registry._supported_arg_names[member]
    assert "sol_attn" not in registry._supports_context_parallel  # diffusers refuses it on a parallel model
    assert ar.is_registered() and ar.why_not_registered() is None
    # the rest of the enum is untouched
    assert ad.AttentionBackendName("native") is ad.AttentionBackendName.NATIVE


@pytest.mark.parametrize("version", ["0.43.0", "0.41.0", "0.42.0", "1.0.0", "0.43.0.dev0", "main"])
def test_an_unknown_diffusers_version_is_refused_with_a_clear_message(version):
    before = dict(ad._AttentionBackendRegistry._backends)
    with pytest.raises(ar.UnsupportedDiffusersVersion) as error:
        ar.register(diffusers_version=version)
    assert f"found diffusers {version}" in str(error.value) and ">=0.42.1,<0.43.0" in str(error.value)
    assert ad._AttentionBackendRegistry._backends == before  # nothing touched
    ar.register(diffusers_version="0.42.1")


def test_apply_with_the_backend_registers_quietly_and_an_unknown_version_keeps_its_reason(monkeypatch):
    ar.unregister()
    monkeypatch.setattr(diffusers, "__version__", "0.44.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # apply()'s own Sol-Attn sites work on any diffusers: nothing to warn about
        ar.register_quietly()
    assert not ar.is_registered() and "found diffusers 0.44.0" in ar.why_not_registered()
    with pytest.raises(ar.UnsupportedDiffusersVersion, match="0.44.0"):
        accelpatch.sol_attn.register_attention_backend()
    monkeypatch.undo()
    accelpatch.apply(tiny_wan(), backend="sol_attn")
    assert ar.is_registered()


def test_unregister_and_register_again():
    model = tiny_wan()
    try:
        ar.unregister()
        assert "sol_attn" not in {m.value for m in ad.AttentionBackendName}
        assert "SOL_ATTN" not in ad.AttentionBackendName.__dict__
        with pytest.raises(ValueError, match="must be one of"):
            model.set_attention_backend("sol_attn")
        assert not ar.is_registered() and "it was unregistered" in ar.why_not_registered()
    finally:
        ar.register()
    model.set_attention_backend("sol_attn")
    assert ad._AttentionBackendRegistry._backends[ad.AttentionBackendName.SOL_ATTN] is ab.sol_attn_backend


def test_import_accelpatch_changes_nothing_until_the_backend_is_asked_for():
    """A fresh process: importing accelpatch imports neither torch nor diffusers and leaves diffusers' attention
    backends as they are, and changes nothing in the import machinery (#41: the finder of old module paths is gone);
    register_attention_backend() adds sol_attn, and
    set_attention_backend("sol_attn") works from then on."""
    code = (
        "import sys, warnings; warnings.simplefilter('ignore')\n"
        "meta_path, path_hooks = list(sys.meta_path), list(sys.path_hooks)\n"
        "import accelpatch\n"
        "assert 'diffusers' not in sys.modules and 'torch' not in sys.modules\n"
        "assert sys.meta_path == meta_path and sys.path_hooks == path_hooks, (sys.meta_path, meta_path)\n"
        "from diffusers.models import attention_dispatch as ad\n"
        "assert 'sol_attn' not in {m.value for m in ad.AttentionBackendName}\n"
        "report = accelpatch.sol_attn.attention_backend_report()\n"
        "assert not report.registered and 'register_attention_backend()' in report.why_not_registered\n"
        "accelpatch.sol_attn.register_attention_backend()\n"
        "assert ad.AttentionBackendName('sol_attn').value == 'sol_attn'\n"
        "assert accelpatch.__file__.startswith(sys.argv[1])\n"
        "print('ok', accelpatch.sol_attn.attention_backend_report().registered)\n")
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this checkout's accelpatch, first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True, timeout=120, env=env,
                          cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok True"


# ---------------------------------------------------------------- the tier contract


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outside_high_the_output_is_the_native_backends_bit_for_bit(dtype):
    inputs = wan_inputs(dtype)
    reference = forward(tiny_wan(dtype=dtype), inputs)
    model = tiny_wan(dtype=dtype)
    model.set_attention_backend("sol_attn")
    assert_same_bits(forward(model, inputs), reference)
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert_same_bits(forward(model, inputs), reference)
    counts = accelpatch.sol_attn.attention_backend_report()
    assert counts.sparse_calls == 0 and counts.dense_calls == {ab.TIER: 3 * 2 * 2}  # 3 forwards, 2 layers, self+cross


def test_under_high_the_default_floor_keeps_short_self_attention_dense():
    """The backend's default min_tokens (12,288) is far above the tiny model's 512 rows: under high its
    self-attention runs the native backend bit for bit, counted SHORT_SEQUENCE (the policy, not a fallback)."""
    inputs = wan_inputs()
    reference = forward(tiny_wan(), inputs)
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    assert ab.current_config().min_tokens == 12288
    with accelpatch.quality("high"):
        assert_same_bits(forward(model, inputs), reference)
    counts = accelpatch.sol_attn.attention_backend_report()
    assert counts.sparse_calls == 0 and counts.dense_calls == {SHORT_SEQUENCE: 2, ab.SHAPES: 2}
    assert counts.fallback_calls == {ab.SHAPES: 2}


def test_under_high_the_self_attention_runs_the_sol_attn_op(recorder):
    inputs = wan_inputs()
    reference = forward(tiny_wan(), inputs)
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    sparse_at_every_length(tau=1.5)
    with accelpatch.quality("high"):
        out = forward(model, inputs)
    assert not torch.equal(out, reference) and torch.isfinite(out).all()
    assert check_calls_against_independent_math(recorder, tau=1.5) == (2, 2)
    counts = accelpatch.sol_attn.attention_backend_report()
    assert counts.sparse_calls == 2 and counts.dense_calls == {ab.SHAPES: 2} and counts.fallback_calls == {ab.SHAPES: 2}
    assert 0 < counts.exact_fraction < 1  # sparse for real on 8 key blocks


def test_the_check_catches_a_wrong_kernel(recorder, monkeypatch):
    import importlib

    ops = importlib.import_module("accelpatch.sol_attn.op")  # the package (accelpatch.ops re-exports the function)
    real = ops.sol_attn

    def wrong(q, k, v, **kwargs):  # the right op, one key row perturbed
        k = k.clone()
        k[:, 3] += 1e-2
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(ops, "sol_attn", wrong)
    sparse_at_every_length()  # so that the self-attention calls run the (wrong) kernel
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    with accelpatch.quality("high"):
        forward(model, wan_inputs())
    monkeypatch.setattr(ops, "sol_attn", real)
    with pytest.raises(AssertionError):
        check_calls_against_independent_math(recorder, tau=1.0)


def test_ineligible_calls_run_dense_with_their_reason():
    q = torch.randn(1, 128, 2, 16)
    mask = torch.ones(1, 128, dtype=torch.bool)
    dense = torch.nn.functional.scaled_dot_product_attention
    cases = [(dict(attn_mask=mask), ab.MASK), (dict(is_causal=True), ab.CAUSAL), (dict(scale=0.5), ab.SCALE)]
    with accelpatch.quality("high"):
        for extra, reason in cases:
            out = ab.sol_attn_backend(q, q, q, **extra)
            t = q.transpose(1, 2)
            sdpa_extra = {"attn_mask": mask[:, None, None]} if "attn_mask" in extra else extra
            assert torch.equal(out, dense(t, t, t, **sdpa_extra).transpose(1, 2)), reason
        ab.sol_attn_backend(q, q, q)  # the default floor: 128 tokens are a short sequence (the policy)
        sparse_at_every_length(dense_steps=2)
        ab.sol_attn_backend(q, q, q)
        with accelpatch.denoising_step(1):
            ab.sol_attn_backend(q, q, q)
        with accelpatch.denoising_step(2):
            ab.sol_attn_backend(q, q, q)
        sparse_at_every_length(dense_steps=0.2)  # a fraction needs the call's number of steps
        with accelpatch.denoising_step(2):
            ab.sol_attn_backend(q, q, q)
    counts = accelpatch.sol_attn.attention_backend_report()
    # the eligible call ran Sol-Attn over 2 blocks, every pair exact: it skipped nothing, so it is no sparse call
    assert counts.dense_calls == {ab.MASK: 1, ab.CAUSAL: 1, ab.SCALE: 1, SHORT_SEQUENCE: 1, ab.STEP_UNKNOWN: 1,
                                  ab.DENSE_STEP: 1, NOTHING_SKIPPED: 1, TOTAL_UNKNOWN: 1}
    assert counts.fallback_calls == {ab.MASK: 1, ab.CAUSAL: 1, ab.SCALE: 1, ab.STEP_UNKNOWN: 1, TOTAL_UNKNOWN: 1}
    assert counts.sparse_calls == 0


def test_bad_options_are_refused_naming_the_choices():
    with pytest.raises(ValueError, match="valid options: tau"):
        accelpatch.sol_attn.configure_sol_attn_backend(dense_layers="0,1")
    with pytest.raises(ValueError, match="thresh_type must be one of diag, exact"):
        accelpatch.sol_attn.configure_sol_attn_backend(thresh_type="full")
    with pytest.raises(ValueError, match="not a registered diffusers attention backend; valid: .*native"):
        accelpatch.sol_attn.configure_sol_attn_backend(dense_backend="fa5")
    with pytest.raises(ValueError, match="cannot be 'sol_attn'"):
        accelpatch.sol_attn.configure_sol_attn_backend(dense_backend="sol_attn")
    with pytest.raises(RuntimeError, match="flash-attn"):  # diffusers' own requirement check, at configure time
        accelpatch.sol_attn.configure_sol_attn_backend(dense_backend="flash")
    assert ab.current_config() == ab.backend_config()  # nothing refused took effect
    assert ab.options_in_force()["dense_backend"] is None


def test_a_named_dense_backend_runs_outside_high():
    inputs = wan_inputs()
    reference = tiny_wan()
    reference.set_attention_backend("_native_math")
    expected = forward(reference, inputs)
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    accelpatch.sol_attn.configure_sol_attn_backend(dense_backend="_native_math")
    assert_same_bits(forward(model, inputs), expected)


# ---------------------------------------------------------------- no leak across models, report, reset


def test_a_model_that_did_not_ask_for_sol_attn_never_runs_it():
    inputs = wan_inputs()
    other = tiny_wan(seed=3)
    other_reference = forward(other, inputs)
    sparse_at_every_length()
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    # diffusers made sol_attn the process-global active backend (diffusers#14249): `other`'s processors (backend
    # None) reach it through that path, and run the dense backend
    assert ad._AttentionBackendRegistry._active_backend is ad.AttentionBackendName.SOL_ATTN
    with accelpatch.quality("high"):
        assert_same_bits(forward(other, inputs), other_reference)
        with ad.attention_backend("sol_attn"):
            assert_same_bits(forward(other, inputs), other_reference)
        forward(model, inputs)
    counts = accelpatch.sol_attn.attention_backend_report()
    assert counts.dense_calls[ab.VIA_GLOBAL] == 2 * 4 and counts.sparse_calls == 2
    assert accelpatch.report(other).attention_backend is None  # `other` uses no sol_attn processor
    report = accelpatch.report(model)
    assert report.attention_backend.sparse_calls == 2 and "2 sparse calls" in str(report)
    assert "2 sparse calls" in report._repr_html_() and report.to_dict()["attention_backend"]["sparse_calls"] == 2


def test_report_reset_and_back_to_native_leaves_no_trace():
    inputs = wan_inputs()
    reference = forward(tiny_wan(), inputs)
    sparse_at_every_length()
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    with accelpatch.quality("high"):
        forward(model, inputs)
    assert accelpatch.report(model, reset=True).attention_backend.sparse_calls == 2
    assert accelpatch.sol_attn.attention_backend_report().sparse_calls == 0
    model.set_attention_backend("native")
    assert not ab.uses_sol_attn([model])
    assert ad._AttentionBackendRegistry._active_backend is ad.AttentionBackendName.NATIVE
    with accelpatch.quality("high"):
        assert_same_bits(forward(model, inputs), reference)
    counts = accelpatch.sol_attn.attention_backend_report()
    assert counts.sparse_calls == 0 and counts.dense_calls == {}
    assert str(accelpatch.report(model)) == "accelpatch: nothing is patched"


# ---------------------------------------------------------------- torch.compile


def test_compiled_model_keeps_the_contract_and_the_counts():
    torch._dynamo.reset()
    sparse_at_every_length()
    inputs = wan_inputs()
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    eager_lossless = forward(model, inputs)
    with accelpatch.quality("high"):
        eager_high = forward(model, inputs)
    ab.COUNTERS.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    try:
        assert_same_bits(forward(compiled, inputs), eager_lossless)
        with accelpatch.quality("high"):
            assert_same_bits(forward(compiled, inputs), eager_high)
            assert_same_bits(forward(compiled, inputs), eager_high)
        counts = accelpatch.sol_attn.attention_backend_report()
        assert counts.sparse_calls == 4 and counts.dense_calls == {ab.TIER: 4, ab.SHAPES: 4}
    finally:
        torch._dynamo.reset()


def test_threads_each_run_their_own_tier():
    """The tier is context-local: two threads sharing one model, one under high, one at the default."""
    import threading

    sparse_at_every_length()
    inputs = wan_inputs()
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    dense = forward(model, inputs)
    with accelpatch.quality("high"):
        sparse = forward(model, inputs)
    assert not torch.equal(sparse, dense)  # the two tiers differ, so a thread running the other's would be seen
    wrong = []

    def work(tier, expected):
        for _ in range(3):
            with accelpatch.quality(tier):
                if not torch.equal(forward(model, inputs), expected):
                    wrong.append(tier)

    threads = [threading.Thread(target=work, args=args) for args in (("high", sparse), ("lossless", dense))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_model_set_to_sol_attn_copies_and_pickles():
    import copy
    import pickle

    sparse_at_every_length()
    inputs = wan_inputs()
    model = tiny_wan()
    model.set_attention_backend("sol_attn")
    with accelpatch.quality("high"):
        expected = forward(model, inputs)
        assert accelpatch.sol_attn.attention_backend_report().sparse_calls == 2  # the clones run the sparse path
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert ab.uses_sol_attn([clone])
            assert torch.equal(forward(clone, inputs), expected)


def test_minimax_h3_takes_the_switch_too():
    """MiniMax-H3's processor goes through dispatch_attention_fn: same contract. (Its text/audio rows and refiner
    are not kept dense here: the backend sees no layout; apply(pipe, backend="sol_attn") does that.)"""
    from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer

    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=300)
    sparse_at_every_length()
    with torch.no_grad():
        reference = model(**inputs).sample
        model.set_attention_backend("sol_attn")
        assert_same_bits(model(**inputs).sample, reference)
        with accelpatch.quality("high"):
            sparse = model(**inputs).sample
    assert not torch.equal(sparse, reference)
    counts = accelpatch.sol_attn.attention_backend_report()
    # the two blocks' attention skipped blocks; the text-only refiner's short sequences skipped nothing
    assert counts.sparse_calls == 2 and counts.dense_calls == {ab.TIER: 4, NOTHING_SKIPPED: 2}
    assert counts.exact_fraction < 1
