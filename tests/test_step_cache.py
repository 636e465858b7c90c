"""The high-tier step cache on diffusers' FirstBlockCache hooks: bit identity below high, real reuse above it,
guards step by step, clean state per call and per thread, report() counts, remove()."""
import threading
import warnings

import pytest
import torch
from diffusers import FirstBlockCacheConfig

import accelpatch
from accelpatch import testing
from accelpatch.step_cache.feature import step_cache_of

STEPS = 8


@pytest.fixture(scope="module")
def sana():
    torch.set_num_threads(1)
    pipe = testing.tiny_sana_video_pipeline()
    reference = pipe(**call()).frames
    yield pipe, reference
    accelpatch.remove(pipe)


def call(seed=0, steps=STEPS):
    return testing.sana_video_pipeline_call_kwargs(num_inference_steps=steps, seed=seed)


class Executions:
    """Counts real executions of each transformer block (a hook on a module inside the block: a reused block's
    __call__ still happens, its body does not)."""

    def __init__(self, blocks, inner: str):
        self.per_call: list[list[int]] = []
        self.handles = [getattr(block, inner).register_forward_hook(self._hit(i)) for i, block in enumerate(blocks)]
        self.current = [0] * len(blocks)

    def _hit(self, index):
        def hook(module, args, output):
            self.current[index] += 1
        return hook

    def take(self) -> list[int]:
        out, self.current = self.current, [0] * len(self.current)
        return out

    def close(self):
        for handle in self.handles:
            handle.remove()


def quiet_apply(pipe, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU rejection of SANA-Video's BF16 GEMM, asserted elsewhere
        return accelpatch.apply(pipe, **kwargs)


def test_the_guards_as_fractions_of_the_call_follow_its_number_of_steps(sana):
    """#42: cache_warmup_steps='25%' and cache_final_steps=0.125 are 2 and 1 of this 8-step call (the scheduler says
    8): the same decisions as the counts 2 and 1 above; at 4 steps they are 1 and 1."""
    pipe, _ = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps="25%", cache_max_reuse=2,
                cache_final_steps=0.125)
    try:
        with accelpatch.quality("high"):
            pipe(**call())
            cache = accelpatch.report(pipe, reset=True).models[0].cache
            assert (cache["computed"], cache["reused"]) == (4, 4)
            assert cache["reasons"] == {"first step of the call": 1,
                                        "warm-up step (step < cache_warmup_steps=25%)": 1,
                                        "reuse limit (cache_max_reuse=2 in a row)": 1,
                                        "final step (last cache_final_steps=12.5%)": 1}
            pipe(**call(steps=4))  # 1 warm-up step (the first), steps 1-2 reused, 3 the final one
            cache = accelpatch.report(pipe).models[0].cache
            assert (cache["computed"], cache["reused"]) == (2, 2)
            assert cache["reasons"] == {"first step of the call": 1, "final step (last cache_final_steps=12.5%)": 1}
        with pytest.raises(ValueError, match=r"cache_warmup_steps must be a number of steps \(an int >= 0\)"):
            quiet_apply(pipe, cache="first_block", cache_warmup_steps="two")
    finally:
        accelpatch.remove(pipe)


def test_exact_and_lossless_with_a_cache_are_bit_identical_and_reuse_nothing(sana):
    pipe, reference = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9))
    try:
        assert torch.equal(pipe(**call()).frames, reference)  # default tier: lossless
        with accelpatch.quality("exact"):
            assert torch.equal(pipe(**call()).frames, reference)
        cache = accelpatch.report(pipe).models[0].cache
        assert cache["reused"] == 0 and cache["computed"] == 2 * STEPS
        assert cache["reasons"] == {"tier does not admit high": 2 * STEPS}
        assert "it never reused anything (tier does not admit high" in str(accelpatch.report(pipe))
        assert "it never reused anything" in accelpatch.report(pipe)._repr_html_()  # a notebook shows it too
    finally:
        accelpatch.remove(pipe)


def test_an_always_reuse_threshold_skips_blocks_and_follows_the_guards_step_by_step(sana):
    pipe, reference = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=2, cache_max_reuse=2,
                cache_final_steps=1)
    head, tail = pipe.transformer.transformer_blocks
    runs = Executions([head, tail], "attn1")
    per_step = []
    step_hook = pipe.transformer.register_forward_hook(lambda m, a, o: per_step.append(runs.take()))
    try:
        with accelpatch.quality("high"):
            frames = pipe(**call()).frames
    finally:
        step_hook.remove()
        runs.close()
    # steps 0-1 warm-up, 2-3 reused, 4 computed (2 in a row), 5-6 reused, 7 the final step
    assert [tail_runs for _, tail_runs in per_step] == [1, 1, 0, 0, 1, 0, 0, 1]
    assert all(head_runs == 1 for head_runs, _ in per_step)  # the first block always runs
    assert not torch.equal(frames, reference)
    cache = accelpatch.report(pipe).models[0].cache
    assert (cache["computed"], cache["reused"]) == (4, 4)
    assert cache["reasons"] == {"first step of the call": 1, "warm-up step (step < cache_warmup_steps=2)": 1,
                                "reuse limit (cache_max_reuse=2 in a row)": 1,
                                "final step (last cache_final_steps=1)": 1}
    accelpatch.remove(pipe)


def test_threshold_zero_reuses_nothing_and_is_bit_identical_under_high(sana):
    pipe, reference = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=0.0), cache_warmup_steps=0)
    try:
        with accelpatch.quality("high"):
            assert torch.equal(pipe(**call()).frames, reference)
        cache = accelpatch.report(pipe).models[0].cache
        assert cache["reused"] == 0 and "residual changed more than the threshold" in cache["reasons"]
    finally:
        accelpatch.remove(pipe)


def test_every_call_starts_clean_also_after_an_interrupted_one(sana):
    pipe, _ = sana
    # no warm-up guard: only a clean state keeps step 0 from reusing the previous call's residuals
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=0)
    try:
        with accelpatch.quality("high"):
            first = pipe(**call()).frames
            second = pipe(**call()).frames
            assert torch.equal(first, second)

            def stop_at_step_3(pipeline, step, timestep, callback_kwargs):
                if step == 3:
                    raise KeyboardInterrupt  # a user interrupting a generation
                return callback_kwargs

            with pytest.raises(KeyboardInterrupt):
                pipe(**call(), callback_on_step_end=stop_at_step_3)
            assert torch.equal(pipe(**call()).frames, first)
    finally:
        accelpatch.remove(pipe)


def test_two_threads_sharing_one_transformer_keep_their_own_cache_state():
    # A diffusers pipeline is not thread-safe (its scheduler steps in place), so each thread has its own pipeline
    # around the one shared transformer, patched alone: its step clock then counts per thread from the timesteps.
    transformer = testing.tiny_sana_video_transformer()
    pipes = [testing.tiny_sana_video_pipeline(transformer=transformer) for _ in range(2)]
    quiet_apply(transformer, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            alone = {seed: pipes[0](**call(seed)).frames for seed in (0, 1)}
        assert accelpatch.report(transformer).models[0].cache["reused"] > 0
        results, barrier, errors = {}, threading.Barrier(2), []

        def worker(seed):
            try:
                barrier.wait()
                with accelpatch.quality("high"):
                    for _ in range(3):
                        results[seed] = pipes[seed](**call(seed)).frames
            except BaseException as error:  # surfaced below: a thread's failure must fail the test
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all(torch.equal(results[seed], alone[seed]) for seed in (0, 1))
    finally:
        accelpatch.remove(transformer)


def test_diffusers_end_of_call_reset_forgets_only_the_calling_contexts_generation():
    """diffusers resets a cache's state at the end of every pipeline call (``maybe_free_model_hooks`` ->
    ``reset_stateful_hooks`` -> the hook's ``state_manager.reset()``): one thread's call ending must not wipe the
    states another thread's call is halfway through; ``remove()`` (``clear``) forgets them all."""
    import contextvars
    import types

    from accelpatch.step_cache.states import ContextLocalStateManager, _CallKey

    key = contextvars.ContextVar("call key", default=None)
    states = ContextLocalStateManager(types.SimpleNamespace, key)
    states.reset()  # outside any call: nothing is the caller's to forget, and nothing fails
    key.set(_CallKey(generation=1, step=3, branch=0))
    mine = states.get_state()
    mine.residual = "half-way through generation 1"
    seen = []

    def another_call_ends():
        key.set(_CallKey(generation=2, step=7, branch=0))
        states.get_state()
        seen.append(states.live_generations)
        states.reset()  # what diffusers runs as this thread's pipeline call returns
        seen.append(states.live_generations)

    thread = threading.Thread(target=another_call_ends)
    thread.start()
    thread.join()
    assert seen == [2, 1]
    assert states.get_state() is mine and mine.residual == "half-way through generation 1"
    states.reset()
    assert states.live_generations == 0
    states.get_state()
    states.clear()
    assert states.live_generations == 0


def test_remove_restores_the_blocks_and_the_output(sana):
    pipe, reference = sana
    blocks = list(pipe.transformer.transformer_blocks)
    quiet_apply(pipe, cache="first_block")
    assert all(hasattr(b, "_diffusers_hook") for b in blocks)
    accelpatch.remove(pipe)
    assert not any(hasattr(b, "_diffusers_hook") or "forward" in b.__dict__ for b in blocks)
    assert torch.equal(pipe(**call()).frames, reference)


def test_minimax_h3_caches_through_its_pipeline_and_composes_with_sol_attn():
    pipe = testing.tiny_minimax_h3_pipeline()
    kwargs = lambda: testing.minimax_h3_pipeline_call_kwargs(num_inference_steps=7, output_type="pt")  # noqa: E731
    reference = pipe(**kwargs(), output="videos")
    accelpatch.apply(pipe, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, cache="first_block",
                     cache_warmup_steps=1, cache_final_steps=1)
    try:
        with accelpatch.quality("lossless"):
            assert torch.equal(pipe(**kwargs(), output="videos"), reference)
        accelpatch.report(pipe, reset=True)
        block = pipe.transformer.transformer_blocks[-1]
        runs = Executions([block], "attn")
        accelpatch.remove(pipe)
        accelpatch.apply(pipe, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0,
                         cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1, cache_final_steps=1)
        pipe(**kwargs(), output="videos")  # default tier high (sol_attn)
        runs.close()
        report = accelpatch.report(pipe)
        # 7 steps = 6 forwards: step 0 computes (first), then reuse, limit, reuse, limit... the last is final
        tail_runs = runs.take()[0]
        assert report.models[0].cache["reused"] > 0 and tail_runs < 6
        # Sol-Attn ran in the blocks that were computed: the first block at every forward, the last when not reused
        sol_attn = {s.path: s.fast_calls for s in report.sites if s.kind == "sol_attn"}
        last = f"transformer_blocks.{len(pipe.transformer.transformer_blocks) - 1}.attn"
        assert sol_attn["transformer_blocks.0.attn"] == 6 and sol_attn[last] == tail_runs
    finally:
        accelpatch.remove(pipe)


def test_bad_cache_arguments_name_the_choices():
    model = testing.tiny_sana_video_transformer()
    with pytest.raises(ValueError, match="unknown cache 'teacache'; give one of 'first_block'"):
        accelpatch.apply(model, cache="teacache")
    with pytest.raises(ValueError, match="need a cache"):
        accelpatch.apply(model, cache_max_reuse=3)
    with pytest.raises(ValueError, match="cache_max_reuse must be an integer >= 0, got -1"):
        accelpatch.apply(model, cache="first_block", cache_max_reuse=-1)
    with pytest.raises(ValueError, match="cache method 'mag' is not available for SANA-Video 2.0 .*Block Attention "
                                         "Residuals.*it runs 'first_block'"):
        accelpatch.apply(testing.tiny_sana_video2_transformer(), cache=mag_config())
    assert not hasattr(model.transformer_blocks[0], "_diffusers_hook")


def test_cfg_as_two_calls_per_step_keeps_one_cache_state_per_branch():
    """A transformer patched alone inside a loop that runs guidance as two calls per step (cond, then uncond at the
    same timestep): each branch reuses against its own history, exactly as if it ran alone."""
    model = testing.tiny_sana_video_transformer()
    inputs = testing.sana_video_transformer_inputs(model)
    branches = {"cond": inputs["encoder_hidden_states"], "uncond": torch.zeros_like(inputs["encoder_hidden_states"])}
    quiet_apply(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1, cache_max_reuse=3)

    def run(names):
        out = {name: [] for name in names}
        with torch.no_grad(), accelpatch.quality("high"):
            for step in range(6):
                timestep = torch.full_like(inputs["timestep"], 900.0 - 150.0 * step)
                latents = inputs["hidden_states"] * (1.0 - 0.1 * step)
                for name in names:
                    sample = model(hidden_states=latents, encoder_hidden_states=branches[name],
                                   timestep=timestep).sample
                    out[name].append(sample)
        return out

    try:
        together = run(["cond", "uncond"])
        assert accelpatch.report(model, reset=True).models[0].cache["reused"] > 0
        for name in ("cond", "uncond"):
            alone = run([name])[name]
            assert all(torch.equal(a, b) for a, b in zip(together[name], alone)), name
    finally:
        accelpatch.remove(model)


def test_a_recipe_and_a_validate_candidate_can_carry_the_cache():
    model = testing.tiny_minimax_h3_transformer()
    recipe = {"name": "cached", "model": "tiny:minimax-h3", "dtype": "fp32", "device": "cpu", "backend": "sol_attn",
              "options": {"cache": "first_block", "cache_threshold": 0.2, "cache_max_reuse": 1}}
    accelpatch.apply(model, recipe=recipe)
    try:
        cache = accelpatch.report(model).models[0].cache
        assert cache["method"] == "first_block(threshold=0.2, warmup_steps=2, max_reuse=1, final_steps=1)"
    finally:
        accelpatch.remove(model)
    pipe = testing.tiny_sana_video_pipeline()
    kwargs = call(steps=6)
    kwargs.pop("generator")
    cached = {"name": "fbc", "tier": "high", "options": {"cache": "first_block", "cache_threshold": 1e9,
                                                          "cache_warmup_steps": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = accelpatch.validate(pipe, kwargs, ["lossless", cached], progress=False)
    lossless, fbc = report.candidates
    assert lossless.identical and not fbc.identical  # the cache really ran under high, and only there
    assert fbc.fast_by_kind["step_cache (calls reused)"] > 0
    # lossless: no reuse and no high path, only the bit-exact fusions on both blocks of each of its 6 transformer
    # calls (float32: GLUMB's bf16 chains stay on the reference)
    assert lossless.fast_by_kind == {"sana_video_fused_block": 2 * 6, "sana_video_fused_linear_attention": 2 * 6}


def test_under_torch_compile_the_cache_stays_correct_and_says_it_did_not_reuse():
    """Compiled (not fullgraph), the transformer's hooks cannot read the step inside the compiled region, so every
    call is a new generation: nothing is reused, the output is the model's own, and report() says why."""
    model = testing.tiny_sana_video_transformer()
    inputs = testing.sana_video_transformer_inputs(model)

    def loop(module):
        with torch.no_grad():
            return [module(hidden_states=inputs["hidden_states"] * (1 - 0.1 * step),
                           encoder_hidden_states=inputs["encoder_hidden_states"],
                           timestep=torch.full_like(inputs["timestep"], 900.0 - 150.0 * step)).sample
                    for step in range(4)]

    reference = loop(model)
    quiet_apply(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=0)
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")
        with accelpatch.quality("high"):
            outputs = loop(compiled)
        assert all(torch.equal(a, b) for a, b in zip(outputs, reference))
        cache = accelpatch.report(model).models[0].cache
        assert cache["reused"] == 0 and cache["reasons"] == {"first step of the call": 4}
    finally:
        accelpatch.remove(model)
        torch._dynamo.reset()


def mag_config(**overrides):
    from diffusers import MagCacheConfig

    # ratios of 1: MagCache's accumulated error stays 0, so it skips whenever it and the guards allow
    return MagCacheConfig(**{"mag_ratios": [1.0] * STEPS, "num_inference_steps": STEPS, "retention_ratio": 0.0,
                             "max_skip_steps": 2, **overrides})


def test_mag_cache_is_gated_the_same_way(sana):
    pipe, reference = sana
    quiet_apply(pipe, cache=mag_config(), cache_warmup_steps=2, cache_final_steps=1)
    head, tail = pipe.transformer.transformer_blocks
    runs = Executions([tail], "attn1")
    per_step = []
    step_hook = pipe.transformer.register_forward_hook(lambda m, a, o: per_step.append(runs.take()[0]))
    try:
        assert torch.equal(pipe(**call()).frames, reference)  # lossless: MagCache never skips
        assert per_step == [1] * STEPS
        per_step.clear()
        accelpatch.report(pipe, reset=True)
        with accelpatch.quality("high"):
            first = pipe(**call()).frames
            assert per_step == [1, 1, 0, 0, 1, 0, 0, 1]  # warm-up 2, reuse 2 in a row, final step computes
            assert torch.equal(pipe(**call()).frames, first)  # the next call starts clean
        cache = accelpatch.report(pipe).models[0].cache
        assert cache["method"].startswith("mag(") and (cache["computed"], cache["reused"]) == (8, 8)
        assert not torch.equal(first, reference)
    finally:
        step_hook.remove()
        runs.close()
        accelpatch.remove(pipe)
    assert not any(hasattr(b, "_diffusers_hook") for b in (head, tail))
    assert torch.equal(pipe(**call()).frames, reference)


def test_mag_cache_needs_calibrated_ratios():
    with pytest.raises(ValueError, match="cache='mag' needs magnitude ratios calibrated .*MagCacheConfig\\(calibrate=True"):
        accelpatch.apply(testing.tiny_sana_video_transformer(), cache="mag")


def test_sana_video2_caches_at_the_model_level_through_its_pipeline():
    """SANA-Video 2.0's blocks feed Block Attention Residuals, so its cache is the model's own hook point: after the
    first block, reuse the remaining blocks' cached contribution. Same gate, guards and counts."""
    pipe = testing.tiny_sana_video2_pipeline()
    kwargs = lambda: testing.sana_video2_pipeline_call_kwargs(num_inference_steps=6)  # noqa: E731
    reference = pipe(**kwargs()).frames
    runs = Executions(list(pipe.transformer.blocks), "cross_attn")
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1, cache_final_steps=1)
    try:
        runs.take()
        assert torch.equal(pipe(**kwargs()).frames, reference)  # lossless: every block runs
        assert runs.take() == [6, 6, 6, 6]
        with accelpatch.quality("high"):
            first = pipe(**kwargs()).frames
            executed = runs.take()
            assert torch.equal(pipe(**kwargs()).frames, first)  # each call starts clean
        # step 0 computes (warm-up, first), 1-2 reuse, 3 computes (limit 2), 4 reuses, 5 is the final step
        assert executed == [6, 3, 3, 3]  # the first block always runs
        assert not torch.equal(first, reference)
        cache = accelpatch.report(pipe).models[0].cache
        assert (cache["computed"], cache["reused"]) == (6 + 2 * 3, 2 * 3)
    finally:
        runs.close()
        accelpatch.remove(pipe)
    assert "_remaining_blocks_cache" not in pipe.transformer.__dict__
    assert torch.equal(pipe(**kwargs()).frames, reference)


def test_a_cached_model_survives_deepcopy_and_pickle_into_another_process(tmp_path):
    """The copy runs its own hooks and state (counted on its own), for FirstBlockCache and MagCache; a pickle made
    here runs in a fresh Python process and gives the same output."""
    import copy
    import pickle
    import subprocess
    import sys

    for cache in ("first_block", mag_config()):
        model = testing.tiny_sana_video_transformer()
        inputs = testing.sana_video_transformer_inputs(model)
        quiet_apply(model, cache=cache)
        clone = copy.deepcopy(model)
        with torch.no_grad():
            assert torch.equal(clone(**inputs).sample, model(**inputs).sample)
        assert accelpatch.report(clone).models[0].cache["computed"] == 1
        assert accelpatch.report(model).models[0].cache["computed"] == 1
        accelpatch.remove(clone)
        assert not any(hasattr(b, "_diffusers_hook") or "forward" in b.__dict__ for b in clone.transformer_blocks)
        path = tmp_path / "model.pt"
        accelpatch.report(model, reset=True)  # counters travel with a pickle: start the other process from zero
        path.write_bytes(pickle.dumps((model, inputs)))
        with torch.no_grad():
            expected = model(**inputs).sample
        # the same thread count as here: float32 GEMMs sum in another order on another count (pytest run without
        # the Makefile's OMP_NUM_THREADS=1 gave the other process 2 threads and 5e-7 of difference)
        probe = (f"import pickle, torch, sys; torch.set_num_threads({torch.get_num_threads()}); "
                 f"model, inputs = pickle.loads(open({str(path)!r}, 'rb').read()); "
                 "import accelpatch\n"
                 "with torch.no_grad(): out = model(**inputs).sample\n"
                 "cache = accelpatch.report(model).models[0].cache\n"
                 "accelpatch.remove(model)\n"
                 f"torch.save((out, cache), {str(tmp_path / 'out.pt')!r})")
        subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, timeout=300)
        out, counted = torch.load(tmp_path / "out.pt")
        assert torch.equal(out, expected) and counted["computed"] == 1
        accelpatch.remove(model)


def test_states_are_freed_after_the_final_step_and_bounded_without_a_pipeline(sana):
    pipe, _ = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            pipe(**call())
        assert step_cache_of(pipe.transformer._accelpatch_state).states.live_generations == 0  # freed at step 7
    finally:
        accelpatch.remove(pipe)
    # a transformer patched alone has no scheduler: no final step is known, so finished calls' states stay until
    # the same thread's next call, bounded for threads that never come back; the report says the guard is off
    from accelpatch.step_cache.states import MAX_LIVE_GENERATIONS

    model = testing.tiny_sana_video_transformer()
    inputs = testing.sana_video_transformer_inputs(model)
    quiet_apply(model, cache="first_block")

    def one_call():
        with torch.no_grad():
            model(**inputs)

    try:
        for _ in range(MAX_LIVE_GENERATIONS + 4):
            thread = threading.Thread(target=one_call)
            thread.start()
            thread.join()
        assert step_cache_of(model._accelpatch_state).states.live_generations <= MAX_LIVE_GENERATIONS
        assert "final-step guard off: no pipeline scheduler" in str(accelpatch.report(model))
    finally:
        accelpatch.remove(model)


def test_blocks_compiled_one_by_one_keep_the_cache_reusing_as_in_eager():
    """Regional compilation (each block compiled, not fullgraph): the model's hooks run eagerly, so steps are known
    and the cache reuses exactly as in eager mode; its decision is a graph break inside the block."""
    model = testing.tiny_sana_video_transformer()
    inputs = testing.sana_video_transformer_inputs(model)

    def loop():
        with torch.no_grad(), accelpatch.quality("high"):
            return [model(hidden_states=inputs["hidden_states"] * (1 - 0.1 * step),
                          encoder_hidden_states=inputs["encoder_hidden_states"],
                          timestep=torch.full_like(inputs["timestep"], 900.0 - 150.0 * step)).sample
                    for step in range(5)]

    quiet_apply(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        eager = loop()
        counted = accelpatch.report(model, reset=True).models[0].cache
        torch._dynamo.reset()
        for block in model.transformer_blocks:
            block.compile(backend="eager")
        compiled = loop()
        assert all(torch.equal(a, b) for a, b in zip(compiled, eager))
        again = accelpatch.report(model).models[0].cache
        assert (again["computed"], again["reused"]) == (counted["computed"], counted["reused"]) and again["reused"] > 0
    finally:
        accelpatch.remove(model)
        torch._dynamo.reset()


def test_reuse_is_a_fast_path_that_ran(sana):
    """A step-cache reuse is a fast path that ran: report().assert_fast_path_ran() once raised "no accelpatch fast
    path ran" with half the calls reused (on CPU SANA-Video's high site cannot mount; the site counts are zeroed
    below so that the lossless fused paths, which also ran, do not answer for the reuse)."""
    import dataclasses

    pipe, _ = sana
    quiet_apply(pipe, cache=FirstBlockCacheConfig(threshold=1e9))
    try:
        with accelpatch.quality("exact"):
            pipe(**call())
        with pytest.raises(AssertionError, match="no accelpatch fast path ran"):
            accelpatch.report(pipe, reset=True).assert_fast_path_ran()
        with accelpatch.quality("high"):
            pipe(**call())
        report = accelpatch.report(pipe)
        assert sum(s.fast_calls for s in report.sites if s.tier == "high") == 0 and report.reused_calls > 0
        (model,) = report.models
        sites = tuple(dataclasses.replace(s, fast_calls=0) for s in model.sites)
        reuse_only = dataclasses.replace(report, models=(dataclasses.replace(model, sites=sites),))
        assert reuse_only.fast_calls == 0
        reuse_only.assert_fast_path_ran()
    finally:
        accelpatch.remove(pipe)
