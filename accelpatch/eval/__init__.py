"""Evaluation: whether a setting is good enough and fast enough on your model, and which one to pick.

- :mod:`.validate`: frames (and audio) of candidate settings against the ``exact`` reference, per-frame SSIM/PSNR
  gates, the reference's own noise floor (:mod:`.validate_scores`, :mod:`.validate_report`); :mod:`.metrics`,
  :mod:`.audio_metrics`, :mod:`.plots`;
- :mod:`.bench`: side-by-side timings with their noise (:mod:`.stats`);
- :mod:`.tune`: a search over a fast path's knobs that keeps the fastest setting passing the gates
  (:mod:`.tune_space`, :mod:`.tune_search`, :mod:`.tune_oracle`, :mod:`.tune_result`, :mod:`.tune_plot`);
- :mod:`.candidates`, :mod:`.preflight`, :mod:`.pipelines`, :mod:`.recipe_cli`: what the three share (settings to
  compare, argument checks before any work, loading a pipeline, the command line).

``accelpatch.validate``, ``accelpatch.bench`` and ``accelpatch.tune`` are these functions; ``python -m accelpatch
validate|bench|tune`` their command lines. Plots need matplotlib (``pip install "accelpatch[eval]"``).

Public here (imported on first use): ``validate``, ``bench``, ``tune``, ``TuneResult``, ``Candidate``,
``load_pipeline``.
"""
from accelpatch._lazy import lazy_attributes

_LAZY = {"validate": "accelpatch.eval.validate", "bench": "accelpatch.eval.bench", "tune": "accelpatch.eval.tune",
         "TuneResult": "accelpatch.eval.tune_result", "Candidate": "accelpatch.eval.candidates",
         "load_pipeline": "accelpatch.eval.pipelines"}

__getattr__ = lazy_attributes(__name__, _LAZY)
