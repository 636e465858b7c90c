"""The shared trained-model checks of ``tests/test_trained_models.py`` (colour, coherence, growth against random
weights) on the shipped trained SANA-Video: the same test functions and fixtures, with ``family`` set to SANA-Video.
A module of its own so that the suite's two workers (``--dist loadfile``) generate the families' videos side by
side."""
from test_trained_models import checks_for

globals().update(checks_for("sana-video"))
