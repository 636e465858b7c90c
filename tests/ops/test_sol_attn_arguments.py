"""The Sol-Attn op's argument checks (issue #16, item 13): a sink past the sequence is an error, as upstream's;
varlen's max_seqlen takes any integer (numpy's too) and refuses anything else by name."""
import numpy as np
import pytest
import torch

from accelpatch.sol_attn.op import sol_attn, sol_attn_varlen


def qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


@pytest.mark.parametrize("sink_tokens,sink_start", [(11, None), (4, 7), (0, 11), (11, 0)])
def test_a_sink_past_the_sequence_is_refused(sink_tokens, sink_start):
    q, k, v = qkv(1, 10, 1, 16)
    with pytest.raises(ValueError, match=rf"^the sink \(sink_tokens={sink_tokens}, sink_start={sink_start}\) "
                                         r"reaches past the sequence: T=10; valid: sink_tokens <= 10 and "
                                         r"sink_start \+ sink_tokens <= 10 \(sink_start None: the last sink_tokens "
                                         r"rows\)$"):
        sol_attn(q, k, v, sink_tokens=sink_tokens, sink_start=sink_start, impl="torch")


@pytest.mark.parametrize("sink_tokens,sink_start", [(10, None), (10, 0), (3, 7), (0, 10)])
def test_a_sink_up_to_the_end_runs(sink_tokens, sink_start):
    q, k, v = qkv(1, 10, 1, 16)
    assert sol_attn(q, k, v, sink_tokens=sink_tokens, sink_start=sink_start, impl="torch").shape == q.shape


def test_varlen_sink_must_fit_max_seqlen_and_is_clipped_to_shorter_segments():
    q, k, v = qkv(100, 2, 16, seed=1)
    cu = torch.tensor([0, 40, 100])
    with pytest.raises(ValueError, match=r"reaches past the sequence: max_seqlen=60"):
        sol_attn_varlen(q, k, v, cu, 60, sink_tokens=61, impl="torch")
    out = sol_attn_varlen(q, k, v, cu, 60, sink_tokens=50, impl="torch")  # the 40-row segment: all sink
    ref = sol_attn(q[None, :40], k[None, :40], v[None, :40], sink_tokens=40, impl="torch")[0]
    assert torch.equal(out[:40], ref)


@pytest.mark.parametrize("max_seqlen", [np.int64(60), np.int32(60), torch.tensor(60), 60])
def test_varlen_max_seqlen_takes_any_integer(max_seqlen):
    q, k, v = qkv(100, 2, 16, seed=2)
    cu = torch.tensor([0, 40, 100])
    out = sol_attn_varlen(q, k, v, cu, max_seqlen, tau=0.5, impl="torch")
    assert torch.equal(out, sol_attn_varlen(q, k, v, cu, 60, tau=0.5, impl="torch"))


@pytest.mark.parametrize("max_seqlen", [60.0, np.float64(60), "60", True, 0, -1, None, torch.tensor(60.0)])
def test_varlen_max_seqlen_refuses_non_integers_by_name(max_seqlen):
    q, k, v = qkv(100, 2, 16)
    with pytest.raises(ValueError, match=rf"^max_seqlen must be an integer >= 1 \(the longest segment's length\), "
                                         rf"got .* \({type(max_seqlen).__name__}\)$"):
        sol_attn_varlen(q, k, v, torch.tensor([0, 40, 100]), max_seqlen, impl="torch")
