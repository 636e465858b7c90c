"""impl="upstream": the gate (`upstream.unsupported_reason`) and the call-time fallback, on CPU.

The device is simulated by monkeypatching the probes in accelpatch.sol_attn.op.upstream (importable,
device_capability, cute_runtime_available), and the upstream package by a stub `sol_attn` module in
sys.modules. The stub applies upstream's own validation and backend rules (written here from upstream's
interface, independently of the gate; the only check skipped is "tensors are on a CUDA device") and
otherwise returns a marker tensor, so a test can tell which implementation ran.
"""
import itertools
import math
import sys
import types

import pytest
import torch

from accelpatch.sol_attn.op import sol_attn, sol_attn_varlen
from accelpatch.sol_attn.op.fallbacks import ImplFallbacks
from accelpatch.sol_attn.op import upstream

MARKER = 7.0


# ---- the stub upstream package ----

def upstream_rules(q, k, v, *, thresh_type, kv_splits, sink_tokens, sink_start):
    """Raise what upstream's sol_attn.interface.sol_attn raises for these arguments (CUDA check skipped)."""
    for t in (q, k, v):
        if t.dim() != 4 or t.shape != q.shape:
            raise ValueError("q, k, v must be 4-D tensors of the same shape [B, T, H, 128]")
        if t.dtype != torch.bfloat16:
            raise ValueError("q, k, v must be bfloat16")
        if t.device != q.device:
            raise ValueError("q, k, v must be on the same device")
        if not t.is_contiguous():
            raise ValueError("q, k, v must be contiguous")
    t_len = q.shape[1]
    if t_len <= 0:
        raise ValueError("T must be > 0")
    if q.shape[-1] != 128:
        raise ValueError("head dim must be 128")
    if thresh_type not in ("diag", "exact"):
        raise ValueError("thresh_type must be diag or exact")
    if not isinstance(sink_tokens, int) or not 0 <= sink_tokens <= t_len:
        raise ValueError("sink_tokens must be an int in [0, T]")
    if sink_start is not None:
        if not isinstance(sink_start, int) or not 0 <= sink_start <= t_len:
            raise ValueError("sink_start must be None or an int in [0, T]")
        if sink_start + sink_tokens > t_len:
            raise ValueError("sink_start + sink_tokens must be <= T")
    if kv_splits not in (1, 2, 4):
        raise ValueError("kv_splits must be 1, 2 or 4")
    arch = upstream.device_capability(q.device)
    if arch[0] < 8:
        raise RuntimeError("sol_attn needs compute capability >= 8.0")
    if arch in ((9, 0), (10, 0), (12, 0)) and upstream.cute_runtime_available():
        if arch != (9, 0) and kv_splits != 1:
            raise ValueError("kv_splits=2/4 is currently available on SM90 only")
        route_groups = math.ceil(math.ceil(t_len / 64) / 64)
        if kv_splits > route_groups:
            raise ValueError("each KV split must contain at least one N64 route group")
    elif kv_splits != 1:
        raise ValueError("kv_splits=2/4 is currently available on SM90 only")


def make_stub(raises=None):
    """A stub `sol_attn` module; `stub.calls` lists the kwargs of every call that reached it."""
    stub = types.ModuleType("sol_attn")
    stub.calls = []

    def stub_sol_attn(q, k, v, *, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start):
        stub.calls.append(dict(T=q.shape[1], kv_splits=kv_splits, sink_tokens=sink_tokens, sink_start=sink_start))
        if raises is not None:
            raise raises
        upstream_rules(q, k, v, thresh_type=thresh_type, kv_splits=kv_splits, sink_tokens=sink_tokens,
                       sink_start=sink_start)
        return torch.full_like(q, MARKER)

    stub.sol_attn = stub_sol_attn
    return stub


# ---- fixtures ----

@pytest.fixture(autouse=True)
def fresh_fallback_state(monkeypatch):
    """Each test starts with no recorded fallback and no warned reason (restored afterwards)."""
    monkeypatch.setattr(upstream, "FALLBACKS", ImplFallbacks(upstream.FALLBACKS.what))


@pytest.fixture
def device(monkeypatch):
    """device(cap, cute=...) simulates an importable upstream on a CUDA device of capability `cap`."""

    def simulate(cap=(9, 0), cute=True):
        monkeypatch.setattr(upstream, "importable", lambda: True)
        monkeypatch.setattr(upstream, "device_capability", lambda dev: cap)
        monkeypatch.setattr(upstream, "cute_runtime_available", lambda: cute)

    return simulate


@pytest.fixture
def stub(monkeypatch):
    """install(raises=None) puts a stub `sol_attn` package in sys.modules and returns it."""

    def install(raises=None):
        module = make_stub(raises)
        monkeypatch.setitem(sys.modules, "sol_attn", module)
        return module

    return install


def qkv(t, h=1, seed=0, b=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, t, h, 128, generator=g).to(torch.bfloat16) for _ in range(3)]


def zeros(t):
    """Cheap bf16 [1, T, 1, 128] inputs for calls that only reach the gate or the stub."""
    return [torch.zeros(1, t, 1, 128, dtype=torch.bfloat16) for _ in range(3)]


def is_marker(out):
    return bool((out == MARKER).all())


def assert_fell_back(out, q, k, v, reason_part, **kw):
    """One fallback whose reason contains reason_part, and the output is impl='torch' bit for bit."""
    assert sum(upstream.FALLBACKS.counts.values()) == 1
    assert reason_part in upstream.FALLBACKS.last_reason
    assert torch.equal(out, sol_attn(q, k, v, impl="torch", **kw))


# ---- the gate alone ----

def test_probes_on_cpu():
    assert upstream.device_capability(torch.device("cpu")) is None
    assert isinstance(upstream.cute_runtime_available(), bool)


def test_gate_needs_a_cuda_device_when_not_simulated(monkeypatch):
    monkeypatch.setattr(upstream, "importable", lambda: True)
    q, _, _ = zeros(64)
    assert "CUDA" in upstream.unsupported_reason(q, 1)


def test_gate_is_pure(device):
    device((8, 0))
    q, _, _ = zeros(64)
    reason = upstream.unsupported_reason(q, 2)
    assert reason and "SM 9.0" in reason
    assert upstream.FALLBACKS.last_reason is None and not upstream.FALLBACKS.counts


@pytest.mark.parametrize("cap,cute,kv_splits,t,part", [
    ((9, 0), True, 2, 4096, "route group"),
    ((9, 0), True, 4, 12288, "route group"),
    ((9, 0), True, 4, 4097, "route group"),
    ((9, 0), False, 2, 8192, "CuTe"),
    ((8, 0), True, 2, 8192, "SM 9.0"),
    ((10, 0), True, 4, 20000, "SM 9.0"),
    ((12, 0), False, 2, 8192, "SM 9.0"),
    ((7, 5), True, 1, 64, "compute capability >= 8.0"),
])
def test_gate_reasons(device, cap, cute, kv_splits, t, part):
    device(cap, cute)
    q, _, _ = zeros(t)
    reason = upstream.unsupported_reason(q, kv_splits)
    assert reason is not None and part in reason
    assert str(kv_splits) in reason or kv_splits == 1


@pytest.mark.parametrize("sink_tokens,sink_start,part", [
    (101, None, "sink_tokens in [0, T=100], got 101"),
    (0, 101, "sink_start None or in [0, T=100], got 101"),
    (60, 50, "sink_start + sink_tokens <= T=100, got 50 + 60 = 110"),
])
def test_gate_sink_reasons(device, sink_tokens, sink_start, part):
    device()
    q, _, _ = zeros(100)
    assert part in upstream.unsupported_reason(q, 1, sink_tokens, sink_start)
    assert upstream.unsupported_reason(q, 1, 100, None) is None
    assert upstream.unsupported_reason(q, 1, 40, 60) is None


def test_gate_other_limits(device):
    device()
    q, _, _ = zeros(64)
    assert "bf16" in upstream.unsupported_reason(q.float(), 1)
    assert "head dim 128" in upstream.unsupported_reason(q[..., :64], 1)
    assert "contiguous" in upstream.unsupported_reason(torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
                                                       .transpose(1, 2), 1)
    assert upstream.unsupported_reason(q, 1) is None


CASES = list(itertools.product(
    [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)],  # capability
    [True, False],  # CuTe runtime
    [1, 2, 4],  # kv_splits
    [1, 64, 4096, 4097, 12288, 12289],  # T
    [(0, None), (64, None), (64, 0), (1, 4096), (5000, None)],  # (sink_tokens, sink_start)
))


def test_gate_agrees_with_upstream_rules(device):
    """Whatever the simulated device and arguments, the gate accepts exactly what the stub accepts."""
    inputs = {t: zeros(t) for t in {c[3] for c in CASES}}
    for cap, cute, kv_splits, t, (sink_tokens, sink_start) in CASES:
        device(cap, cute)
        q, k, v = inputs[t]
        reason = upstream.unsupported_reason(q, kv_splits, sink_tokens, sink_start)
        try:
            upstream_rules(q, k, v, thresh_type="diag", kv_splits=kv_splits, sink_tokens=sink_tokens,
                           sink_start=sink_start)
            rejected = None
        except (ValueError, RuntimeError) as error:
            rejected = str(error)
        case = (cap, cute, kv_splits, t, sink_tokens, sink_start)
        assert (reason is None) == (rejected is None), (case, reason, rejected)


# ---- the op with impl="upstream" ----

def test_happy_path_calls_upstream(device, stub):
    device((9, 0), cute=True)
    module = stub()
    q, k, v = zeros(4097)
    out = sol_attn(q, k, v, impl="upstream", kv_splits=2, sink_tokens=64, sink_start=0)
    assert is_marker(out)
    assert module.calls == [dict(T=4097, kv_splits=2, sink_tokens=64, sink_start=0)]
    assert not upstream.FALLBACKS.counts and upstream.FALLBACKS.last_reason is None


@pytest.mark.parametrize("cap,cute", [((9, 0), True), ((9, 0), False), ((8, 0), True), ((10, 0), True)])
def test_happy_path_kv_splits_1(device, stub, cap, cute):
    device(cap, cute)
    module = stub()
    q, k, v = zeros(100)
    assert is_marker(sol_attn(q, k, v, impl="upstream"))
    assert len(module.calls) == 1 and not upstream.FALLBACKS.counts


@pytest.mark.parametrize("kv_splits,t", [(2, 4096), (4, 12288), (4, 4097)])
def test_kv_splits_without_enough_route_groups_falls_back(device, stub, kv_splits, t):
    device((9, 0), cute=True)
    module = stub()
    q, k, v = qkv(t)
    with pytest.warns(RuntimeWarning, match="route group"):
        out = sol_attn(q, k, v, impl="upstream", kv_splits=kv_splits, tau=4.0)
    assert module.calls == []
    assert_fell_back(out, q, k, v, f"got {upstream.route_groups(t)} route group(s) for T={t}", tau=4.0)


def test_kv_splits_on_sm90_without_cute_falls_back(device, stub):
    device((9, 0), cute=False)
    module = stub()
    q, k, v = qkv(4160)
    with pytest.warns(RuntimeWarning, match="CuTe"):
        out = sol_attn(q, k, v, impl="upstream", kv_splits=2, tau=4.0)
    assert module.calls == []
    assert_fell_back(out, q, k, v, "kv_splits=2 needs the CuTe DSL backend", tau=4.0)


@pytest.mark.parametrize("cap", [(8, 0), (10, 0)])
def test_kv_splits_off_sm90_falls_back(device, stub, cap):
    device(cap, cute=True)
    module = stub()
    q, k, v = qkv(200)
    with pytest.warns(RuntimeWarning, match="SM 9.0"):
        out = sol_attn(q, k, v, impl="upstream", kv_splits=2)
    assert module.calls == []
    assert_fell_back(out, q, k, v, f"got SM {cap[0]}.{cap[1]}")


@pytest.mark.parametrize("sink_tokens,sink_start,part", [
    (150, None, "sink_tokens in [0, T=100], got 150"),
    (0, 130, "sink_start None or in [0, T=100], got 130"),
    (10, 120, "sink_start None or in [0, T=100], got 120"),
    (60, 50, "sink_start + sink_tokens <= T=100"),
])
def test_sink_beyond_t_is_refused_before_upstream(device, stub, sink_tokens, sink_start, part):
    """The op refuses a sink past T itself, as upstream would (``part``: upstream's own reason, kept for callers
    that ask unsupported_reason ahead of the op)."""
    device()
    module = stub()
    q, k, v = qkv(100, h=2, seed=3)
    assert part in upstream.unsupported_reason(q, 1, sink_tokens, sink_start)
    with pytest.raises(ValueError, match=r"reaches past the sequence: T=100"):
        sol_attn(q, k, v, impl="upstream", sink_tokens=sink_tokens, sink_start=sink_start)
    assert module.calls == [] and upstream.FALLBACKS.counts == {}


def test_varlen_gates_each_segment(device, stub):
    """sink_tokens=150 fits the 200-token segment (upstream runs) but not the 100-token one (falls back)."""
    device()
    module = stub()
    q, k, v = (x[0] for x in qkv(300, seed=5))
    cu = torch.tensor([0, 100, 300])
    with pytest.warns(RuntimeWarning, match="sink_tokens"):
        out = sol_attn_varlen(q, k, v, cu, 200, impl="upstream", sink_tokens=150)
    assert [c["T"] for c in module.calls] == [200]
    assert is_marker(out[100:])
    # the segment shorter than the sink: the sink is clipped to the whole segment
    ours = sol_attn(q[None, :100], k[None, :100], v[None, :100], impl="torch", sink_tokens=100)
    assert torch.equal(out[:100], ours[0])
    assert upstream.FALLBACKS.counts == {upstream.FALLBACKS.last_reason: 1}


def test_unexpected_upstream_error_falls_back(device, stub):
    device()
    module = stub(raises=ValueError("upstream dislikes this shape for a new reason"))
    q, k, v = qkv(100, seed=7)
    with pytest.warns(RuntimeWarning, match="new reason"):
        out = sol_attn(q, k, v, impl="upstream")
        sol_attn(q, k, v, impl="upstream")
    assert len(module.calls) == 2
    reason = "upstream sol_attn raised ValueError: upstream dislikes this shape for a new reason"
    assert upstream.FALLBACKS.last_reason == reason
    assert upstream.FALLBACKS.counts == {reason: 2}
    assert torch.equal(out, sol_attn(q, k, v, impl="torch"))


def test_unexpected_upstream_error_falls_back_with_stats(device, stub):
    device()
    stub(raises=TypeError("unexpected keyword"))
    q, k, v = qkv(100, seed=8)
    with pytest.warns(RuntimeWarning, match="TypeError: unexpected keyword"):
        out, stats = sol_attn(q, k, v, impl="upstream", return_stats=True)
    ref, ref_stats = sol_attn(q, k, v, impl="torch", return_stats=True)
    assert torch.equal(out, ref) and torch.equal(stats.exact_pairs, ref_stats.exact_pairs)


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("CUDA error: device-side assert triggered"),
    torch.cuda.OutOfMemoryError("allocation failed"),
    KeyboardInterrupt(),
])
def test_fatal_upstream_errors_reraise(device, stub, error):
    device()
    stub(raises=error)
    q, k, v = zeros(64)
    with pytest.raises(type(error)):
        sol_attn(q, k, v, impl="upstream")
    assert not upstream.FALLBACKS.counts and upstream.FALLBACKS.last_reason is None
