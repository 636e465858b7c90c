"""What ``validate`` and ``bench`` check before the first call: a run of minutes must not fail at its end over an
argument that was wrong from the start.

The target must be a pipeline (not its transformer), the seeds integers, every call argument one the pipeline's
``__call__`` (or a modular pipeline's blocks) takes, the gates a :class:`~accelpatch.recipes.Gates`, and every
candidate's backend and options must apply: :func:`check_candidates` applies each one as the run will, then puts
the pipeline back. Audio gates asked for explicitly on a pipeline that makes no sound are refused
(:func:`check_audio_request` before the run when the pipeline declares its outputs, else after the first reference
call). Each error names the bad value and the valid choices, with a close match where one exists.
"""
from __future__ import annotations

import inspect
import numbers
from typing import Any, Iterable, Mapping, Optional

import torch

from accelpatch.core.errors import did_you_mean
from accelpatch.recipes import CandidateSpec, Gates, call_problems, schema_errors, seed_problem

__all__ = ["require_pipeline", "check_seeds", "check_seed", "accepted_call_arguments", "check_call_arguments",
           "parse_gates", "check_candidates", "pipeline_makes_audio", "check_audio_request", "refuse_audio_request"]


def require_pipeline(pipe: Any, verb: str) -> None:
    """Refuse a transformer (or any module) where a pipeline is needed: ``verb`` calls the pipeline and reads
    frames from what it returns."""
    if isinstance(pipe, torch.nn.Module):
        raise TypeError(f"{verb}() needs a pipeline (it calls pipe(**call_kwargs) and compares the frames it "
                        f"returns), got the module {type(pipe).__name__}: pass the pipeline it belongs to (for "
                        f"example pipe, not pipe.transformer)")
    if not callable(pipe):
        raise TypeError(f"{verb}() needs a pipeline (a diffusers DiffusionPipeline or ModularPipeline), got "
                        f"{type(pipe).__name__}")


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_seeds(seeds: Any) -> list[int]:
    """``seeds`` as a list of distinct integers (at least one). A bare integer is refused rather than guessed at:
    ``seeds=3`` could mean seed 3 or three seeds."""
    if _is_integer(seeds):
        raise TypeError(f"seeds must be a list of integers, got the integer {seeds!r}: write seeds=[{seeds}] for "
                        f"that one seed, or seeds=range({seeds}) for {seeds} seeds")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be a list of integers (seeds=[0, 1]), got {type(seeds).__name__} {seeds!r}")
    seeds = list(seeds)
    bad = [s for s in seeds if not _is_integer(s)]
    if bad:
        raise TypeError(f"seeds must be integers, got {bad[0]!r} ({type(bad[0]).__name__}) in {seeds!r}")
    seeds = [int(s) for s in seeds]
    for seed in seeds:
        problem = seed_problem(seed)
        if problem:
            raise ValueError(problem)
    if not seeds:
        raise ValueError("give at least one seed (seeds=[0])")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seeds must be distinct, got {repeated} more than once in {seeds}")
    return seeds


def check_seed(seed: Any) -> int:
    """One integer seed (``bench`` seeds every call alike)."""
    if not _is_integer(seed):
        raise TypeError(f"seed must be one integer (bench seeds every call with it), got {type(seed).__name__} "
                        f"{seed!r}")
    problem = seed_problem(int(seed))
    if problem:
        raise ValueError(problem)
    return int(seed)


def accepted_call_arguments(pipe: Any) -> Optional[set[str]]:
    """The keyword arguments ``pipe(...)`` takes: the named parameters of its ``__call__``, plus, for a modular
    pipeline, its blocks' inputs. ``None`` when the call takes any keyword and nothing says which count."""
    parameters = inspect.signature(type(pipe).__call__).parameters.values()
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        return names
    inputs = getattr(getattr(pipe, "blocks", None), "inputs", None)  # diffusers' ModularPipeline
    if inputs is None:
        return None
    for spec in inputs:
        names.update(n for n in (getattr(spec, "name", None), getattr(spec, "kwargs_type", None)) if n)
    return names


def check_call_arguments(pipe: Any, call_kwargs: Mapping[str, Any], verb: str) -> None:
    """Refuse call arguments the pipeline would not take (a plain pipeline raises on them at the first call; a
    modular one drops them with a warning, and the run would then test another call than the one written)."""
    if not isinstance(call_kwargs, Mapping):
        raise TypeError(f"call_kwargs must be a mapping of the pipeline call's keyword arguments, got "
                        f"{type(call_kwargs).__name__}")
    if "generator" in call_kwargs:
        raise ValueError(f"call_kwargs must not hold a generator: {verb} seeds each run itself")
    # the scheduler's class names the family where the pipeline's does not (MiniMax-H3 is a ModularPipeline)
    scheduler = getattr(pipe, "scheduler", None)
    family = f"{type(pipe).__name__} {type(scheduler).__name__ if scheduler is not None else ''}"
    problems = call_problems(call_kwargs, family)
    if problems:
        raise ValueError(f"call_kwargs: {'; '.join(problems)}")
    accepted = accepted_call_arguments(pipe)
    if accepted is None:
        return
    unknown = sorted(set(call_kwargs) - accepted)
    if unknown:
        hints = "; ".join(f"{name!r}{did_you_mean(name, accepted)}" for name in unknown)
        raise ValueError(f"{type(pipe).__name__} does not take the call argument(s) {hints}; it takes: "
                         f"{', '.join(sorted(accepted - {'generator'}))}")


def parse_gates(gates: Any) -> Gates:
    """``None`` (the defaults), a :class:`Gates`, or a mapping of its fields; a bad field is named with the allowed
    ones (and a close match), a bad value with its bounds."""
    if gates is None:
        return Gates()
    if isinstance(gates, Gates):
        return gates
    if not isinstance(gates, Mapping):
        raise TypeError(f"gates must be a mapping of {', '.join(Gates.model_fields)} (or accelpatch.recipes.Gates), "
                        f"got {type(gates).__name__} {gates!r}")
    from pydantic import ValidationError

    try:
        return Gates.model_validate(dict(gates))
    except ValidationError as error:
        raise ValueError("bad gates: " + "; ".join(schema_errors(error, Gates))) from None


def check_candidates(target: Any, specs: list[CandidateSpec], switcher: Any = None) -> None:
    """Apply every candidate's patch (backend, options) to ``target`` as the run will, then put ``target`` back in
    the patch state it came in; raise ValueError naming each candidate that does not apply, and why, before any
    call runs. Apply-time warnings are shown here, once."""
    from accelpatch.eval.candidates import PatchSwitcher

    switcher = switcher or PatchSwitcher(target)
    problems = []
    try:
        for spec in specs:
            try:
                switcher.enter(spec)
            except Exception as error:  # noqa: BLE001 - each candidate's reason is reported, the first chained
                problems.append((spec.label, error))
    finally:
        switcher.restore()
    if problems:
        lines = "; ".join(f"candidate {label!r}: {' '.join(str(error).split())}" for label, error in problems)
        raise ValueError(f"{len(problems)} of {len(specs)} candidate(s) cannot be applied to "
                         f"{type(target).__name__} (nothing was run): {lines}") from problems[0][1]


def pipeline_makes_audio(pipe: Any) -> Optional[bool]:
    """Whether ``pipe`` returns audio, when it can be known without a call: a modular pipeline from its blocks'
    declared outputs (``audio``/``audios``: MiniMax-H3 ``t2va``); a pipeline with an ``audio_vae`` or ``vocoder``
    component: True. Otherwise None (the first reference call tells)."""
    outputs = getattr(getattr(pipe, "blocks", None), "outputs", None)
    if outputs is not None:
        names = {getattr(o, "name", None) for o in outputs}
        return bool(names & {"audio", "audios"})
    components = getattr(pipe, "components", None)
    if isinstance(components, Mapping) and any(("audio" in name or "vocoder" in name) and value is not None
                                               for name, value in components.items()):
        return True
    return None


def refuse_audio_request(pipe: Any, gates: Gates, when: str) -> None:
    """Raise the ValueError for audio gates asked of a pipeline that returns no audio (``when``: how we know)."""
    raise ValueError(f"gates ask for audio gates ({gates.describe_audio_request()}), but {type(pipe).__name__} "
                     f"returned no audio ({when}): audio gates need a pipeline that makes sound (MiniMax-H3); drop "
                     f"them for a video-only pipeline (leave audio: auto, the default, to gate audio only when there "
                     f"is some)")


def check_audio_request(pipe: Any, gates: Gates) -> None:
    """Refuse, before any call, audio gates asked for explicitly (:attr:`Gates.audio_required`) on a pipeline
    whose declared outputs hold no audio. A pipeline that declares nothing is checked on its first reference call
    (:func:`refuse_audio_request`)."""
    if gates.audio_required and pipeline_makes_audio(pipe) is False:
        refuse_audio_request(pipe, gates, "its blocks declare the outputs "
                             + ", ".join(sorted(o.name for o in pipe.blocks.outputs)))
