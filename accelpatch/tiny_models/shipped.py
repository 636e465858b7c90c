"""The trained tiny pipelines that ship inside the package, and how to load and call them.

Why: gates, the demo and the suite need tiny models whose videos have content (issue #43), without training them
each time. ``python -m accelpatch train-tiny FAMILY --ship`` trains one and writes it here in half precision
(the folder ``weights/FAMILY`` beside this module, a diffusers pipeline folder with its ``training.json``);
:func:`trained_pipeline` loads it with diffusers' own ``from_pretrained``, in float32 by default.
"""
from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import torch

from accelpatch.models.families import by_cli, resolve
from accelpatch.tiny_models import TRAINABLE_FAMILIES, procedural
from accelpatch.tiny_models.shelf import WEIGHTS_DIR, shipped_families  # noqa: F401 (re-exported)

#: Prompts are tokenized to at most this many tokens; the embeddings are zero-padded to it (as Wan's pipeline does),
#: so calls must pass the same ``max_sequence_length`` as training (see :func:`wan_call_kwargs`).
MAX_SEQUENCE_LENGTH = 16


def shipped_folder(family: str) -> Path:
    """The shipped folder of ``family``; ValueError naming the families that have one otherwise."""
    folder = WEIGHTS_DIR / family
    if not (folder / "model_index.json").is_file():
        have = ", ".join(shipped_families()) or "none"
        raise ValueError(f"no trained tiny {family!r} pipeline ships with accelpatch (trained: {have}); use the "
                         f"random-weight builder (trained=False), or train one with "
                         f"`python -m accelpatch train-tiny {family}` where that family is trainable")
    return folder


def trained_pipeline(family: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The shipped trained tiny pipeline of ``family``, loaded by ``DiffusionPipeline.from_pretrained`` from its
    folder in ``dtype`` (weights are stored in float16), on ``device``, progress bar off."""
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    folder = shipped_folder(family)
    _import_pipeline_module(family)
    shown = [(lib, lib.is_progress_bar_enabled()) for lib in (diffusers_logging, transformers_logging)]
    for lib, _ in shown:  # loading a few MB needs no progress bars (they would interleave with the demo's output)
        lib.disable_progress_bar()
    try:
        pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype)
    finally:
        for lib, was in shown:
            if was:
                lib.enable_progress_bar()
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def trained_call_kwargs(family: str, prompt: str, **kwargs: Any) -> dict[str, Any]:
    """Call kwargs for the shipped ``family`` pipeline at its training size (see the family's ``*_call_kwargs``)."""
    shipped_folder(family)
    return resolve(training_settings(family).call_kwargs)(prompt, **kwargs)


def training_settings(family: str):
    """The training record ``family``'s package registers (:class:`accelpatch.models.families.TrainingSettings`);
    ValueError naming the trainable families where it has none."""
    if family not in TRAINABLE_FAMILIES:
        raise ValueError(f"no tiny training recipe for {family!r} (trainable: {', '.join(TRAINABLE_FAMILIES)})")
    return by_cli(family).training


def wan_call_kwargs(prompt: str = "a red square moves left", *, num_inference_steps: int = 8,
                    guidance_scale: float = 4.0, seed: int = 0, negative_prompt: str = "",
                    output_type: str = "pt") -> dict[str, Any]:
    """Call kwargs for a trained tiny Wan pipeline at its training size: 13 frames of 128 x 256 (512 tokens per
    forward) and the training ``max_sequence_length``."""
    return dict(prompt=prompt, negative_prompt=negative_prompt, height=procedural.VIDEO_HEIGHT,
                width=procedural.VIDEO_WIDTH, num_frames=procedural.VIDEO_FRAMES,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                generator=torch.Generator().manual_seed(seed), output_type=output_type,
                max_sequence_length=MAX_SEQUENCE_LENGTH)


def sana_video_call_kwargs(prompt: str = "a red square moves left", **kwargs: Any) -> dict[str, Any]:
    """Call kwargs for a trained tiny SANA-Video pipeline: :func:`wan_call_kwargs` (same size, steps, guidance,
    seed; ``frames`` is SANA-Video's name for ``num_frames``), with the prompt encoded as in training: no
    prompt-rewriting instruction (``complex_human_instruction=[]``), no resolution binning (it only accepts the
    released sizes)."""
    return {**_frames_call(prompt, **kwargs), "complex_human_instruction": [], "use_resolution_binning": False}


#: The trained tiny SANA-Video 2.0's guidance: its prompts steer less than Wan's and SANA-Video's (at their 4 it
#: drew 3 of the suite's 8 prompts' colours, its denoiser drawing red green from high noise; at 8, 7; at 12, all 8:
#: docs/tiny-models.md)
SANA_VIDEO2_GUIDANCE = 12.0


def sana_video2_call_kwargs(prompt: str = "a red square moves left", *, guidance_scale: float = SANA_VIDEO2_GUIDANCE,
                            **kwargs: Any) -> dict[str, Any]:
    """Call kwargs for a trained tiny SANA-Video 2.0 pipeline: :func:`wan_call_kwargs`' size, steps and seed, its
    own guidance (:data:`SANA_VIDEO2_GUIDANCE`), with the prompt encoded as in training: no prompt-rewriting
    instruction and no motion-score suffix (``complex_human_instruction=None, motion_score=None``) and an empty
    negative prompt."""
    return {**_frames_call(prompt, guidance_scale=guidance_scale, **kwargs), "complex_human_instruction": None,
            "motion_score": None}


def _frames_call(prompt: str, **kwargs: Any) -> dict[str, Any]:
    """:func:`wan_call_kwargs` with ``num_frames`` under the SANA pipelines' name, ``frames``."""
    call = wan_call_kwargs(prompt, **kwargs)
    call["frames"] = call.pop("num_frames")
    return call


def _import_pipeline_module(family: str) -> None:
    """Import the module that defines ``family``'s pipeline class where diffusers does not (diffusers resolves a
    folder's ``model_index.json`` classes from modules already imported)."""
    training = by_cli(family).training
    if training is not None and training.pipeline_module is not None:
        importlib.import_module(training.pipeline_module)


def ship(folder: str | Path, family: str) -> Path:
    """Copy a trained folder (``train_family``'s output) into the package, in float16: the folder
    :func:`trained_pipeline` loads. Returns where it went; an earlier shipped folder of the family is replaced."""
    from diffusers import DiffusionPipeline

    source = Path(folder)
    target = WEIGHTS_DIR / family
    _import_pipeline_module(family)
    pipe = DiffusionPipeline.from_pretrained(source)
    if target.exists():
        shutil.rmtree(target)
    pipe.to(torch.float16).save_pretrained(target)
    shutil.copy2(source / "training.json", target / "training.json")
    return target
