"""The gates on the shipped trained tiny models (issue #43, part 3): they discriminate there, and not on random
weights. Run as a user runs them, from the ``trained-*`` recipes; docs/tiny-models.md has the measurements."""
import re

import pytest

from accelpatch import testing
from accelpatch.tiny_models.shipped import trained_call_kwargs

STEPS = 8


#: (recipe, its trained family, what validate must name when the recipe's aggressive candidate fails)
GATE_RECIPES = [
    ("trained-wan-sol-attn", "wan", ("below the floors", "motion ratio", "outside [0.8, 1.25]")),
    ("trained-sana-video-step-cache", "sana-video", ("below the floors", "outside [0.8, 1.25]", "flickers more")),
    ("trained-sana-video2-sol-attn", "sana-video2", ("below the floors",)),
]


@pytest.mark.parametrize("name, family, named", GATE_RECIPES, ids=[r[0] for r in GATE_RECIPES])
def test_each_trained_recipe_passes_its_default_setting_and_fails_its_aggressive_one(name, family, named):
    """Issue #43 part 3, run as a user runs it (``validate --recipe``): on the trained model the recipe's default
    setting (Wan: Sol-Attn with three of its four layers dense; SANA-Video: the step cache's defaults; SANA-Video
    2.0: Sol-Attn on its anchor) passes its gates and the aggressive setting (Wan: Sol-Attn tau 3, every layer and
    step sparse;
    SANA-Video: a step cache reusing most steps; SANA-Video 2.0: Sol-Attn tau 3 on its anchor at every step) fails,
    naming the per-frame and temporal metrics that failed."""
    from accelpatch.eval.pipelines import load_pipeline
    from accelpatch.eval.validate import validate
    from accelpatch.recipes import load_recipe

    recipe = load_recipe(name)
    assert recipe.model == f"trained:{family}"
    loaded = load_pipeline(recipe)
    report = validate(loaded.pipe, loaded.call_kwargs, recipe.candidate_specs(), reference=recipe.reference,
                      seeds=recipe.seeds, gates=recipe.gates, progress=False)
    text = str(report)
    default, aggressive = report.candidates
    assert default.passed and not aggressive.passed and not report.passed, text
    assert all(words in text for words in named), text


@pytest.mark.parametrize("name, family, named", GATE_RECIPES, ids=[r[0] for r in GATE_RECIPES])
def test_on_random_weights_the_same_aggressive_setting_passes_every_gate(name, family, named):
    """The point of issue #43: the weights the trained model started from (noise in, noise out) let the same
    aggressive setting through, so gates calibrated on them measure nothing."""
    from accelpatch.eval.pipelines import load_pipeline
    from accelpatch.eval.validate import validate
    from accelpatch.recipes import load_recipe
    from accelpatch.tiny_models.train import untrained_pipeline

    recipe = load_recipe(name)
    call_kwargs = load_pipeline(recipe).call_kwargs  # the recipe's call, as the trained run makes it
    aggressive = recipe.candidate_specs()[1:]
    report = validate(untrained_pipeline(family, seed=0), call_kwargs, aggressive, reference=recipe.reference,
                      seeds=recipe.seeds, gates=recipe.gates, progress=False)
    assert report.passed and "below the floors" not in str(report), str(report)


def test_the_drift_gate_sees_a_step_cache_that_the_per_frame_floors_let_through_on_the_trained_sana_video():
    """Threshold 0.3 reuses 3 of 8 steps: every frame stays above the SSIM/PSNR floors, but the error grows along
    the clip, and only the PSNR-drift gate (issue #43 part 2) fails it (measured: drift 8.35 dB > 6 on seed 0)."""
    from accelpatch.eval.validate import validate

    kwargs = trained_call_kwargs("sana-video", "a red square moves right", num_inference_steps=STEPS)
    kwargs.pop("generator")
    candidate = dict(name="cache 0.3", tier="high", options={"cache": "first_block", "cache_threshold": 0.3})
    report = validate(testing.tiny_sana_video_pipeline(trained=True), kwargs, [candidate], seeds=[0], progress=False)
    text = str(report)
    assert not report.passed and "below the floors" not in text, text
    assert re.search(r"PSNR drift: falls [\d.]+ dB from the first to the last quarter of the clip, more than 6\.0 dB",
                     text), text
