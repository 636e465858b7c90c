"""The shared trained-model checks of ``tests/test_trained_models.py`` (colour, coherence, growth against random
weights) on the shipped trained SANA-Video: the same test functions and fixtures, imported, with ``family`` set to
SANA-Video. A file of its own so that the suite's two workers (``--dist loadfile``) generate the two families'
videos side by side."""
import pytest

from test_trained_models import (FAMILIES, random_videos, trained_videos,  # noqa: F401  (fixtures the tests use)
                                 test_a_random_weight_model_of_the_same_shape_shows_no_prompts_colour,
                                 test_the_trained_model_shows_the_prompts_colour,
                                 test_the_trained_model_shows_whether_the_shape_grows_or_shrinks_and_random_weights_do_not,
                                 test_trained_videos_are_more_coherent_in_time_than_random_weights)

assert "sana-video" in FAMILIES


@pytest.fixture(scope="module")
def family():
    return "sana-video"
