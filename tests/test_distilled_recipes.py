"""#42, part 2: the distilled recipes (a 4-8 step variant per family) run on the family's tiny model with the
recipe's scheduler configuration, step count, guidance and sigmas, and the recipe's tier/backend/options (sol_attn's
``min_tokens`` 0 and no dense layers: tiny sequences are short and tiny models have 2 layers). Each checks that the
scheduler is the recipe's, the transformer(s) ran the recipe's steps, sol_attn ran sparse after the dense steps
(the Sol-Attn op replaced by dense SDPA, as tests/test_step_policies.py does: the policy is tested, not the
kernel), and the output is finite. Also: the ``scheduler:`` and ``lora:`` schema and their loading."""
import math

import pytest
import torch
from _tiny_pipeline_checks import dense_kernel

import accelpatch
import accelpatch.sol_attn.op as sol_op
from accelpatch.eval.pipelines import apply_scheduler, load_loras, load_pipeline
from accelpatch.recipes import (RecipeError, load_recipe, scheduler_class, scheduler_overrides)
from accelpatch.sol_attn.config import DENSE_LAST_STEP, DENSE_STEP

#: call arguments that size or describe the release run; the tiny run keeps its own
SIZE_AND_PROMPT = {"prompt", "negative_prompt", "height", "width", "num_frames", "frames", "image", "frame_rate"}

#: recipe -> (tiny model, the tiny call's size, transformer calls per scheduler step count: MiniMax-H3 runs N-1)
DISTILLED = {
    "wan2.1-t2v-14b-lightx2v-4step": ("tiny:wan", {"height": 64, "width": 64, "num_frames": 5}, 0),
    "ltx2-distilled-8step": ("tiny:ltx2", {"height": 32, "width": 32, "num_frames": 3}, 0),
    "hunyuan-video15-step-distilled": ("tiny:hunyuan-video15", {"height": 32, "width": 32, "num_frames": 7}, 0),
    "minimax-h3-turbo-5step": ("tiny:minimax-h3", {"height": 32, "width": 32}, -1),
    "sana-video2-720p-4step": ("tiny:sana-video2", {}, 0),
}
WAN22 = "wan2.2-t2v-a14b-lightning-4step"


def _tiny_options(recipe) -> dict:
    if recipe.backend != "sol_attn":
        return dict(recipe.options)
    return {**recipe.options, "min_tokens": 0, "dense_layers": ""}


def _tiny_call(recipe, size: dict) -> dict:
    return {**{k: v for k, v in recipe.call.items() if k not in SIZE_AND_PROMPT}, **size}


def _count_calls(module, counter: list) -> None:
    module.register_forward_hook(lambda *_: counter.append(1))


def _check_scheduler(pipe, recipe) -> None:
    spec = recipe.scheduler
    if spec.get("class"):
        assert type(pipe.scheduler).__name__ == spec["class"]
    for key, value in scheduler_overrides(spec, type(pipe.scheduler)).items():
        got = pipe.scheduler.config[key]
        assert (list(got) if isinstance(got, (list, tuple)) else got) == value, (key, got, value)


def _expected_dense(recipe, total: int) -> dict[int, str]:
    first = math.ceil(recipe.options["dense_steps"] * total - 1e-9)
    dense = {i: DENSE_STEP for i in range(first)}
    dense.update({total - 1 - i: DENSE_LAST_STEP for i in range(recipe.options.get("dense_last_steps", 0))})
    return dense


def _check_sol_attn(model, recipe, total: int) -> None:
    report = accelpatch.report(model)
    sites = [s for s in report.sites if "sol_attn" in s.kind]
    assert sites and sum(s.fast_calls for s in sites) > 0, "no sparse call ran after the dense steps"
    steps = report.models[0].dense_steps
    assert steps["total"] == total
    assert {i: set(reasons) for i, reasons in steps["steps"].items()} == {
        i: {why} for i, why in _expected_dense(recipe, total).items()}


def _frames(output) -> torch.Tensor:
    frames = output if isinstance(output, torch.Tensor) else getattr(output, "frames", output)
    return frames[0] if isinstance(frames, (tuple, list)) else frames


@pytest.mark.parametrize("name", sorted(DISTILLED))
def test_a_distilled_recipe_runs_on_its_familys_tiny_model(name, monkeypatch):
    recipe = load_recipe(name)
    model, size, offset = DISTILLED[name]
    steps = recipe.call["num_inference_steps"]
    tiny = load_recipe({"name": f"tiny-{name}", "model": model, "dtype": "fp32", "device": "cpu",
                        "call": _tiny_call(recipe, size), "scheduler": recipe.scheduler, "tier": recipe.tier,
                        "backend": recipe.backend, "options": _tiny_options(recipe)})
    loaded = load_pipeline(tiny)
    pipe = loaded.pipe
    _check_scheduler(pipe, recipe)
    if "guidance_scale" in recipe.call and getattr(pipe, "guider", None) is not None:
        assert pipe.guider.guidance_scale == recipe.call["guidance_scale"]  # routed to the guider (HunyuanVideo 1.5)
    accelpatch.apply(pipe, **tiny.apply_arguments())
    monkeypatch.setattr(sol_op, "sol_attn", dense_kernel())
    calls: list = []
    _count_calls(pipe.transformer, calls)
    with torch.no_grad():
        out = pipe(**loaded.call_kwargs, generator=torch.Generator().manual_seed(0))
    assert len(calls) == steps + offset  # one call a step: CFG is off (MiniMax-H3: its last step is sigma 0)
    if "sigmas" in recipe.call:  # the fixed sigmas reach the sampler unshifted
        assert pipe.scheduler.sigmas[:steps].tolist() == pytest.approx(recipe.call["sigmas"], abs=1e-6)
    if recipe.backend == "sol_attn":
        _check_sol_attn(pipe.transformer, recipe, steps + offset)  # the step clock counts transformer steps
    frames = _frames(out)
    assert torch.is_tensor(frames) and torch.isfinite(frames).all()


def test_wan22_lightning_runs_2_plus_2_over_the_two_experts(monkeypatch):
    """Wan 2.2 A14B's boundary 0.875 with the recipe's schedule (timesteps 999, 937 | 833, 625): two steps on the
    high-noise expert, two on the low-noise one; the dense first step is the first expert's, the dense last the
    second's."""
    from accelpatch.testing import tiny_wan_pipeline, wan_pipeline_call_kwargs

    recipe = load_recipe(WAN22)
    pipe = tiny_wan_pipeline(two_transformers=True, boundary_ratio=0.875)
    apply_scheduler(pipe, recipe.scheduler)
    _check_scheduler(pipe, recipe)
    accelpatch.apply(pipe, tier=recipe.tier, backend=recipe.backend, **_tiny_options(recipe))
    monkeypatch.setattr(sol_op, "sol_attn", dense_kernel())
    high, low = [], []
    _count_calls(pipe.transformer, high)
    _count_calls(pipe.transformer_2, low)
    call = {**wan_pipeline_call_kwargs(recipe.call["num_inference_steps"], height=64, width=64, num_frames=5),
            **_tiny_call(recipe, {})}
    with torch.no_grad():
        frames = pipe(**call).frames
    assert pipe.scheduler.timesteps.tolist() == [999, 937, 833, 625]  # lightx2v's [1000, 937.5, 833.3, 625]
    assert (len(high), len(low)) == (2, 2)
    for model, dense in ((pipe.transformer, {0: {DENSE_STEP}}), (pipe.transformer_2, {3: {DENSE_LAST_STEP}})):
        report = accelpatch.report(model)
        assert sum(s.fast_calls for s in report.sites if "sol_attn" in s.kind) > 0
        assert {i: set(r) for i, r in report.models[0].dense_steps["steps"].items()} == dense
    assert torch.isfinite(frames).all()


def test_the_wan_schedulers_step_is_euler_at_lightx2vs_timesteps():
    """UniPC at order 1 without its corrector steps as flow-matching Euler, x + (sigma_next - sigma) * v."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    spec = load_recipe("wan2.1-t2v-14b-lightx2v-4step").scheduler
    cls = scheduler_class(spec["class"])
    scheduler = cls.from_config(FlowMatchEulerDiscreteScheduler(shift=3.0).config, **scheduler_overrides(spec, cls))
    scheduler.set_timesteps(4)
    sigmas = scheduler.sigmas
    assert sigmas[:4].tolist() == pytest.approx([1.0, 0.9375, 0.8333, 0.625], abs=2e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 3, 4, generator=g)
    euler = x.clone()
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(1, 2, 3, 4, generator=g)
        x = scheduler.step(v, t, x).prev_sample
        euler = euler + (sigmas[i + 1] - sigmas[i]) * v
    assert torch.allclose(x, euler, atol=1e-5)


# --- the schema: scheduler and lora ----------------------------------------------------------------------------

def _recipe(**fields):
    return load_recipe({"name": "r", "model": "tiny:wan", "dtype": "fp32", "device": "cpu", **fields})


def test_an_unknown_scheduler_class_is_refused_with_close_matches():
    with pytest.raises(RecipeError, match=r"unknown scheduler 'UniPCMultistepSchedular' \(did you mean "
                                          r"UniPCMultistepScheduler"):
        scheduler_class("UniPCMultistepSchedular")
    assert scheduler_class("SanaVideo2FewStepScheduler").__name__ == "SanaVideo2FewStepScheduler"


def test_a_scheduler_override_the_config_lacks_is_refused_naming_it():
    """diffusers' from_config drops keyword arguments the class does not take, without a word: the recipe refuses."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    silently = FlowMatchEulerDiscreteScheduler.from_config(FlowMatchEulerDiscreteScheduler().config, shfit=5.0)
    assert "shfit" not in silently.config and silently.config.shift == 1.0  # what the check is for
    recipe = _recipe(scheduler={"class": "FlowMatchEulerDiscreteScheduler", "shfit": 5.0})
    with pytest.raises(RecipeError, match=r"'shfit' \(did you mean 'shift'\?\) is not in "
                                          r"FlowMatchEulerDiscreteScheduler's config"):
        load_pipeline(recipe)


@pytest.mark.parametrize("scheduler, message", [
    ({}, "give a class and/or config overrides"),
    ({"class": 3}, "scheduler.class must be a scheduler class name"),
    ({"shift": object()}, "scheduler.shift: a config value is a number"),
])
def test_a_bad_scheduler_mapping_is_refused(scheduler, message):
    with pytest.raises(RecipeError, match=message):
        _recipe(scheduler=scheduler)


def test_a_bad_lora_entry_is_named_with_the_choices():
    with pytest.raises(RecipeError, match=r"lora\.0\.component: Input should be 'transformer' or 'transformer_2'"):
        _recipe(lora=[{"weights": "x", "component": "transformer_3"}])
    with pytest.raises(RecipeError, match=r"lora\.0\.weigths: unknown field \(did you mean 'weights'\?\)"):
        _recipe(lora=[{"weigths": "x"}])
    with pytest.raises(RecipeError, match="adapter names must be distinct"):
        _recipe(lora=[{"weights": "a", "adapter_name": "x"}, {"weights": "b", "adapter_name": "x"}])


def _write_lora(path, transformer, seed: int, rank: int = 4) -> str:
    """A small diffusers-format LoRA for the tiny Wan transformer's self-attention projections."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    state = {}
    for i, block in enumerate(transformer.blocks):
        for name in ("to_q", "to_k", "to_v"):
            linear = getattr(block.attn1, name)
            key = f"transformer.blocks.{i}.attn1.{name}"
            state[f"{key}.lora_A.weight"] = torch.randn(rank, linear.in_features, generator=g) * 0.1
            state[f"{key}.lora_B.weight"] = torch.randn(linear.out_features, rank, generator=g) * 0.1
    save_file(state, str(path))
    return str(path)


def test_a_lora_loads_changes_the_output_and_the_default_tier_keeps_its_bits(tmp_path):
    call = {"num_inference_steps": 2, "height": 64, "width": 64, "num_frames": 5, "guidance_scale": 1.0}
    plain = load_pipeline(_recipe(call=call))
    weights = _write_lora(tmp_path / "lora.safetensors", plain.pipe.transformer, seed=1)
    loaded = load_pipeline(_recipe(call=call, lora=[{"weights": weights, "adapter_name": "distill", "scale": 1.0}]))

    def run(pipe, kwargs):
        with torch.no_grad():
            return pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames

    assert "distill" in loaded.pipe.get_list_adapters()["transformer"]
    base, with_lora = run(plain.pipe, plain.call_kwargs), run(loaded.pipe, loaded.call_kwargs)
    assert not torch.equal(base, with_lora)
    accelpatch.apply(loaded.pipe)
    assert torch.equal(run(loaded.pipe, loaded.call_kwargs), with_lora)  # the default tier is bit-exact on top
    accelpatch.remove(loaded.pipe)


def test_wan22_loras_go_one_into_each_expert(tmp_path):
    from accelpatch.recipes import LoraSpec
    from accelpatch.testing import tiny_wan_pipeline

    pipe = tiny_wan_pipeline(two_transformers=True, boundary_ratio=0.875)
    high = _write_lora(tmp_path / "high.safetensors", pipe.transformer, seed=1)
    low = _write_lora(tmp_path / "low.safetensors", pipe.transformer_2, seed=2)
    load_loras(pipe, [LoraSpec(weights=high, adapter_name="lightning"),
                      LoraSpec(weights=low, adapter_name="lightning_2", component="transformer_2", scale=0.5)])
    adapters = pipe.get_list_adapters()
    assert adapters["transformer"] == ["lightning"] and adapters["transformer_2"] == ["lightning_2"]
    with pytest.raises(RecipeError, match="has no transformer_2"):
        load_loras(tiny_wan_pipeline(), [LoraSpec(weights=low, component="transformer_2")])
