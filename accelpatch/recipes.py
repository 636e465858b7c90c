"""Recipes: a named, checked set of settings for one model, read from YAML.

A recipe names the model (a hub id, a local folder, ``tiny:<model>`` for the offline random test models or
``trained:<model>`` for the shipped trained tiny ones), the call
arguments, the tier, backend and options that :func:`accelpatch.apply` takes, the candidates that ``validate`` and
``bench`` compare against the reference, and the quality gates. The schema is a pydantic model, so a bad field is
reported with its dotted location, the value given and what is allowed; unknown fields are errors, not ignored.

The shipped recipes are the repository's top-level ``recipes/*.yaml``, one copy: setup.cfg maps that folder into the
wheel as package data (the package ``accelpatch.recipe_files``), and a source checkout (an editable install, or the
checkout on ``sys.path``) reads it where it is (:data:`SHIPPED_RECIPES`). Your own go in ``./recipes`` or a folder
on ``$ACCELPATCH_RECIPES``. :func:`load_recipe` takes a path, a bare name found in one of those
(``"sana-video-480p-high"``), a mapping, or a :class:`Recipe`.
"""
from __future__ import annotations

import difflib
import numbers
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from accelpatch.core.errors import did_you_mean
from accelpatch.core.tiers import parse_tier
from accelpatch.models.families import families
from accelpatch.tiny_models.shelf import shipped_families

__all__ = ["Gates", "CandidateSpec", "BenchSettings", "LoraSpec", "Recipe", "RecipeError", "load_recipe", "recipe_dirs",
           "available_recipes", "TINY_MODELS", "SHIPPED_RECIPES", "schema_errors", "SEED_MAX", "seed_problem",
           "call_problems", "minimum_steps", "MIN_ROUNDS", "MIN_WARMUP", "scheduler_class", "scheduler_overrides",
           "ACCELPATCH_SCHEDULERS"]


def _shipped_recipes() -> Path:
    """The folder of the shipped recipes: in an installed wheel the package data ``accelpatch.recipe_files`` (what
    setup.cfg maps the repository's ``recipes/`` to); in a source checkout, editable install or not, that
    ``recipes/`` itself, next to the package and setup.cfg (the package holds no copy)."""
    installed = resources.files("accelpatch").joinpath("recipe_files")
    if installed.is_dir():
        return Path(str(installed)).resolve()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "setup.cfg").is_file() and (checkout / "recipes").is_dir():
        return checkout / "recipes"
    return Path(str(installed))  # neither: a folder that does not exist, so no recipe is found there


#: the recipes that ship with the package (the repository's ``recipes/``: package data of the wheel)
SHIPPED_RECIPES = _shipped_recipes()

#: ``tiny:<name>`` models: offline random pipelines from :mod:`accelpatch.testing`, one per registered family
#: (accelpatch.models.families; built by accelpatch.eval.pipelines)
TINY_MODELS = tuple(family.cli for family in families())
#: ``trained:<name>`` models: the trained tiny pipelines that ship in the package (issue #43; built by
#: accelpatch.eval.pipelines from accelpatch.tiny_models.shipped), whose videos have content the gates can judge
TRAINED_MODELS = shipped_families()
DTYPES = ("bf16", "fp16", "fp32")

#: the largest seed: seeds are torch.Generator.manual_seed's non-negative range, 0 to 2**64 - 1 (torch folds a
#: negative seed onto a positive one, 0xffff_ffff_ffff_ffff + seed, so -1 would name the noise of another seed)
SEED_MAX = 2**64 - 1
#: bench's timed rounds (a spread needs two samples; a 95 % verdict needs 6) and untimed warm-up calls, at least
MIN_ROUNDS, MIN_WARMUP = 2, 0

#: call arguments that count something: what each counts (each at least 1; num_inference_steps: minimum_steps())
CALL_COUNTS = {"num_inference_steps": "denoising steps", "num_frames": "frames", "height": "pixels",
               "width": "pixels"}


def seed_problem(seed: Any) -> Optional[str]:
    """Why ``seed`` is not a seed (an integer from 0 to :data:`SEED_MAX`), or None."""
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        return f"a seed is an integer from 0 to 2**64-1, got {type(seed).__name__} {seed!r}"
    if not 0 <= seed <= SEED_MAX:
        return (f"seed {seed} is out of range: seeds are integers from 0 to 2**64-1 ({SEED_MAX}; torch folds a "
                "negative seed onto a positive one)")
    return None


def minimum_steps(model: str) -> tuple[int, str]:
    """(the least ``num_inference_steps`` a run of ``model`` takes, why): 1 (a run needs a step), more for a
    family known by its name (``tiny:minimax-h3``, ``MiniMaxAI/MiniMax-H3``) or its scheduler's class name."""
    name = str(model).lower().replace("_", "-")
    for family in families():
        if family.recipe.min_steps and (family.cli in name or family.cli.replace("-", "") in name.replace("-", "")):
            return family.recipe.min_steps
    return 1, "a run needs at least one denoising step"


def call_problems(call: Any, model: str = "") -> list[str]:
    """One line per call argument out of its range: ``num_inference_steps`` (at least :func:`minimum_steps` of
    ``model``), ``num_frames``, ``height`` and ``width`` (integers of at least 1). None leaves a pipeline default."""
    problems = []
    for name, what in CALL_COUNTS.items():
        value = call.get(name) if hasattr(call, "get") else None
        if value is None:
            continue
        least, why = minimum_steps(model) if name == "num_inference_steps" else (1, f"a number of {what}")
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            problems.append(f"{name} must be an integer >= {least} ({why}), not {value!r}")
    return problems


def _known_backend(value: Optional[str]) -> Optional[str]:
    from accelpatch.core.backends import available_backends

    if value is not None and value.strip().lower().replace("-", "_") not in available_backends():
        raise ValueError(f"unknown backend {value!r}; backends: {', '.join(available_backends())} (or null)")
    return value


class RecipeError(ValueError):
    """A recipe that cannot be read or does not fit the schema; the message names the field and what is allowed."""


#: scheduler classes a recipe's ``scheduler: {class: ...}`` may name besides diffusers' own: name -> the module that
#: exports it (imported only when the name is resolved)
ACCELPATCH_SCHEDULERS = {"SanaVideo2FewStepScheduler": "accelpatch.models.sana_video2.modeling"}


def _diffusers_scheduler_names() -> list[str]:
    import diffusers

    return sorted(name for name in dir(diffusers) if name.endswith("Scheduler") and not name.startswith("Flax"))


def scheduler_class(name: str) -> type:
    """The scheduler class a recipe's ``scheduler.class`` names: one of diffusers' (``UniPCMultistepScheduler``,
    ``FlowMatchEulerDiscreteScheduler``, ...) or of :data:`ACCELPATCH_SCHEDULERS`. Imports diffusers. An unknown
    name raises :class:`RecipeError` with the close matches."""
    import importlib

    if name in ACCELPATCH_SCHEDULERS:
        return getattr(importlib.import_module(ACCELPATCH_SCHEDULERS[name]), name)
    known = _diffusers_scheduler_names()
    if name in known:
        import diffusers
        from diffusers.schedulers.scheduling_utils import SchedulerMixin

        cls = getattr(diffusers, name, None)
        if isinstance(cls, type) and issubclass(cls, SchedulerMixin):
            return cls
    choices = known + sorted(ACCELPATCH_SCHEDULERS)
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise RecipeError(f"scheduler.class: unknown scheduler {name!r}{hint}; a diffusers scheduler class name or "
                      f"{', '.join(sorted(ACCELPATCH_SCHEDULERS))}")


def _config_keys(cls: type) -> list[str]:
    """The keys of ``cls``'s config: its ``__init__`` parameters (what ``register_to_config`` records)."""
    import inspect

    return sorted(name for name, p in inspect.signature(cls.__init__).parameters.items()
                  if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def scheduler_overrides(spec: dict, cls: type) -> dict[str, Any]:
    """The config overrides of a recipe's ``scheduler`` mapping (every key but ``class``), each checked to be a key
    of ``cls``'s config: diffusers' ``from_config`` silently drops keyword arguments the class does not take, so a
    misspelt one (``flow_shif``) would leave the default in place. Raises :class:`RecipeError` naming it."""
    overrides = {k: v for k, v in spec.items() if k != "class"}
    keys = _config_keys(cls)
    unknown = [k for k in overrides if k not in keys]
    if unknown:
        lines = [f"{k!r}{did_you_mean(k, keys)}" for k in unknown]
        raise RecipeError(f"scheduler: {', '.join(lines)} is not in {cls.__name__}'s config (diffusers would ignore "
                          f"it); its config: {', '.join(keys)}")
    return overrides


def _yaml_value(value: Any) -> bool:
    """Whether ``value`` is a plain YAML value (a scalar, or a list/mapping of them) a scheduler config can hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_yaml_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _yaml_value(v) for k, v in value.items())
    return False


class LoraSpec(BaseModel):
    """One LoRA the pipeline loads before it is patched: ``pipe.load_lora_weights(weights, weight_name=...,
    adapter_name=...)`` (into ``transformer_2`` with ``load_into_transformer_2=True``: Wan 2.2's low-noise expert),
    then one ``pipe.set_adapters`` over all of a recipe's LoRAs with their scales."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: str = Field(min_length=1, description="hub id, local folder or .safetensors file")
    weight_name: Optional[str] = Field(None, min_length=1, description="the file inside a hub repo or folder")
    adapter_name: Optional[str] = Field(None, min_length=1, description="default: lora_<index>")
    scale: float = Field(1.0, allow_inf_nan=False, description="the adapter's weight in set_adapters")
    component: Literal["transformer", "transformer_2"] = Field(
        "transformer", description="transformer_2: Wan 2.2's low-noise expert (load_into_transformer_2=True)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Gates(_Strict):
    """Pass/fail floors for approximate candidates, applied to the worst frame and the worst second of audio of
    every seed.

    Audio gates apply by default whenever the pipeline returns audio (``audio: auto``): a pipeline with sound gets
    its sound checked. Setting any ``audio_*`` threshold (to other than its default), or ``audio: required``, asks
    for them: a pipeline that returns no audio is then refused with the reason (before the candidates run). ``audio: off`` reports the audio
    scores without gating them. The audio metrics are defined in :mod:`accelpatch.eval.audio_metrics`.

    Why the audio defaults (engineering choices by analogy, not perceptual thresholds): ``audio_snr_floor`` 10 dB
    lets the error carry at most a tenth of the signal's power in the worst second (per track), the audio
    counterpart of "clearly below the signal" that the video floors ask; ``audio_corr_floor`` 0.95 is the
    correlation that independent error at that SNR leaves, 1/sqrt(1 + 10^(-10/10)) = 0.953, so the two agree for
    added noise and differ where they should (a gain change costs SNR only; a change of waveform shape costs
    correlation at any gain). Both are waveform measures and punish phase shifts a listener may not hear, so they
    are strict for generated audio: the prior art's best sparse-attention setting on MiniMax-H3 (correlation 0.82)
    fails them. Loosen them per model in a recipe, against the reference's own noise floor (two reference runs,
    in the report). The log-spectral distance is phase-blind but has no agreed threshold for generated audio, so
    it is reported and gated only when ``audio_lsd_ceiling`` is set.

    Temporal gates (:mod:`accelpatch.eval.temporal_metrics`) apply to every candidate by default, like the frame
    floors; set a threshold to null to report the metric without gating it. Degenerate frames (NaN/inf, black or
    constant where the reference's frame is not) always fail. Why the defaults (engineering choices, not
    perceptual thresholds):

    * ``motion_ratio_min``/``motion_ratio_max`` 0.8/1.25 (the candidate's mean frame-to-frame change over the
      reference's): a band symmetric in log around 1 (1/1.25 = 0.8), a fifth of the motion lost or a quarter
      gained. The failures it is for are far outside: a clip frozen after its k-th of F frames reads about
      k/(F-1), a clip sped up by dropping every other frame about 2, while an approximate candidate that keeps
      every frame within the SSIM/PSNR floors with errors that follow the content changes the motion by a few
      percent.
    * ``flicker_delta_max`` 0.01 (VBench's temporal-flicker score, candidate minus reference, may fall at most
      this): the candidate may add at most 1% of the range (2.55 8-bit levels) of mean frame-to-frame change. The
      motion ratio is relative; this is absolute, for a busy clip where added flicker hides in the ratio. It is
      what independent per-frame noise of about 41 dB PSNR adds to a still region (E|n_t - n_(t-1)| = 1.13
      sigma): stricter than the frame floors for noise that changes every frame, which is the point; errors that
      stay put from frame to frame cost nothing here.
    * ``psnr_drift_max_db`` 6 dB (per-frame PSNR against the reference, first quarter of the clip minus the last,
      values above 40 dB counted as 40): the error's RMS may at most double from the start of the clip to its end.
      Error that accumulates along the clip (autoregressive or causal generation, a cache that goes stale) shows
      here while the worst frame still passes the floor; content alone (more motion at the end) rarely moves it
      by a factor of two.
    * ``i2v_image`` (image-to-video calls, an ``image`` argument): the candidate's frame 0 against the
      conditioning image may be worse than the reference's only by what the frame floors allow one frame to add:
      PSNR down to ``-10 log10(10^(-ref/10) + 10^(-psnr_floor/10))`` (an independent error adds in power) and SSIM
      down to ``ref - (1 - ssim_floor)``. A candidate whose frame 0 moves away from the image more than that has
      lost the conditioning even when it is close to the reference's frame 0.

    A one-frame video has no motion, flicker or drift: those read "n/a (one frame)" and pass.
    """

    ssim_floor: float = Field(0.92, ge=0.0, le=1.0, description="every frame's SSIM against the reference")
    psnr_floor: float = Field(24.0, ge=0.0, description="every frame's PSNR (dB) against the reference")
    require_fast_path: bool = Field(False, description="fail an approximate candidate when no fast path ran")
    audio: Literal["auto", "required", "off"] = Field(
        "auto", description="auto: gate the audio when the pipeline returns some; required: refuse a pipeline that "
                            "returns none; off: report the audio, do not gate it")
    audio_snr_floor: float = Field(
        10.0, allow_inf_nan=False, description="every 1-second window's audio SNR (dB, per track) against the "
        "reference: 10 dB = error power at most a tenth of the signal's")
    audio_corr_floor: float = Field(
        0.95, ge=-1.0, le=1.0, description="every track's audio correlation (Pearson, whole clip and every "
        "1-second window with sound): 0.95 is what independent error at the 10 dB SNR floor leaves")
    audio_lsd_ceiling: Optional[float] = Field(
        None, ge=0.0, allow_inf_nan=False, description="every 1-second window's log-spectral distance (dB) at most "
        "this; null (default): reported, not gated")
    motion_ratio_min: Optional[float] = Field(
        0.8, allow_inf_nan=False, description="the candidate's motion energy (mean |frame_t - "
        "frame_t-1|) over the reference's at least this (catches frozen or slowed motion); null: not gated")
    motion_ratio_max: Optional[float] = Field(
        1.25, allow_inf_nan=False, description="the motion-energy ratio at most this (catches sped-up "
        "motion, skipped frames, flicker); null: not gated")
    flicker_delta_max: Optional[float] = Field(
        0.01, ge=0.0, le=1.0, allow_inf_nan=False, description="the candidate's VBench temporal-flicker score at "
        "most this below the reference's (1% of the range of added frame-to-frame change); null: not gated")
    psnr_drift_max_db: Optional[float] = Field(
        6.0, ge=0.0, allow_inf_nan=False, description="the per-frame PSNR (capped at 40 dB) may fall at most this "
        "many dB from the first quarter of the clip to the last (error amplitude at most doubled); null: not gated")
    i2v_image: bool = Field(
        True, description="image-to-video calls (an image argument): the candidate's frame 0 against the "
                          "conditioning image no worse than the reference's by more than the frame floors allow; "
                          "false: reported, not gated")

    @field_validator("motion_ratio_min")
    @classmethod
    def _motion_min_below_one(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError(f"the motion ratio band's lower end must be in (0, 1] (the band holds 1: an unchanged "
                             "clip passes)")
        return value

    @field_validator("motion_ratio_max")
    @classmethod
    def _motion_max_above_one(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and value < 1.0:
            raise ValueError(f"the motion ratio band's upper end must be at least 1 (the band holds 1: an unchanged "
                             "clip passes)")
        return value

    @model_validator(mode="after")
    def _audio_off_takes_no_thresholds(self) -> "Gates":
        if self.audio == "off" and self.explicit_audio_gates():
            raise ValueError(f"audio: off contradicts the audio gate(s) set: {', '.join(self.explicit_audio_gates())}"
                             "; drop them or set audio: auto/required")
        return self

    def explicit_audio_gates(self) -> list[str]:
        """The audio thresholds given explicitly (in YAML, a mapping or as keyword arguments) at a value other than
        their default: ``{**gates.model_dump(), "ssim_floor": 0.9}`` restates the defaults and asks for nothing."""
        fields = type(self).model_fields
        return [name for name in AUDIO_THRESHOLDS
                if name in self.model_fields_set and getattr(self, name) != fields[name].default]

    @property
    def audio_required(self) -> bool:
        """Whether audio gates were asked for explicitly: ``audio: required`` or an ``audio_*`` threshold set."""
        return self.audio == "required" or bool(self.explicit_audio_gates())

    @property
    def gates_audio(self) -> bool:
        """Whether audio, when the pipeline returns some, decides the verdict (``audio`` is not ``off``)."""
        return self.audio != "off"

    def describe_audio_request(self) -> str:
        """What asked for audio gates, for the refusal message (``audio_snr_floor=12.0``, ``audio: required``)."""
        asked = [f"{name}={getattr(self, name)}" for name in self.explicit_audio_gates()]
        if self.audio == "required":
            asked.insert(0, "audio: required")
        return ", ".join(asked)


#: the audio thresholds of :class:`Gates` (setting one asks for audio gates)
AUDIO_THRESHOLDS = ("audio_snr_floor", "audio_corr_floor", "audio_lsd_ceiling")


class CandidateSpec(_Strict):
    """One setting to compare with the reference: a tier, optionally with a backend and options (``apply()``
    arguments). ``unpatched: true`` runs the model with accelpatch removed. ``vae_tiling``: the pipeline's VAE
    decodes in tiles for this candidate (``vae.enable_tiling()``; true: diffusers' default tiles, a mapping: its
    arguments, e.g. ``tile_sample_min_height``), lossy, so ``validate`` measures what it costs."""

    name: Optional[str] = None
    tier: str = "high"
    backend: Optional[str] = None
    options: dict[str, Any] = Field(default_factory=dict)
    unpatched: bool = False
    vae_tiling: Union[bool, dict[str, Union[int, float]]] = False

    @field_validator("tier")
    @classmethod
    def _known_tier(cls, value: str) -> str:
        return str(parse_tier(value))

    _backend = field_validator("backend")(classmethod(lambda cls, value: _known_backend(value)))

    @model_validator(mode="after")
    def _unpatched_takes_nothing(self) -> "CandidateSpec":
        if self.unpatched and (self.backend is not None or self.options):
            raise ValueError("an unpatched candidate takes no backend or options")
        return self

    @property
    def label(self) -> str:
        """The name given, else one made from the settings (``high``, ``high+sol_attn(tau=1.5)``, ``unpatched``)."""
        if self.name:
            return self.name
        label = "unpatched" if self.unpatched else self.tier + (f"+{self.backend}" if self.backend else "")
        if self.options:
            label += "(" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items())) + ")"
        if self.vae_tiling:
            label += "+vae_tiling" + ("" if self.vae_tiling is True else "(" + ",".join(
                f"{k}={v:g}" for k, v in sorted(self.vae_tiling.items())) + ")")
        return label


class BenchSettings(_Strict):
    """How ``bench`` times candidates: untimed warm-up calls per candidate, then interleaved timed rounds."""

    warmup: int = Field(1, ge=MIN_WARMUP)
    rounds: int = Field(7, ge=MIN_ROUNDS, description="timed calls per candidate, interleaved (6 or more for a verdict)")


class Recipe(_Strict):
    """Settings for one model: what to load, how to call it, how to patch it, and what must hold."""

    name: str = Field(min_length=1)
    description: str = ""
    model: str = Field(min_length=1, description="hub id, local folder, tiny:<model> or trained:<model>")
    pipeline: Literal["auto", "diffusion", "modular"] = "auto"
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    device: str = "auto"
    call: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    tier: str = "high"
    backend: Optional[str] = None
    options: dict[str, Any] = Field(default_factory=dict)
    reference: str = "exact"
    candidates: Optional[list[CandidateSpec]] = None
    gates: Gates = Field(default_factory=Gates)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    #: the pipeline's scheduler, replaced before the call: ``class`` (optional; a diffusers scheduler class name or
    #: one of :data:`ACCELPATCH_SCHEDULERS`; default the pipeline's own class) and config overrides, applied as
    #: ``pipe.scheduler = Cls.from_config(pipe.scheduler.config, **overrides)``
    scheduler: Optional[dict[str, Any]] = Field(None, description="{class: Name, <config key>: value, ...}")
    #: LoRAs loaded into the pipeline before it is patched (a distillation LoRA: lightx2v, Lightning, Turbo)
    lora: list[LoraSpec] = Field(default_factory=list)
    #: what ``accelpatch tune`` measured for this setting (speed-up and interval, worst-case quality, seeds, device):
    #: a record for people, read by nothing
    measured: Optional[dict[str, Any]] = Field(None, description="written by accelpatch tune; informational")

    @field_validator("tier", "reference")
    @classmethod
    def _known_tier(cls, value: str) -> str:
        return str(parse_tier(value))

    _backend = field_validator("backend")(classmethod(lambda cls, value: _known_backend(value)))

    @field_validator("model")
    @classmethod
    def _known_tiny_model(cls, value: str) -> str:
        if value.startswith("tiny:") and value[5:] not in TINY_MODELS:
            close = difflib.get_close_matches(value[5:], TINY_MODELS, n=1)
            hint = f" (did you mean tiny:{close[0]}?)" if close else ""
            raise ValueError(f"unknown tiny model {value!r}{hint}; tiny models: "
                             + ", ".join(f"tiny:{m}" for m in TINY_MODELS))
        if value.startswith("trained:") and value[8:] not in TRAINED_MODELS:
            raise ValueError(f"unknown trained model {value!r}; trained tiny models: "
                             + ", ".join(f"trained:{m}" for m in TRAINED_MODELS)
                             + " (the other families have random-weight tiny:<model> pipelines only)")
        return value

    @field_validator("call")
    @classmethod
    def _no_generator(cls, value: dict, info: ValidationInfo) -> dict:
        if "generator" in value:
            raise ValueError("give seeds (the 'seeds' field), not a generator: each run builds its own")
        problems = call_problems(value, info.data.get("model", ""))
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("scheduler")
    @classmethod
    def _scheduler_shape(cls, value: Optional[dict]) -> Optional[dict]:
        if value is None:
            return value
        if not value:
            raise ValueError("scheduler: give a class and/or config overrides ({class: UniPCMultistepScheduler, "
                             "flow_shift: 5.0}), or leave it out")
        name = value.get("class")
        if "class" in value and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"scheduler.class must be a scheduler class name (e.g. FlowMatchEulerDiscreteScheduler), "
                             f"got {name!r}")
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"scheduler: config keys are names, got {key!r}")
            if not _yaml_value(item):
                raise ValueError(f"scheduler.{key}: a config value is a number, string, bool, null or a list of "
                                 f"them, got {type(item).__name__} {item!r}")
        return value

    @field_validator("lora")
    @classmethod
    def _distinct_adapters(cls, value: list[LoraSpec]) -> list[LoraSpec]:
        names = [spec.adapter_name or f"lora_{i}" for i, spec in enumerate(value)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"lora: adapter names must be distinct, got {repeated} more than once")
        return value

    @field_validator("seeds")
    @classmethod
    def _seeds_in_range(cls, value: list[int]) -> list[int]:
        for seed in value:
            problem = seed_problem(seed)
            if problem:
                raise ValueError(problem)
        repeated = sorted({s for s in value if value.count(s) > 1})
        if repeated:
            raise ValueError(f"seeds must be distinct, got {repeated} more than once")
        return value

    @property
    def is_tiny(self) -> bool:
        """A tiny offline model, random (``tiny:``) or trained (``trained:``): one CPU thread suits it."""
        return self.model.startswith(("tiny:", "trained:"))

    @property
    def is_random(self) -> bool:
        """A random-weight tiny model (``tiny:``), whose output is noise."""
        return self.model.startswith("tiny:")

    def setting(self) -> CandidateSpec:
        """The recipe's own setting (tier, backend, options) as a candidate."""
        return CandidateSpec(name=self.name, tier=self.tier, backend=self.backend, options=self.options)

    def reference_spec(self) -> CandidateSpec:
        """The reference as a candidate (what ``bench`` measures speed-ups against)."""
        return CandidateSpec(name=self.reference, tier=self.reference)

    def candidate_specs(self) -> list[CandidateSpec]:
        """The candidates to compare with the reference: the listed ones, else the recipe's own setting."""
        return list(self.candidates) if self.candidates else [self.setting()]

    def apply_arguments(self) -> dict[str, Any]:
        """The keyword arguments :func:`accelpatch.apply` takes for this recipe's own setting."""
        return {"backend": self.backend, "tier": self.tier, **self.options}


def recipe_dirs() -> list[Path]:
    """Where bare recipe names are looked up: ``$ACCELPATCH_RECIPES`` (``os.pathsep``-separated), ``./recipes``,
    then the shipped recipes (:data:`SHIPPED_RECIPES`; in the repository's root, ``./recipes`` is that folder)."""
    dirs = [Path(p) for p in os.environ.get("ACCELPATCH_RECIPES", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "recipes", SHIPPED_RECIPES]
    seen, unique = set(), []
    for d in dirs:
        key = d.resolve() if d.exists() else d
        if key not in seen and d.is_dir():
            seen.add(key)
            unique.append(d)
    return unique


def available_recipes() -> dict[str, Path]:
    """Recipe name → file, over :func:`recipe_dirs` (earlier folders win)."""
    found: dict[str, Path] = {}
    for folder in recipe_dirs():
        for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
            found.setdefault(path.stem, path)
    return found


def schema_errors(error: ValidationError, model: Optional[type[BaseModel]] = None) -> list[str]:
    """One line per problem of a pydantic ``error`` raised validating ``model`` (default :class:`Recipe`): the dotted
    field, what is wrong and the value given; an unknown field gets the allowed names and a close match. Plain text
    for people, without pydantic's error codes and links."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            allowed = _allowed_fields(item["loc"], model or Recipe)
            message = (f"unknown field{did_you_mean(item['loc'][-1], allowed)}; allowed here: "
                       + ", ".join(allowed))
        given = item.get("input")
        shown = "" if item["type"] in ("missing", "extra_forbidden") else f" (got {given!r})"
        lines.append(f"{where}: {message}{shown}")
    return lines


def _allowed_fields(location: tuple, root: type[BaseModel]) -> list[str]:
    """The field names allowed where ``location`` points inside ``root`` (for the unknown-field message)."""
    nested = {"gates": Gates, "bench": BenchSettings, "candidates": CandidateSpec, "lora": LoraSpec}
    model = nested.get(str(location[0]), root) if root is Recipe and len(location) > 1 else root
    return sorted(model.model_fields)


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise RecipeError(f"recipe {path} is not valid YAML: {error}") from None


def load_recipe(recipe: Union[str, os.PathLike, dict, Recipe]) -> Recipe:
    """A :class:`Recipe` from a recipe, a mapping, a YAML path, or a bare name in :func:`recipe_dirs`.

    Raises :class:`RecipeError` naming each bad field and what it allows, or the known recipes when a name is not
    found.
    """
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, dict):
        data, source = recipe, "(mapping)"
    elif isinstance(recipe, (str, os.PathLike)):
        path = Path(recipe)
        if not path.is_file():
            known = available_recipes()
            if str(recipe) not in known:
                hint = did_you_mean(recipe, known)
                raise RecipeError(f"no recipe file or known recipe named {str(recipe)!r}{hint}; known recipes: "
                                  f"{', '.join(known) or 'none'} (looked in {', '.join(map(str, recipe_dirs()))})")
            path = known[str(recipe)]
        data, source = _read_yaml(path), str(path)
        if isinstance(data, dict):
            data = {"name": path.stem, **data}
    else:
        raise RecipeError(f"a recipe is a name, a path, a mapping or a Recipe, got {type(recipe).__name__}")
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {source} must be a mapping of fields, got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as error:
        raise RecipeError(f"recipe {source} does not fit the schema:\n"
                          + "\n".join("  " + line for line in schema_errors(error))) from None

