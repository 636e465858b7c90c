"""#42, part 2: the step cache on Wan 2.2's two experts. ``transformer`` (high noise) runs the steps before the
boundary, ``transformer_2`` (low noise) the steps after it, each with its own StepCache. Both read the call's step
numbers (0..N-1) from the pipeline's scheduler: the final-step guard guards the call's last steps (on the low-noise
expert), the warm-up counts from each expert's first step of the call, and the high-noise expert's cached residuals
are freed as soon as the low-noise expert takes over (it never runs the call's final step). Every call starts clean,
also after one interrupted from a callback."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core import steps
from accelpatch.step_cache.feature import step_cache_of
from accelpatch.testing import tiny_wan_pipeline, wan_pipeline_call_kwargs

EXPERTS = ("transformer", "transformer_2")
#: boundary timestep 700: of 8 steps (timesteps 1000, 948, 883, 801 | 694, 548, 338, 9) 4 + 4, of 4 steps
#: (1000, 858 | 602, 9) 2 + 2, as Wan 2.2 Lightning runs them
BOUNDARY_RATIO = 0.7
FIRST = "first step of this expert in the call"
FINAL = "final step (last cache_final_steps={})"


def warmup_reason(warmup):
    return f"warm-up step of this expert (its first cache_warmup_steps={warmup} steps of the call)"


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    pipe = tiny_wan_pipeline(two_transformers=True, boundary_ratio=BOUNDARY_RATIO)
    yield pipe
    accelpatch.remove(pipe)


def call(steps_=8, seed=0, guidance_scale=1.0, **extra):
    return dict(wan_pipeline_call_kwargs(num_inference_steps=steps_, height=64, width=64, num_frames=5,
                                         guidance_scale=guidance_scale, seed=seed), **extra)


def apply_cache(pipe, cache="first_block", **options):
    options = {"cache_threshold": 1e9, "cache_max_reuse": 100, "cache_final_steps": 1, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(pipe, cache=cache, **options)
    return [step_cache_of(getattr(pipe, name)._accelpatch_state) for name in EXPERTS]


class StepsRun:
    """Per expert, the call's steps whose remaining blocks ran ("computed") and those that reused the cache: the
    last block's attention runs only when the step computes (a reused block's __call__ still happens, its body not)."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.calls = {name: [] for name in EXPERTS}
        self._ran = False
        self.handles = []
        for name in EXPERTS:
            model = getattr(pipe, name)
            self.handles.append(model.blocks[-1].attn1.register_forward_hook(self._tail_ran))
            self.handles.append(model.register_forward_hook(self._model_ran(name)))

    def _tail_ran(self, module, args, output):
        self._ran = True

    def _model_ran(self, name):
        def hook(module, args, output):
            self.calls[name].append((steps.scheduler_step(self.pipe.scheduler), self._ran))
            self._ran = False
        return hook

    def take(self) -> dict:
        """{expert: (computed steps, reused steps)} since the last take (each step once per CFG branch)."""
        out = {name: ([s for s, ran in calls if ran], [s for s, ran in calls if not ran])
               for name, calls in self.calls.items()}
        self.calls = {name: [] for name in EXPERTS}
        return out

    def close(self):
        for handle in self.handles:
            handle.remove()


def caches_of(pipe, reset=True):
    report = accelpatch.report(pipe, reset=reset)
    assert [m.model_class for m in report.models] == ["WanTransformer3DModel"] * 2
    return [m.cache for m in report.models]


def live_tensors(cache):
    """The tensors a StepCache's states hold (cached residuals and head-block outputs), over every generation."""
    with cache.states._lock:
        states = list(cache.states._states.values())
    return [v for state in states for v in vars(state).values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("warmup", [2, 0.25, "25%"])
def test_each_expert_warms_up_on_its_own_share_and_the_final_step_is_the_calls(pipe, warmup):
    """8 steps split 4 + 4, warm-up 2 (0.25 of 8 is 2 too): transformer computes 0, 1 and reuses 2, 3; transformer_2
    computes 4, 5 (its own warm-up), reuses 6 and computes 7, the call's final step. Both count the call's steps, read
    from the pipeline's scheduler."""
    apply_cache(pipe, cache_warmup_steps=warmup)
    shown = str(warmup) if not isinstance(warmup, float) else f"{warmup * 100:g}%"
    runs = StepsRun(pipe)
    try:
        with accelpatch.quality("high"):
            pipe(**call(8))
        assert runs.take() == {"transformer": ([0, 1], [2, 3]), "transformer_2": ([4, 5, 7], [6])}
        for model in (pipe.transformer, pipe.transformer_2):
            assert accelpatch.report(model).models[0].step_sources == {"pipeline scheduler": 4}
        text = str(accelpatch.report(pipe))  # per model: transformer's line, then transformer_2's
        high_line, low_line = "2 calls computed every block, 2 reused", "3 calls computed every block, 1 reused"
        assert high_line in text and low_line in text and text.index(high_line) < text.index(low_line)
        high, low = caches_of(pipe)
        assert (high["computed"], high["reused"], low["computed"], low["reused"]) == (2, 2, 3, 1)
        assert high["reasons"] == {FIRST: 1, warmup_reason(shown): 1}
        assert low["reasons"] == {FIRST: 1, warmup_reason(shown): 1, FINAL.format(1): 1}
    finally:
        runs.close()
        accelpatch.remove(pipe)


def test_calls_of_4_and_8_steps_each_split_the_guards_at_their_own_boundary(pipe):
    """Lightning's 4 = 2 + 2 steps with warm-up 1 and the last 2 steps final: transformer computes 0 and reuses 1,
    transformer_2 computes 2 and 3 (first and final); then 8 = 4 + 4 steps on the same pipeline: transformer_2's share
    now starts at step 4 (a new call, although its last step was 3) and its final steps are 6 and 7; then 4 again."""
    apply_cache(pipe, cache_warmup_steps=1, cache_final_steps=2)
    runs = StepsRun(pipe)
    try:
        with accelpatch.quality("high"):
            for _ in range(2):
                pipe(**call(4))
                assert runs.take() == {"transformer": ([0], [1]), "transformer_2": ([2, 3], [])}
                high, low = caches_of(pipe)
                assert high["reasons"] == {FIRST: 1} and high["reused"] == 1
                assert low["reasons"] == {FIRST: 1, FINAL.format(2): 1} and low["reused"] == 0
                pipe(**call(8))
                assert runs.take() == {"transformer": ([0], [1, 2, 3]), "transformer_2": ([4, 6, 7], [5])}
                high, low = caches_of(pipe)
                assert high["reasons"] == {FIRST: 1} and high["reused"] == 3
                assert low["reasons"] == {FIRST: 1, FINAL.format(2): 2} and low["reused"] == 1
    finally:
        runs.close()
        accelpatch.remove(pipe)


def test_with_cfg_as_two_calls_each_branch_of_each_expert_follows_the_same_guards(pipe):
    """guidance_scale > 1: two calls a step (cond, uncond), one state per branch and expert, each on the same steps."""
    apply_cache(pipe, cache_warmup_steps=2)
    runs = StepsRun(pipe)
    try:
        with accelpatch.quality("high"):
            first = pipe(**call(8, guidance_scale=5.0)).frames
            assert runs.take() == {"transformer": ([0, 0, 1, 1], [2, 2, 3, 3]),
                                   "transformer_2": ([4, 4, 5, 5, 7, 7], [6, 6])}
            high, low = caches_of(pipe)
            assert high["reasons"] == {FIRST: 2, warmup_reason(2): 2}
            assert low["reasons"] == {FIRST: 2, warmup_reason(2): 2, FINAL.format(1): 2}
            assert torch.equal(pipe(**call(8, guidance_scale=5.0)).frames, first)
    finally:
        runs.close()
        accelpatch.remove(pipe)


def test_the_high_noise_experts_residuals_are_freed_once_the_low_noise_expert_takes_over(pipe, monkeypatch):
    """transformer never runs the call's final step: its cached residuals go when transformer_2 runs its first step,
    not at transformer's next call. diffusers' own end-of-call reset (maybe_free_model_hooks) is off here, so what
    frees them is the step cache's; a second call then starts clean (the same output)."""
    high, low = apply_cache(pipe, cache_warmup_steps=1)
    seen = []

    def inspect_states(pipeline, step, timestep, callback_kwargs):
        seen.append((step, high.states.live_generations, len(live_tensors(high)),
                     low.states.live_generations, len(live_tensors(low))))
        return callback_kwargs

    try:
        with accelpatch.quality("high"):
            with_reset = pipe(**call(8)).frames
            for name in EXPERTS:
                monkeypatch.setattr(getattr(pipe, name), "_reset_stateful_cache", lambda recurse=True: None)
            first = pipe(**call(8), callback_on_step_end=inspect_states).frames
            steps_0_to_3, steps_4_to_7 = seen[:4], seen[4:]
            assert all(high_gens == 1 and high_tensors > 0 for _, high_gens, high_tensors, _, _ in steps_0_to_3)
            assert all(high_gens == 0 and high_tensors == 0 for _, high_gens, high_tensors, _, _ in steps_4_to_7)
            assert [low_gens for *_, low_gens, _ in steps_4_to_7] == [1, 1, 1, 0]  # the final step frees its own
            assert live_tensors(high) == [] and live_tensors(low) == []
            assert high.states.live_generations == low.states.live_generations == 0
            second = pipe(**call(8)).frames
            assert torch.equal(first, second) and torch.equal(first, with_reset)
            high_counts, low_counts = caches_of(pipe)
            assert high_counts["reused"] == 3 * 3 and low_counts["reused"] == 2 * 3  # every call reused the same
    finally:
        accelpatch.remove(pipe)


class Stop(Exception):
    pass


@pytest.mark.parametrize("stop_at", [2, 4, 5])
@pytest.mark.parametrize("error", [KeyboardInterrupt, Stop])
def test_a_call_after_an_interrupted_one_matches_a_clean_call(pipe, stop_at, error):
    """A call stopped from a callback (the high-noise expert mid-share, the low-noise expert right after its first
    step, or mid-share) on another seed, then a full call: bit-identical to a clean call. No warm-up, so only a clean
    state keeps a step from reusing the stopped call's residuals (stopped at step 4, transformer_2's next call is
    again at step 4: the same step, but another pipeline call)."""
    apply_cache(pipe, cache_warmup_steps=0)
    high, low = (step_cache_of(getattr(pipe, name)._accelpatch_state) for name in EXPERTS)

    def stop(pipeline, step, timestep, callback_kwargs):
        if step == stop_at:
            raise error
        return callback_kwargs

    try:
        with accelpatch.quality("high"):
            clean = pipe(**call(8)).frames
            caches_of(pipe)
            with pytest.raises(error):
                pipe(**call(8, seed=1), callback_on_step_end=stop)
            assert high.states.live_generations == (1 if stop_at < 4 else 0)  # freed once transformer_2 took over
            caches_of(pipe)
            assert torch.equal(pipe(**call(8)).frames, clean)
            high_counts, low_counts = caches_of(pipe)
            assert high_counts["reasons"] == {FIRST: 1} and high_counts["reused"] == 3
            assert low_counts["reasons"] == {FIRST: 1, FINAL.format(1): 1} and low_counts["reused"] == 2
    finally:
        accelpatch.remove(pipe)


def test_mag_cache_reads_each_experts_steps_in_the_calls_ratios(pipe):
    """diffusers' MagCache counts a state's calls from 0; here transformer_2's state starts at the call's step 4, so it
    reads ratios 4-7 of the call's 8 (here: 1.0 up to step 5, then a jump at step 6 that forces a computed step),
    not ratios 0-3."""
    from diffusers import MagCacheConfig

    ratios = [1.0] * 6 + [100.0, 1.0]
    apply_cache(pipe, cache=MagCacheConfig(mag_ratios=ratios, num_inference_steps=8, max_skip_steps=100,
                                           retention_ratio=0.2), cache_threshold=0.5, cache_warmup_steps=0)
    runs = StepsRun(pipe)
    try:
        with accelpatch.quality("high"):
            pipe(**call(8))
        # retention 0.2 of 8: steps 0-1 compute; transformer_2: 4 first, 5 reused, 6 the ratio jump, 7 final
        assert runs.take() == {"transformer": ([0, 1], [2, 3]), "transformer_2": ([4, 6, 7], [5])}
    finally:
        runs.close()
        accelpatch.remove(pipe)
