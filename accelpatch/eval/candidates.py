"""What ``validate`` and ``bench`` share: candidates, switching a pipeline between them, and one timed, seeded call.

A candidate is a tier, optionally with a backend and options (``apply()`` arguments), or ``"unpatched"``.
:class:`PatchSwitcher` puts a pipeline into each candidate's patch state and, at the end, back into exactly the one
it had (also after an exception). :func:`run_call` makes one call with a fresh seeded generator under the
candidate's tier and returns the frames, the audio when the pipeline makes sound (:func:`audio_of`), timings
(transformer time per denoising step and the whole call) and what the counters say ran.
"""
from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Union

import torch

from accelpatch.core.errors import did_you_mean
from accelpatch.recipes import CandidateSpec

__all__ = ["Candidate", "parse_candidate", "parse_candidates", "PatchSwitcher", "CallResult", "run_call",
           "frames_of", "audio_of", "PipelineAudio", "CallTimer"]

#: the public name of a candidate (a pydantic model: ``Candidate(tier="high", backend="sol_attn")``)
Candidate = CandidateSpec
CandidateLike = Union[str, Mapping[str, Any], CandidateSpec]


def parse_candidate(value: CandidateLike) -> CandidateSpec:
    """``"high"``/``"lossless"``/``"exact"``, ``"unpatched"``, a mapping of :class:`Candidate` fields, or a
    :class:`Candidate`. Bad values raise ValueError naming the value, the valid forms and a close match."""
    from pydantic import ValidationError

    from accelpatch.recipes import schema_errors
    from accelpatch.core.tiers import TIER_NAMES

    if isinstance(value, CandidateSpec):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name == "unpatched":
            return CandidateSpec(unpatched=True, tier="exact")
        if name not in TIER_NAMES:
            choices = [*TIER_NAMES, "unpatched"]
            raise ValueError(f"unknown candidate {value!r}{did_you_mean(name, choices)}; a "
                             f"candidate is a tier ({', '.join(TIER_NAMES)}), 'unpatched', a mapping of Candidate "
                             f"fields ({', '.join(CandidateSpec.model_fields)}) or a Candidate")
        return CandidateSpec(tier=name)
    if isinstance(value, Mapping):
        try:
            return CandidateSpec.model_validate(dict(value))
        except ValidationError as error:
            raise ValueError(f"bad candidate {dict(value)!r}: "
                             + "; ".join(schema_errors(error, CandidateSpec))) from None
    raise ValueError(f"a candidate is a tier name, 'unpatched', a mapping of Candidate fields or a Candidate; got "
                     f"{type(value).__name__} {value!r}")


def parse_candidates(values: Iterable[CandidateLike]) -> list[CandidateSpec]:
    """One candidate or a list of them, each as :func:`parse_candidate` takes it; labels must be unique."""
    if isinstance(values, (str, Mapping, CandidateSpec)):
        values = [values]
    elif not isinstance(values, Iterable):
        raise ValueError(f"candidates must be a list of candidates (tier names, 'unpatched', mappings or "
                         f"Candidates), got {type(values).__name__} {values!r}")
    specs = [parse_candidate(v) for v in values]
    if not specs:
        raise ValueError("give at least one candidate")
    labels = [s.label for s in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"candidate labels must be unique, got {duplicates} more than once; give each a name")
    return specs


class PatchSwitcher:
    """Moves a pipeline between candidates' patch states; :meth:`restore` puts back the state it started in."""

    def __init__(self, pipe: Any) -> None:
        from accelpatch.core.patcher import patch_of, transformers_of

        self.pipe = pipe
        self.models = transformers_of(pipe, verb="validate")
        self._original = [(m, None if patch_of(m) is None else patch_of(m).reapply_arguments()) for m in self.models]
        self._pipeline_args = self._original[0][1] if len({repr(a) for _, a in self._original}) == 1 else None
        self._warned: set = set()
        self._vae_state = _vae_tiling_state(pipe)

    def enter(self, spec: CandidateSpec) -> None:
        """Patch (or unpatch) as :meth:`_enter` does; an apply-time warning is shown once per switcher, not again
        each time a candidate's patch is put back on."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._enter(spec)
        for warning in caught:
            key = (warning.category, str(warning.message))
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)

    def _enter(self, spec: CandidateSpec) -> None:
        """Patch (or unpatch) the pipeline as ``spec`` asks; a tier-only candidate keeps the patch the pipeline
        came with (``apply()`` defaults when it came unpatched, except ``exact``, which then runs it unpatched)."""
        import accelpatch

        self._enter_vae_tiling(spec)
        if spec.unpatched:
            accelpatch.remove(self.pipe)
        elif spec.backend is not None or spec.options:
            accelpatch.apply(self.pipe, backend=spec.backend, **spec.options)
        elif self._pipeline_args is not None:
            accelpatch.apply(self.pipe, **self._pipeline_args)  # a no-op when already so
        elif all(args is None for _, args in self._original):
            if spec.tier == "exact":
                accelpatch.remove(self.pipe)  # exact on a pipeline that came unpatched: run it as it came
            else:
                accelpatch.apply(self.pipe)
        else:
            self.restore()

    def _enter_vae_tiling(self, spec: CandidateSpec) -> None:
        """The VAE as it came, then tiled as ``spec.vae_tiling`` asks (its arguments checked against the VAE's
        ``enable_tiling``: a bad name raises ValueError naming it and the valid ones)."""
        vae = getattr(self.pipe, "vae", None)
        _restore_vae_tiling(vae, self._vae_state)
        if not spec.vae_tiling:
            return
        if self._vae_state is None:
            raise ValueError(f"vae_tiling asks {type(self.pipe).__name__}'s VAE to decode in tiles, but "
                             f"{'it has no vae' if vae is None else type(vae).__name__ + ' has no enable_tiling()'}")
        arguments = {} if spec.vae_tiling is True else dict(spec.vae_tiling)
        valid = _tiling_arguments(vae)
        unknown = sorted(set(arguments) - set(valid))
        if unknown:
            raise ValueError(f"vae_tiling: {type(vae).__name__}.enable_tiling() takes no {', '.join(unknown)}"
                             f"{did_you_mean(unknown[0], valid)}; it takes {', '.join(valid) or 'no arguments'}")
        vae.enable_tiling(**arguments)

    def restore(self) -> None:
        """Back to the patch state (and VAE tiling) the pipeline had when this switcher was made."""
        import accelpatch

        _restore_vae_tiling(getattr(self.pipe, "vae", None), self._vae_state)
        if self._pipeline_args is not None:
            accelpatch.apply(self.pipe, **self._pipeline_args)
            return
        for model, args in self._original:
            accelpatch.remove(model)
            if args is not None:
                accelpatch.apply(model, **args)


def _vae_tiling_state(pipe: Any) -> Optional[dict]:
    """The pipeline's VAE's tiling settings (``use_tiling`` and what ``enable_tiling`` sets), or None where it has
    no VAE that tiles."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not callable(getattr(vae, "enable_tiling", None)) or not hasattr(vae, "use_tiling"):
        return None
    return {n: getattr(vae, n) for n in ("use_tiling", *_tiling_arguments(vae)) if hasattr(vae, n)}


def _tiling_arguments(vae: Any) -> list[str]:
    """The argument names of ``vae.enable_tiling`` (the tile sizes and strides it sets as attributes)."""
    return [n for n in inspect.signature(vae.enable_tiling).parameters if n != "self"]


def _restore_vae_tiling(vae: Any, state: Optional[dict]) -> None:
    for name, value in (state or {}).items():
        setattr(vae, name, value)


def frames_of(result: Any) -> torch.Tensor:
    """A pipeline call's video as a float32 CPU tensor (B, F, C, H, W): from ``.frames`` (``output_type="pt"`` or
    "np"), a modular pipeline's state (``videos``), or a tensor."""
    video = result
    if hasattr(video, "frames"):
        video = video.frames
    elif hasattr(video, "get") and not isinstance(video, torch.Tensor):
        video = video.get("videos")
    if isinstance(video, (list, tuple)) and video and not isinstance(video[0], torch.Tensor):
        try:
            import numpy as np

            video = np.stack([np.asarray(v) for v in video])
        except (TypeError, ValueError):
            raise ValueError("cannot read frames from a list of images: call the pipeline with output_type='pt'")
    if not isinstance(video, torch.Tensor):
        try:
            video = torch.from_numpy(video)
            if video.dim() == 5 and video.shape[-1] in (1, 3, 4):
                video = video.permute(0, 1, 4, 2, 3)
        except TypeError:
            raise ValueError(f"cannot read frames from a pipeline result of type {type(result).__name__}; use "
                             "output_type='pt' (or output='videos' for a modular pipeline)") from None
    if video.dim() == 4:
        video = video.unsqueeze(0)
    if video.dim() != 5:
        raise ValueError(f"expected a video shaped (B, F, C, H, W), got shape {tuple(video.shape)}")
    return video.detach().float().cpu()


class PipelineAudio(NamedTuple):
    """A pipeline call's soundtrack: a float32 CPU waveform, (B, C, S) as the pipeline returned it (or (C, S),
    (S,)), and its sample rate in Hz."""

    waveform: torch.Tensor
    sample_rate: int


#: where pipelines put their audio (MiniMax-H3's modular state: ``audio``; diffusers outputs: ``audio``/``audios``)
_AUDIO_KEYS = ("audio", "audios")
#: where they put its sample rate (MiniMax-H3's state: ``sampling_rate``)
_RATE_KEYS = ("sampling_rate", "sample_rate", "audio_sampling_rate", "audio_sample_rate")


def _lookup(result: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if hasattr(result, "get") and not isinstance(result, torch.Tensor):
            value = result.get(key)
        else:
            value = getattr(result, key, None)
        if value is not None:
            return value
    return None


def _pipeline_sample_rate(pipe: Any) -> Optional[int]:
    """The sample rate a pipeline's components declare: MiniMax-H3's ``audio_sampling_rate`` (its audio VAE's
    ``sampling_rate``), else a ``vocoder``'s or ``audio_vae``'s config."""
    rate = getattr(pipe, "audio_sampling_rate", None)
    if rate is not None:
        return rate
    for name in ("vocoder", "audio_vae"):
        config = getattr(getattr(pipe, name, None), "config", None) or {}
        for key in ("output_sampling_rate", "sampling_rate", "sample_rate"):
            value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
            if value is not None:
                return value
    return None


def audio_of(result: Any, pipe: Any = None) -> Optional[PipelineAudio]:
    """A pipeline call's audio and sample rate, or None when it returned none (a video-only pipeline).

    Read from a modular pipeline's state or a dict of its outputs (``audio``, ``sampling_rate``: MiniMax-H3) or a
    diffusers output's ``audio``/``audios``; the sample rate from the result, else from ``pipe``'s audio VAE or
    vocoder. Audio without a sample rate anywhere is an error (it cannot be windowed in seconds)."""
    if isinstance(result, torch.Tensor) or result is None:
        return None
    audio = _lookup(result, _AUDIO_KEYS)
    if audio is None:
        return None
    if isinstance(audio, (list, tuple)):
        audio = torch.stack([torch.as_tensor(a) for a in audio]) if audio else None
        if audio is None:
            return None
    if not isinstance(audio, torch.Tensor):
        try:
            audio = torch.from_numpy(audio)
        except TypeError:
            raise ValueError(f"cannot read the audio of a pipeline result: got {type(audio).__name__}, expected a "
                             "tensor or an array shaped (batch, channels, samples)") from None
    rate = _lookup(result, _RATE_KEYS)
    if rate is None and pipe is not None:
        rate = _pipeline_sample_rate(pipe)
    if rate is None:
        raise ValueError("the pipeline returned audio but no sample rate (looked for sampling_rate/sample_rate on "
                         "the result and on the pipeline's audio_vae/vocoder config)")
    return PipelineAudio(audio.detach().float().cpu(), int(rate))


def _ask_for_audio(pipe: Any, kwargs: dict) -> None:
    """A modular pipeline asked for ``output="videos"`` returns the video alone: ask for its audio and sample rate
    too (absent ones come back as None), so the soundtrack is not dropped on the floor."""
    output = kwargs.get("output")
    if isinstance(output, str) and output == "videos" and hasattr(pipe, "blocks"):
        kwargs["output"] = [output, *_AUDIO_KEYS[:1], _RATE_KEYS[0]]


class CallTimer:
    """Times the transformer forwards of one pipeline call and counts its denoising steps.

    Pre/post forward hooks on each transformer record CUDA events on a GPU (read after the call, so timing adds no
    synchronisation inside it) and ``perf_counter`` on a CPU. A denoising step is a run of consecutive forwards
    with the same ``timestep`` (classifier-free guidance as two calls is one step); a forward whose timestep cannot
    be read counts as a step of its own.
    """

    def __init__(self, models: list[torch.nn.Module], device: torch.device) -> None:
        self.models = models
        self.cuda = device.type == "cuda"
        self._signatures = {id(m): inspect.signature(type(m).forward) for m in models}
        self._handles: list = []
        self.reset()

    def reset(self) -> None:
        self._spans: list = []
        self._open: dict[int, Any] = {}
        self._last_timestep: Any = object()
        self.steps = 0
        self.forwards = 0

    def __enter__(self) -> "CallTimer":
        for m in self.models:
            # first before and last after every other hook: accelpatch's own hooks count as transformer time
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True))
            self._handles.append(m.register_forward_hook(self._post, always_call=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, module, args, kwargs):
        from accelpatch.core.steps import timestep_values

        bound = self._signatures[id(module)].bind_partial(module, *args, **kwargs).arguments
        values = timestep_values(bound.get("timestep"))
        if values is None or values != self._last_timestep:
            self.steps += 1
        self._last_timestep = values if values is not None else object()
        self.forwards += 1
        self._open[id(module)] = self._stamp()

    def _post(self, module, args, output):
        start = self._open.pop(id(module), None)
        if start is not None:
            self._spans.append((start, self._stamp()))

    def transformer_seconds(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self._spans) / 1e3
        return sum(b - a for a, b in self._spans)


@dataclass
class CallResult:
    """One timed, seeded call under one candidate."""

    frames: torch.Tensor
    call_seconds: float
    transformer_seconds: float
    steps: int
    forwards: int
    fast_calls: int = 0
    fast_by_kind: dict[str, int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    #: fast calls by the tier of the site that ran them (step-cache reuses count as "high", the cache's tier)
    fast_by_tier: dict[str, int] = field(default_factory=dict)
    #: the call's soundtrack (float32, CPU) and its sample rate; None when the pipeline returned no audio
    audio: Optional[torch.Tensor] = None
    sample_rate: Optional[int] = None

    @property
    def seconds_per_step(self) -> float:
        """Transformer seconds per denoising step (what accelpatch changes), or the whole call if no step was seen."""
        if self.steps == 0:
            return self.call_seconds
        return self.transformer_seconds / self.steps


def describe_pipeline(pipe: Any) -> str:
    """What a report's header calls a pipeline given no description: its class and the checkpoint it came from
    (``"SanaVideoPipeline (Efficient-Large-Model/SANA-Video_2B_480p_diffusers)"``), as far as it knows them."""
    name = getattr(getattr(pipe, "config", None), "_name_or_path", None) or getattr(pipe, "name_or_path", None)
    if not name:
        transformer = getattr(pipe, "transformer", None)
        name = getattr(getattr(transformer, "config", None), "_name_or_path", None)
    return type(pipe).__name__ + (f" ({name})" if name else "")


def device_of(pipe: Any, models: list[torch.nn.Module]) -> torch.device:
    """Where the pipeline runs: its ``device``, else its first transformer's parameters (a transformer alone)."""
    device = getattr(pipe, "device", None)
    if isinstance(device, torch.device):
        return device
    parameter = next(models[0].parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _counters(models: list[torch.nn.Module]) -> tuple[int, dict, dict, dict, dict]:
    """(fast calls, fast calls by site kind, fallbacks by reason, mean of each site statistic, fast calls by site
    tier) since the reset; transformer calls a step cache reused count as fast calls of kind
    ``step_cache (calls reused)`` and tier high."""
    from accelpatch.core.reporting import build_report, merge_counts

    report = build_report(models, reset=True)
    ran = [site for site in report.sites if site.fast_calls]
    # a step cache that reused is a fast path that ran
    reused = sum((model.cache or {}).get("reused", 0) for model in report.models)
    by_kind = merge_counts([{site.kind: site.fast_calls} for site in ran]
                           + ([{"step_cache (calls reused)": reused}] if reused else []))
    by_tier = merge_counts([{site.tier: site.fast_calls} for site in ran] + ([{"high": reused}] if reused else []))
    return (report.fast_calls + reused, by_kind, dict(report.fallback_calls), mean_by_key(s.stats for s in ran),
            by_tier)


def mean_by_key(mappings: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The mean of each key's finite numeric values over ``mappings`` that have it."""
    values: dict[str, list[float]] = {}
    for mapping in mappings:
        for name, value in mapping.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                values.setdefault(name, []).append(float(value))
    return {name: sum(v) / len(v) for name, v in values.items()}


def run_call(pipe: Any, call_kwargs: Mapping[str, Any], spec: CandidateSpec, seed: int,
             timer: Optional[CallTimer] = None) -> CallResult:
    """One call of ``pipe`` with a generator seeded by ``seed``, under ``spec``'s tier (the pipeline must already
    be in ``spec``'s patch state), timed, with the counters read and reset."""
    import accelpatch

    from accelpatch.core.patcher import transformers_of

    models = transformers_of(pipe, verb="validate")
    device = device_of(pipe, models)
    timer = timer or CallTimer(models, device)
    timer.reset()
    kwargs = dict(call_kwargs)
    kwargs["generator"] = torch.Generator(device="cpu").manual_seed(int(seed))
    _ask_for_audio(pipe, kwargs)
    _counters(models)  # zero what ran before this call
    with timer, accelpatch.quality(spec.tier):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        output = pipe(**kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        call_seconds = time.perf_counter() - start
    fast, by_kind, fallbacks, stats, by_tier = _counters(models)
    audio = audio_of(output, pipe)
    return CallResult(frames=frames_of(output), call_seconds=call_seconds,
                      transformer_seconds=timer.transformer_seconds(), steps=timer.steps, forwards=timer.forwards,
                      fast_calls=fast, fast_by_kind=by_kind, fallbacks=fallbacks, stats=stats,
                      fast_by_tier=by_tier, audio=None if audio is None else audio.waveform,
                      sample_rate=None if audio is None else audio.sample_rate)
