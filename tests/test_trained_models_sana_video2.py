"""The shared trained-model checks of ``tests/test_trained_models.py`` (colour and coherence against random weights)
on the shipped trained SANA-Video 2.0 (its own LTX-2 VAE; the random-weight model it is measured against is random
throughout): the same test functions and fixtures, imported, with ``family`` set to SANA-Video 2.0. Not the growth
check: this model did not learn "grows" vs "shrinks" (measured: grows 0.32-1.21, shrinks 0.30-1.12;
docs/tiny-models.md), so it is not claimed. A file of its own so that the suite's two workers (``--dist loadfile``)
generate the families' videos side by side."""
import pytest

from test_trained_models import (FAMILIES, random_videos, trained_videos,  # noqa: F401  (fixtures the tests use)
                                 test_a_random_weight_model_of_the_same_shape_shows_no_prompts_colour,
                                 test_the_trained_model_shows_the_prompts_colour,
                                 test_trained_videos_are_more_coherent_in_time_than_random_weights)

assert "sana-video2" in FAMILIES


@pytest.fixture(scope="module")
def family():
    return "sana-video2"
