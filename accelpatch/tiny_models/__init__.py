"""Tiny video models trained here, on CPU, on procedural clips, so that quality gates compare videos with content.

Random-weight tiny pipelines (:mod:`accelpatch.testing`) make noise; a gate on noise measures nothing (issue #43).
This package holds the pieces to train tiny versions of the real diffusers classes on clips whose colour and motion
follow their prompt:

* :mod:`~accelpatch.tiny_models.procedural`: seeded clips and prompts (moving, growing, bouncing, colour-changing
  shapes; camera pans and zooms over scikit-image's sample photographs), with their ground truth.
* :mod:`~accelpatch.tiny_models.train`: :func:`train_family` (``"wan"``, ``"sana-video"``, ``"sana-video2"`` and
  ``"hunyuan-video15"`` so far) saves a folder that the family's diffusers pipeline ``from_pretrained`` loads;
  :mod:`~accelpatch.tiny_models.hunyuan_video15` holds what HunyuanVideo 1.5's richer transformer inputs need.
* :mod:`~accelpatch.tiny_models.detect`: reads a shape video's colour and direction of motion from its frames.
* :mod:`~accelpatch.tiny_models.diagnose`: where a trained transformer loses a prompt's motion, from single
  predictions (whether it knows a token's frame, how far a prompt word steers it, one-step reads of noised moves).
* :mod:`~accelpatch.tiny_models.sound`: a clip's sound for the audio families (pitch follows the shape's height,
  loudness its size, stereo position its x) and a reader that hears those from the waveform.
* :mod:`~accelpatch.tiny_models.shipped`: the trained folders that ship in the package (:func:`trained_pipeline`);
  :mod:`~accelpatch.tiny_models.shelf` says which ship without importing torch (the recipe schema reads it).
* :mod:`~accelpatch.tiny_models.cli`: ``python -m accelpatch train-tiny FAMILY [--ship]``.

Importing this package imports no torch; :func:`train_family` and the modules load on first use.
"""
from __future__ import annotations

from accelpatch._lazy import lazy_attributes
from accelpatch.models.families import trainable_families

#: Families with a training recipe (their registry record's ``training``), by their command-line names, in the
#: registry's order (the other families of issue #43 come later). SANA-Video reuses the shipped Wan's trained VAE,
#: so Wan trains first; SANA-Video 2.0 and HunyuanVideo 1.5 train their own VAEs (docs/tiny-models.md).
TRAINABLE_FAMILIES: tuple[str, ...] = trainable_families()

_LAZY = {
    "train_family": "accelpatch.tiny_models.train",
    "TrainResult": "accelpatch.tiny_models.train",
    "wan_call_kwargs": "accelpatch.tiny_models.shipped",
    "sana_video_call_kwargs": "accelpatch.tiny_models.shipped",
    "sana_video2_call_kwargs": "accelpatch.tiny_models.shipped",
    "untrained_pipeline": "accelpatch.tiny_models.train",
    "procedural_video": "accelpatch.tiny_models.procedural",
    "procedural_batch": "accelpatch.tiny_models.procedural",
    "read_shape_video": "accelpatch.tiny_models.detect",
    "procedural_sound": "accelpatch.tiny_models.sound",
    "read_sound": "accelpatch.tiny_models.sound",
    "trained_pipeline": "accelpatch.tiny_models.shipped",
    "trained_call_kwargs": "accelpatch.tiny_models.shipped",
    "shipped_families": "accelpatch.tiny_models.shelf",
}
__all__ = ["TRAINABLE_FAMILIES", *_LAZY]
__getattr__ = lazy_attributes(__name__, _LAZY, subpackages=("procedural", "train", "cli", "detect", "shipped", "shelf",
                                                            "sound", "hunyuan_video15", "diagnose"))
