"""The single-prediction readings of :mod:`accelpatch.tiny_models.diagnose` (issue #43): they tell a transformer
that places its prediction in time, and is steered by the direction word, from one that is not, on the shipped Wan
(which draws the prompt's direction) against its untrained weights, and they are exact where they must be."""
import pytest

from accelpatch.tiny_models import diagnose
from accelpatch.tiny_models.shipped import trained_pipeline
from accelpatch.tiny_models.train import untrained_pipeline

LEFT, RIGHT, BLUE = "a red square moves left", "a red square moves right", "a blue square moves left"


@pytest.fixture(scope="module")
def wan():
    return trained_pipeline("wan")


def test_the_trained_wan_knows_which_frame_a_token_is_in_and_its_random_weights_do_not(wan):
    # measured 2026-12-07 (AMX Xeon): trained 1.055, random 0.003 (RoPE alone gives relative positions only)
    assert diagnose.frame_order_error(wan, "wan") > 0.5
    assert diagnose.frame_order_error(untrained_pipeline("wan", seed=0), "wan") < 0.05


def test_a_prompt_has_no_effect_on_itself_and_the_trained_wans_direction_word_steers_the_first_step(wan):
    assert diagnose.prompt_effect(wan, "wan", LEFT, LEFT) == 0.0  # the same rows, the same noise: exactly equal
    direction, colour = diagnose.prompt_effect(wan, "wan", LEFT, RIGHT), diagnose.prompt_effect(wan, "wan", LEFT, BLUE)
    # measured: 32.6 against 62.3 (SANA-Video 2.0's shipped model: 2.7 against 106.5, docs/tiny-models.md)
    assert direction > 0.25 * colour > 0


def test_one_step_reads_keep_a_move_the_model_is_shown():
    reads = diagnose.one_step_directions(trained_pipeline("sana-video2"), "sana-video2", sigmas=(0.6,), guidance=4.0)
    assert [(r.sigma, r.guidance, r.clips) for r in reads] == [(0.6, 4.0, 8)]
    assert reads[0].right == reads[0].moving == 8  # measured: 8 of 8 up to sigma 0.9


def test_wans_latents_say_where_a_clip_starts_and_the_shipped_ltx2_vaes_do_not():
    # measured 2026-12-08 (AMX Xeon): Wan's 1.45 (its causal VAE codes the lone first frame apart), SANA-Video 2.0's
    # 0.012; a fine-tuned LTX-2 VAE with vae_frame_cue 1.4 read 0.79 (docs/tiny-models.md)
    assert diagnose.first_frame_offset(trained_pipeline("wan").vae) > 1.0
    assert diagnose.first_frame_offset(trained_pipeline("sana-video2").vae) < 0.05
