"""The shipped trained tiny pipelines (issue #43, part 1).

They load from the installed package with diffusers' own ``from_pretrained``, and they learned: the videos they
generate show the prompt's colour, read from the frames alone by
:mod:`accelpatch.tiny_models.detect` (whose readings ``tests/test_tiny_models.py`` checks against the renderer's
ground truth), and they are measurably more coherent in time than a random-weight model of the same shape; and
validate's gates see an aggressive fast path on them that they cannot see on random weights (the point of issue
#43). Not learned yet, so not claimed: the direction of motion (the shipped Wan moves its shape, in no particular
direction; docs/tiny-models.md has the measurement).
"""
import json

import pytest
import torch

from accelpatch import testing
from accelpatch.eval.temporal_metrics import flicker_score
from accelpatch.tiny_models.detect import from_pipeline_frames, read_shape_video
from accelpatch.tiny_models.shipped import WEIGHTS_DIR, shipped_families, shipped_folder, trained_call_kwargs

#: every colour with every direction, each call its own seed
PROMPTS = [(colour, direction) for colour in ("red", "green", "blue", "yellow")
           for direction in ("left", "right", "up", "down")]
STEPS = 8


def _generate(pipe, family: str = "wan") -> list[torch.Tensor]:
    videos = []
    for seed, (colour, direction) in enumerate(PROMPTS):
        kwargs = trained_call_kwargs(family, f"a {colour} square moves {direction}", num_inference_steps=STEPS,
                                     seed=seed)
        with torch.no_grad():
            videos.append(from_pipeline_frames(pipe(**kwargs).frames))
    return videos


@pytest.fixture(scope="module")
def trained_videos():
    return _generate(testing.tiny_wan_pipeline(trained=True))


@pytest.fixture(scope="module")
def random_videos():
    """The same pipeline (tokenizer, architecture, training size) with the untrained weights training starts from."""
    from accelpatch.tiny_models.train import build_wan_pipeline

    pipe = build_wan_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    return _generate(pipe)


def test_the_trained_wan_ships_in_the_package_and_loads_with_diffusers():
    from diffusers import WanPipeline
    from safetensors import safe_open

    assert "wan" in shipped_families() and shipped_folder("wan") == WEIGHTS_DIR / "wan"
    pipe = testing.tiny_wan_pipeline(trained=True)
    assert isinstance(pipe, WanPipeline) and pipe.transformer.dtype == torch.float32
    again = WanPipeline.from_pretrained(shipped_folder("wan"), dtype=torch.float32)  # diffusers' own loader
    for name, tensor in pipe.transformer.state_dict().items():
        assert torch.equal(tensor, again.transformer.state_dict()[name]), name
    with safe_open(str(shipped_folder("wan") / "transformer" / "diffusion_pytorch_model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # stored in half precision
    # the shape the Sol-Attn tests use (2 heads x 128), written out in the trainer, which accelpatch.testing stands on
    from accelpatch.testing.wan import WAN_SOL_CONFIG
    from accelpatch.tiny_models.train import WAN_TRANSFORMER_CONFIG

    assert WAN_TRANSFORMER_CONFIG == WAN_SOL_CONFIG
    assert {k: pipe.transformer.config[k] for k in WAN_SOL_CONFIG} == {**WAN_SOL_CONFIG, "patch_size": [1, 2, 2]}
    record = json.loads((shipped_folder("wan") / "training.json").read_text())
    assert record["family"] == "wan" and not record["vae_check"]["problems"]
    size = sum(p.stat().st_size for p in shipped_folder("wan").rglob("*") if p.is_file())
    assert size < 8 * 2 ** 20, size


def test_trained_refuses_the_options_that_build_random_weights_and_other_families_say_what_ships():
    with pytest.raises(ValueError, match="two_transformers build random components"):
        testing.tiny_wan_pipeline(trained=True, two_transformers=True)
    with pytest.raises(ValueError, match=r"no trained tiny 'ltx2' pipeline ships with accelpatch \(trained: wan"):
        shipped_folder("ltx2")


def test_the_trained_wan_shows_the_prompts_colour(trained_videos):
    readings = [read_shape_video(v) for v in trained_videos]
    right = [r.colour == colour for r, (colour, _) in zip(readings, PROMPTS)]
    assert sum(right) >= 12, list(zip(PROMPTS, readings))  # measured 15 of 16; chance is 4


def test_a_random_weight_model_of_the_same_shape_shows_no_prompts_colour(random_videos):
    readings = [read_shape_video(v) for v in random_videos]
    right = [r.colour == colour for r, (colour, _) in zip(readings, PROMPTS)]
    assert sum(right) <= 7, list(zip(PROMPTS, readings))  # measured 4 of 16, chance


def test_trained_videos_are_more_coherent_in_time_than_random_weights(trained_videos, random_videos):
    """VBench's temporal-flicker score (1 at a still video, lower as frames change; the metric validate gates) of
    the trained model's videos against the random-weight model's, video by video."""
    def mean_flicker(video):  # (3, F, H, W) in [-1, 1] -> (F, 3, H, W), the metric's layout
        (score,) = flicker_score(video.transpose(0, 1), data_range=2.0)
        return score

    trained = [mean_flicker(v) for v in trained_videos]
    random = [mean_flicker(v) for v in random_videos]
    assert min(trained) > max(random), (trained, random)


AGGRESSIVE_SOL = dict(name="sol aggressive", backend="sol_attn",
                      options={"tau": 3.0, "dense_steps": 0, "dense_layers": "", "dense_last_steps": 0, "min_tokens": 0})


@pytest.mark.parametrize("weights", ["trained", "random"])
def test_the_gates_see_an_aggressive_sol_attn_on_the_trained_wan_and_not_on_random_weights(weights):
    """Sol-Attn at tau 3, every layer and step sparse: on the trained model validate fails it and names per-frame
    and temporal metrics; on random weights (noise in, noise out) the same setting passes every gate."""
    from accelpatch.eval.validate import validate
    from accelpatch.tiny_models.train import build_wan_pipeline

    if weights == "trained":
        pipe = testing.tiny_wan_pipeline(trained=True)
    else:
        pipe = build_wan_pipeline(seed=0)
        pipe.set_progress_bar_config(disable=True)
    kwargs = trained_call_kwargs("wan", "a red square moves right", num_inference_steps=STEPS)
    kwargs.pop("generator")
    report = validate(pipe, kwargs, [AGGRESSIVE_SOL], seeds=[0], progress=False)
    text = str(report)
    (candidate,) = report.candidates
    assert candidate.passed is (weights == "random"), text
    if weights == "trained":
        assert not report.passed, text
        assert "below the floors" in text and "motion ratio" in text and "outside [0.8, 1.25]" in text, text
    else:
        assert report.passed and "below the floors" not in text, text
