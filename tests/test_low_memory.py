"""``apply(pipe, memory="low")`` (issue #44 part 3): the feed-forwards, the query/key norms and the restated blocks'
row-wise parts run in chunks of tokens. At the default tier each chunked computation is checked against the whole
one on first sight per signature (a match chunks from then on, a mismatch runs whole for good, warned, strict
raises); at tier high the chunks run unverified. Outputs are the unpatched model's bit for bit wherever the default
tier runs, and the options say what is wrong with a bad value."""
from __future__ import annotations

import warnings

import pytest
import torch

import accelpatch
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.low_memory.chunked import CHUNKED, HOOKED_INSIDE, UNVERIFIED, Chunking, run_in_chunks
from accelpatch.low_memory.feature import DEFAULT_CHUNK_TOKENS, MemoryMode
from accelpatch.testing import hunyuan_video15, ltx2, minimax_h3, sana_video, sana_video2, wan

#: the families whose site tables carry chunked rows: (builder, inputs)
FAMILIES = {
    "wan": (wan.tiny_wan_transformer, wan.wan_transformer_inputs),
    "ltx2": (ltx2.tiny_ltx2_transformer, ltx2.ltx2_transformer_inputs),
    "minimax_h3": (minimax_h3.tiny_minimax_h3_transformer, minimax_h3.minimax_h3_transformer_inputs),
    "hunyuan_video15": (hunyuan_video15.tiny_hunyuan_video15_transformer,
                        hunyuan_video15.hunyuan_video15_transformer_inputs),
    "sana_video": (sana_video.tiny_sana_video_transformer, sana_video.sana_video_transformer_inputs),
    "sana_video2": (sana_video2.tiny_sana_video2_transformer, sana_video2.sana_video2_transformer_inputs),
}
#: small enough that the tiny models' token sequences (a few hundred to a thousand; MiniMax-H3's 26 packed
#: tokens; SANA-Video's GLUMB chunks frames of 4 x 4 latent pixels) split into several chunks
CHUNK = 96
CHUNKS = {"minimax_h3": 8, "sana_video": 16, "sana_video2": 24}


def _model(family: str, dtype: torch.dtype):
    build, make_inputs = FAMILIES[family]
    model = build(dtype=dtype)
    inputs = make_inputs(model)
    inputs["return_dict"] = False
    return model, inputs


def _run(model, inputs) -> tuple:
    with torch.no_grad():
        out = model(**inputs)
    return tuple(t for t in out if isinstance(t, torch.Tensor))


def _equal(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _chains(model) -> dict:
    """The chunked op's outcomes over the model's sites: outcome -> calls."""
    counts: dict = {}
    for site in model.__dict__["_accelpatch_state"].sites:
        for name, n in site.counters.totals()["chains"].items():
            op, _, outcome = name.partition("|")
            if op == CHUNKED.name:
                counts[outcome] = counts.get(outcome, 0) + n
    return counts


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    torch.set_num_threads(1)
    CHUNKED.forget()
    yield
    CHUNKED.forget()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_low_memory_at_the_default_tier_is_bit_identical_and_says_what_ran(family, dtype):
    """Every call of the patched model equals the unpatched one bit for bit, first and later calls, and each chunked
    computation is counted: it ran, or it was declined with the reason (a kernel that rounds differently for fewer
    rows) and ran whole."""
    model, inputs = _model(family, dtype)
    reference = _run(model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a declined signature warns once; counted below
        accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNKS.get(family, CHUNK))
        first, second = _run(model, inputs), _run(model, inputs)
    assert _equal(first, reference) and _equal(second, reference)
    counts = _chains(model)
    ran = counts.get("ran", 0)
    declined = sum(n for outcome, n in counts.items() if outcome.startswith("declined"))
    assert ran + declined > 0, counts  # never a silent no-op
    verdicts = CHUNKED.verdicts()
    assert verdicts and all(v.verified or v.reason for v in verdicts)
    assert ran == 0 or any(v.verified for v in verdicts)
    accelpatch.remove(model)
    assert _equal(_run(model, inputs), reference)


def test_wan_in_bf16_chunks_its_feed_forward_norms_and_block_rows():
    """The sites that chunk (the feed-forward, the four q/k norms of a block are site rows; the block's AdaLN norms
    and gated residuals and the self-attention's projection are its restated parts): each has a verdict, and every
    call after the first runs each of them chunked, or whole where its signature was declined (counted)."""
    model, inputs = _model("wan", torch.bfloat16)
    reference = _run(model, inputs)
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK)
    _run(model, inputs)

    def handled():  # calls that ran chunked, or whole for a declined signature
        counts = _chains(model)
        return counts.get("ran", 0) + sum(n for o, n in counts.items() if o.startswith("declined"))

    before = handled()
    assert _equal(_run(model, inputs), reference)
    described = " ".join(v.described for v in CHUNKED.verdicts())
    for computation in ("FeedForward.forward", "RMSNorm.forward", "modulated_norm", "gated_residual",
                        "float_norm", "_project_rows"):
        assert f"{computation} in chunks of {CHUNK} tokens" in described, computation
    # per block and call: the feed-forward, attn2's query norm (its key norm sees 8 text tokens, one chunk; attn1's
    # norms run inside the chunked projection, a chunk each), two modulated norms, the float norm, two gated
    # residuals and the projection: 8, each chunked (on this machine's kernels: where a kernel rounds differently
    # for fewer rows, that signature is declined and runs whole, counted)
    assert handled() - before == 8 * len(model.blocks), _chains(model)


def test_a_computation_that_is_not_row_wise_is_declined_and_runs_whole():
    """A module inside a chunked site that mixes tokens (here: a feed-forward's dropout replaced by a token-mean
    subtraction) gives other values in chunks: the first sight declines the signature for good, warns once, and
    the model's output is the unpatched one; strict mode raises instead."""
    model, inputs = _model("wan", torch.bfloat16)

    class MixTokens(torch.nn.Module):
        def forward(self, x):
            return x - x.mean(dim=1, keepdim=True)

    for block in model.blocks:
        block.ffn.net[1] = MixTokens()
    reference = _run(model, inputs)
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK)
    with pytest.warns(RuntimeWarning, match="differs from the reference"):
        first = _run(model, inputs)
    assert _equal(first, reference) and _equal(_run(model, inputs), reference)
    declined = [v for v in CHUNKED.verdicts() if not v.verified and "FeedForward.forward" in v.described]
    assert declined and all("differs from the reference" in v.reason for v in declined)
    assert any(o.startswith("declined") for o in _chains(model))
    accelpatch.remove(model)
    CHUNKED.forget()
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK, strict=True)
    with pytest.raises(FastPathUnavailableError, match="chunked_tokens"):
        _run(model, inputs)


def test_tier_high_runs_the_chunks_unverified():
    """Under ``quality("high")`` no first sight runs (no whole call held beside the chunks): the chunked calls are
    counted as unverified and no verdict is recorded."""
    model, inputs = _model("wan", torch.bfloat16)
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK)
    with accelpatch.quality("high"):
        _run(model, inputs)
    assert _chains(model).get(UNVERIFIED, 0) > 0
    assert CHUNKED.verdicts() == []


def test_a_hook_inside_a_chunked_module_keeps_it_whole():
    """A forward hook on a module inside a chunked feed-forward would see chunks: that feed-forward runs whole,
    counted, and the hook sees the call's every token."""
    model, inputs = _model("wan", torch.bfloat16)
    reference = _run(model, inputs)
    seen = []
    model.blocks[0].ffn.net[2].register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK)
    assert _equal(_run(model, inputs), reference)
    assert len(seen) == 1 and seen[0] > CHUNK  # one call, with every token
    site = model.blocks[0].ffn.__dict__["_accelpatch_site"]
    assert site.counters.totals()["reference"][HOOKED_INSIDE] == 1


def test_without_memory_low_no_chunked_site_is_mounted():
    model, _ = _model("wan", torch.bfloat16)
    accelpatch.apply(model)
    kinds = {site.kind for site in model.__dict__["_accelpatch_state"].sites}
    assert "chunked_tokens" not in kinds and kinds
    accelpatch.apply(model, memory="low")
    kinds = {site.kind for site in model.__dict__["_accelpatch_state"].sites}
    assert "chunked_tokens" in kinds
    assert model.__dict__["_accelpatch_state"].configs["memory"] == MemoryMode("low", DEFAULT_CHUNK_TOKENS)


@pytest.mark.parametrize("kwargs,message", [
    (dict(memory="lowest"), "memory must be one of 'default', 'low' or None, got 'lowest'"),
    (dict(memory="low", memory_chunk_tokens=0), "memory_chunk_tokens must be an integer >= 1"),
    (dict(memory="low", memory_chunk_tokens=True), "memory_chunk_tokens must be an integer >= 1"),
    (dict(memory_chunk_tokens=512), "memory_chunk_tokens=512 needs memory='low'"),
    (dict(memory="low", memory_chunk_token=512), "did you mean 'memory_chunk_token' → 'memory_chunk_tokens'"),
])
def test_bad_memory_options_name_the_value_and_the_choices(kwargs, message):
    model, _ = _model("wan", torch.float32)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        accelpatch.apply(model, **kwargs)
    assert "_accelpatch_state" not in model.__dict__  # nothing touched


def test_chunks_of_several_results_and_rows_that_go_with_the_tokens():
    """``run_in_chunks``: a result tuple is written chunk by chunk into one output each; a tensor as long as the
    first along the tokens is sliced with it, a (batch, 1, channels) row goes whole to every chunk."""
    x = torch.randn(2, 10, 4)
    rows = torch.randn(1, 10, 4)
    scale = torch.randn(2, 1, 4)

    def forward(module, x, rows, scale):
        assert scale.shape == (2, 1, 4) and rows.shape[1] == x.shape[1]
        return x * scale + rows, (x + rows).sum(-1, keepdim=True)

    out = run_in_chunks(x, rows, scale, Chunking(None, forward, 3))
    expected = forward(None, x, rows, scale)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(a.is_contiguous() for a in out)
    with pytest.raises(TypeError, match="not row-wise"):
        run_in_chunks(x, Chunking(None, lambda module, x: x.sum(1), 3))


@pytest.mark.parametrize("tier", ["lossless", "high"])
def test_fullgraph_compile_with_memory_low(tier):
    """Compiled with ``fullgraph=True``: at the default tier no first sight can run, so the whole computations run
    (the compiled patched model equals the compiled unpatched one); at tier high the chunks run unverified inside
    the graph and are counted."""
    model, inputs = _model("wan", torch.float32)
    torch._dynamo.reset()
    reference = _run(torch.compile(model, backend="eager", fullgraph=True), inputs)
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK, tier=tier)
    torch._dynamo.reset()
    compiled = _run(torch.compile(model, backend="eager", fullgraph=True), inputs)
    counts = _chains(model)
    if tier == "lossless":
        assert _equal(compiled, reference)
        assert counts.get("ran", 0) == 0 and CHUNKED.verdicts() == []
    else:
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(compiled, reference))
        assert counts.get(UNVERIFIED, 0) > 0, counts


def test_a_model_patched_with_memory_low_pickles_and_deep_copies():
    import copy
    import io

    model, inputs = _model("wan", torch.bfloat16)
    reference = _run(model, inputs)
    accelpatch.apply(model, memory="low", memory_chunk_tokens=CHUNK)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    twin = copy.deepcopy(model)
    for other in (loaded, twin):
        assert _equal(_run(other, inputs), reference)
        counts = _chains(other)  # the copies' own counts: chunked, or whole where a signature was declined
        assert counts.get("ran", 0) + sum(n for o, n in counts.items() if o.startswith("declined")) > 0
        accelpatch.remove(other)
        assert _equal(_run(other, inputs), reference)


def test_a_model_without_chunked_computations_says_memory_low_does_nothing(monkeypatch):
    """Every family chunks something; a site table without a chunking path (here Wan's, cut to its in-place GELU)
    makes memory='low' a no-op, which apply() says (strict raises)."""
    from accelpatch.core.adapter import SiteRule
    from accelpatch.lossless.gelu import IN_PLACE_GELU
    from accelpatch.models.wan.adapter import WanAdapter

    monkeypatch.setattr(WanAdapter, "sites", (SiteRule(r"blocks\.(\d+)\.ffn\.net\.0", IN_PLACE_GELU),))
    model, _ = _model("wan", torch.float32)
    with pytest.warns(RuntimeWarning, match="memory='low' does nothing on WanTransformer3DModel yet"):
        accelpatch.apply(model, memory="low")
    accelpatch.remove(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CUDA-only paths' rejections
        with pytest.raises(FastPathUnavailableError, match="memory='low' does nothing"):
            accelpatch.apply(model, memory="low", strict=True)
    assert "_accelpatch_state" not in model.__dict__


def test_chunks_hold_one_chunk_at_a_time_beside_the_output():
    """The point of chunking: while the output fills, one chunk's results are alive, not two (a generator that
    kept its last results while computing the next held twice as much)."""
    from accelpatch.memory import LiveBytes

    x = torch.randn(1, 1000, 64)
    how = Chunking(None, lambda module, x: (x * 2) + 1, 100)
    with LiveBytes() as live:
        out = run_in_chunks(x, how)
    whole, piece = x.numel() * 4, 100 * 64 * 4
    assert torch.equal(out, x * 2 + 1)
    assert live.peak == whole + 2 * piece  # the output, a chunk's x * 2 and its + 1 (then the first is freed)
