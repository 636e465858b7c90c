"""Checks of the guarded step cache on a two-block dual-stream model (HunyuanVideo 1.5: video and text; LTX-2: video
and audio), driven by direct forwards on a decreasing timestep (the step clock reads it; no pipeline, so no
final-step guard). The expected reused output is computed independently of the cache: the unpatched model whose
last block, at a reused step, returns its inputs plus the residual it added to each stream at the last computed
step (what FirstBlockCache's reuse means with two blocks: the head block runs, the tail's contribution is reused)."""
import inspect
import warnings

import torch
from diffusers import FirstBlockCacheConfig

import accelpatch

STEPS = 5
#: cache_warmup_steps=1, cache_max_reuse=2 (the default): step 0 computes (first), 1-2 reuse, 3 computes, 4 reuses
COMPUTED = (0, 3)


def _step_inputs(inputs: dict, step: int) -> dict:
    timestep = torch.full_like(inputs["timestep"], 900.0 - 150.0 * step)
    out = {**inputs, "timestep": timestep, "hidden_states": inputs["hidden_states"] * (1.0 - 0.05 * step)}
    if "sigma" in inputs:  # LTX-2.3's prompt modulation reads sigma = timestep / 1000
        out["sigma"] = timestep / 1000.0
    return out


def run_steps(model, inputs: dict, outputs) -> list:
    """One output tuple per step of a :data:`STEPS`-step loop."""
    with torch.no_grad():
        return [outputs(model(**_step_inputs(inputs, step))) for step in range(STEPS)]


def _steps_with_hooks(model, inputs: dict, outputs, state: dict, handles: list) -> list:
    """The :data:`STEPS` forwards with the reference hooks ``handles`` on, ``state["reuse"]`` set per step (the steps
    not in :data:`COMPUTED` reuse); the hooks come off after."""
    try:
        out = []
        with torch.no_grad():
            for step in range(STEPS):
                state["reuse"] = step not in COMPUTED
                out.append(outputs(model(**_step_inputs(inputs, step))))
        return out
    finally:
        for handle in handles:
            handle.remove()


def reused_reference(model, inputs: dict, outputs, second: str, second_residual: bool = True) -> list:
    """The unpatched model's outputs where the tail block, at every step not in :data:`COMPUTED`, returns (its
    hidden states, its ``second`` stream) plus the residuals it added at the last computed step (without the
    second stream's when not ``second_residual``: a deliberately wrong reference, what MagCache's hooks do)."""
    blocks = model.transformer_blocks
    assert len(blocks) == 2, "this reference needs a head and a tail block only"
    signature = inspect.signature(type(blocks[1]).forward)
    state = {"reuse": False, "residuals": None}

    def tail_hook(module, args, kwargs, output):
        bound = signature.bind(module, *args, **kwargs).arguments
        streams = (bound["hidden_states"], bound[second])
        if state["reuse"]:
            return tuple(x + r for x, r in zip(streams, state["residuals"], strict=True))
        state["residuals"] = tuple(o - x for o, x in zip(output, streams, strict=True))
        if not second_residual:
            state["residuals"] = (state["residuals"][0], torch.zeros_like(state["residuals"][1]))
        return None

    return _steps_with_hooks(model, inputs, outputs, state, [blocks[1].register_forward_hook(tail_hook,
                                                                                           with_kwargs=True)])


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


def all_bits_equal(runs, references) -> bool:
    return all(bits_equal(a, b) for run, ref in zip(runs, references, strict=True)
               for a, b in zip(run, ref, strict=True))


def apply_cache(model, **options) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no backend: "no module accelpatch patches"
        accelpatch.apply(model, **options)


def cached_high_run(model, inputs: dict, outputs) -> list:
    """The loop under ``high`` with an always-reuse FirstBlockCache (warm-up 1, reuse limit 2); removed after."""
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            return run_steps(model, inputs, outputs)
    finally:
        accelpatch.remove(model)


def check_dual_stream_cache(model, inputs: dict, outputs, second: str) -> None:
    """exact/lossless: every step the unpatched bits, nothing reused; high: steps 1, 2, 4 reuse both streams'
    residuals exactly as :func:`reused_reference` says (bits), 0 and 3 are the unpatched bits; under high a zero
    threshold reuses nothing and gives the unpatched bits; remove() leaves the blocks as they were."""
    plain = run_steps(model, inputs, outputs)
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=0)
    try:
        assert all_bits_equal(run_steps(model, inputs, outputs), plain)  # default tier: lossless
        with accelpatch.quality("exact"):
            assert all_bits_equal(run_steps(model, inputs, outputs), plain)
        cache = accelpatch.report(model).models[0].cache
        assert (cache["computed"], cache["reused"]) == (2 * STEPS, 0)
        assert cache["reasons"] == {"tier does not admit high": 2 * STEPS}
    finally:
        accelpatch.remove(model)
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=0.0), cache_warmup_steps=0)
    try:
        with accelpatch.quality("high"):
            assert all_bits_equal(run_steps(model, inputs, outputs), plain)
        cache = accelpatch.report(model).models[0].cache
        assert cache["reused"] == 0 and cache["reasons"]["residual changed more than the threshold"] == STEPS - 1
    finally:
        accelpatch.remove(model)
    expected = reused_reference(model, inputs, outputs, second)
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            cached = run_steps(model, inputs, outputs)
        cache = accelpatch.report(model).models[0].cache
        assert (cache["computed"], cache["reused"]) == (2, 3), cache
    finally:
        accelpatch.remove(model)
    assert all_bits_equal(cached, expected)
    for step, (run, ref) in enumerate(zip(cached, plain)):
        assert all(torch.isfinite(x).all() for x in run)
        # a reused step differs from the full computation in every stream (both residuals were reused)
        assert all(torch.equal(a, b) == (step in COMPUTED) for a, b in zip(run, ref, strict=True)), step
    assert not any(hasattr(b, "_diffusers_hook") or "forward" in b.__dict__ for b in model.transformer_blocks)
    assert all_bits_equal(run_steps(model, inputs, outputs), plain)


def mag_reference(model, inputs: dict, outputs) -> list:
    """The unpatched model's outputs where, at every step not in :data:`COMPUTED`, the blocks return the head
    block's input hidden states plus the residual the whole stack added at the last computed step, and the second
    stream as it entered (what diffusers' MagCache does on a skipped step)."""
    head, tail = model.transformer_blocks
    signatures = [inspect.signature(type(block).forward) for block in (head, tail)]
    state = {"reuse": False, "input": None, "residual": None}

    def streams(index, module, args, kwargs):
        bound = signatures[index].bind(module, *args, **kwargs).arguments
        return bound["hidden_states"], bound["encoder_hidden_states"]

    def head_hook(module, args, kwargs, output):
        hidden, second = streams(0, module, args, kwargs)
        if state["reuse"]:
            return hidden + state["residual"], second
        state["input"] = hidden
        return None

    def tail_hook(module, args, kwargs, output):
        if state["reuse"]:
            return streams(1, module, args, kwargs)
        state["residual"] = output[0] - state["input"]
        return None

    return _steps_with_hooks(model, inputs, outputs, state, [head.register_forward_hook(head_hook, with_kwargs=True),
                                                             tail.register_forward_hook(tail_hook, with_kwargs=True)])
