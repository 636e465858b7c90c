"""The shared trained-model checks of ``tests/test_trained_models.py`` (colour and coherence against random weights)
on the shipped trained SANA-Video 2.0 (its own LTX-2 VAE; the random-weight model it is measured against is random
throughout), with ``family`` set to SANA-Video 2.0. Not the growth check: this model did not learn "grows" vs
"shrinks" (measured: grows 0.32-1.21, shrinks 0.30-1.12; docs/tiny-models.md), so it is not claimed. A module of its
own so that the suite's two workers (``--dist loadfile``) generate the families' videos side by side."""
from test_trained_models import checks_for

globals().update(checks_for("sana-video2", growth=False))
