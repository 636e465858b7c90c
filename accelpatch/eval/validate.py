"""``accelpatch.validate``: is a faster setting still good enough, and did it actually run?

The same call (same seeds) runs under the reference tier and under each candidate. For every candidate the report
gives per-frame PSNR/SSIM against the reference, SHA-256 equality of the frames, which fast paths ran and which
fell back (from the counters) and a pass/fail verdict: ``exact``/``lossless`` candidates must be bit-identical;
approximate ones (and any candidate whose VAE decodes in tiles, ``vae_tiling``) must keep every frame at or above
the SSIM and PSNR floors. A pipeline that returns audio
(MiniMax-H3) has its audio scored too (:mod:`accelpatch.eval.audio_metrics`: SNR, correlation, nMSE, log-spectral
distance per second) and gated by default: bit identity then covers the audio (its SHA-256), and an approximate
candidate fails when either the video floors or the audio gates fail. Audio gates asked for explicitly on a
pipeline without audio are refused. Every candidate's video is also checked over time
(:mod:`accelpatch.eval.temporal_metrics`): its motion energy against the reference's (a band around 1), VBench's
temporal-flicker score against the reference's, the per-frame PSNR's fall from the first quarter of the clip to the
last, degenerate frames (NaN/inf, black, constant: always a failure), and, for an image-to-video call (an ``image``
argument), frame 0 against the conditioning image; the gates are :class:`~accelpatch.recipes.Gates`' temporal
fields, and each failure is named in the verdict. The reference runs twice, so the report also shows its own noise
floor (GPU kernels are not always deterministic), video, audio and temporal: when the reference does not reproduce
itself, bit identity cannot be asked of anyone, and the floors apply to every candidate.
Speed is left to ``bench``: one run per seed, candidate after candidate, cannot tell a speed-up from drift (identical
code read 0.5x to 3.4x), so validate prints no ratio; the raw timings are in the JSON. Every argument, and every
candidate's patch, is checked before the first call (:mod:`accelpatch.eval.preflight`). The pipeline is left in
the patch state it came in, also when a call fails.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from accelpatch.recipes import CandidateSpec, Gates
from accelpatch.core.tiers import Tier, parse_tier
from accelpatch.core.reporting import merge_counts
from accelpatch.eval.candidates import (CandidateLike, CallResult, PatchSwitcher, describe_pipeline, mean_by_key,
                                       parse_candidates, run_call)
from accelpatch.eval.preflight import (check_audio_request, check_call_arguments, check_candidates, check_seeds, parse_gates,
                        refuse_audio_request, require_pipeline)
from accelpatch.eval.machine import timing_conditions
from accelpatch.eval.validate_report import CandidateResult, ReferenceRuns, ValidationReport
from accelpatch.eval.temporal_metrics import conditioning_images
from accelpatch.eval.validate_scores import NoiseFloor, SeedScores, noise_floor_of, psnr_text, score_seed

__all__ = ["validate"]


def _judge(result: CandidateResult, gates: Gates, noise_floor: NoiseFloor) -> None:
    """Fill in the gate, verdict and reasons of ``result``."""
    tier = parse_tier(result.spec.tier)
    temporal_failing = _temporal_failures(result.scores, gates)
    # an unpatched candidate runs at exact; a tiled VAE decode is lossy whatever the tier: judged by the floors
    if tier <= Tier.LOSSLESS and noise_floor.identical and not result.spec.vae_tiling:
        result.gate = "bit-identical"
        result.passed = result.identical and not temporal_failing
        if not result.identical:
            bad = [s.seed for s in result.scores if not s.frames_identical]
            if bad:
                result.reasons.append(f"frames differ from the reference for seeds {bad} (a {tier} candidate must "
                                      "be bit-identical)")
            bad = [s.seed for s in result.scores if not s.audio_identical]
            if bad:
                result.reasons.append(f"audio differs from the reference for seeds {bad} (a {tier} candidate must "
                                      "be bit-identical, its audio too)")
        _add_lines(result.reasons, temporal_failing, "temporal failures")
        return
    result.gate = "floors"
    failing = [(s.seed, i, s.ssim[i], s.psnr[i]) for s in result.scores for i in range(len(s.ssim))
               if not (s.ssim[i] >= gates.ssim_floor and s.psnr[i] >= gates.psnr_floor)]  # NaN fails
    _add_lines(result.reasons, [f"seed {seed} frame {i}: SSIM {ssim:.4f}, PSNR {psnr_text(psnr)} dB below the floors"
                                for seed, i, ssim, psnr in failing], "frames below the floors")
    audio_failing = _audio_failures(result.scores, gates) if gates.gates_audio else []
    _add_lines(result.reasons, audio_failing, "audio windows below the audio gates")
    _add_lines(result.reasons, temporal_failing, "temporal failures")
    result.passed = not failing and not audio_failing and not temporal_failing
    if tier is Tier.HIGH and result.fast_by_tier.get("high", 0) == 0:
        lossless = result.fast_by_tier.get("lossless", 0)
        message = ("no fast path ran (every call took the reference path)" if not lossless else
                   f"no fast path ran at tier high (every high site took the reference path; the {lossless} "
                   "lossless fused call(s) are bit-exact)")
        if gates.require_fast_path:
            result.passed = False
            result.reasons.append(message + "; gates.require_fast_path is set")
        else:
            result.reasons.append(message + ": the verdict says nothing about the fast path")


def _audio_failures(scores: list[SeedScores], gates: Gates) -> list[str]:
    """One line per seed and audio window (or track) that misses an audio gate, naming the gate."""
    lines = []
    for s in scores:
        if s.audio_mismatch is not None:
            lines.append(f"seed {s.seed}: audio cannot be compared ({s.audio_mismatch}); the audio gates fail")
        elif s.audio is not None:
            lines += [f"seed {s.seed} {line}" for line in s.audio.gate_failures(
                snr_floor=gates.audio_snr_floor, corr_floor=gates.audio_corr_floor,
                lsd_ceiling=gates.audio_lsd_ceiling)]
    return lines


def _temporal_failures(scores: list[SeedScores], gates: Gates) -> list[str]:
    """One line per seed, video and temporal gate that fails (degenerate frames always do), naming the metric."""
    lines = []
    for s in scores:
        if s.temporal is not None:
            lines += [f"seed {s.seed}: {line}" for line in s.temporal.gate_failures(
                motion_ratio_min=gates.motion_ratio_min, motion_ratio_max=gates.motion_ratio_max,
                flicker_delta_max=gates.flicker_delta_max, psnr_drift_max_db=gates.psnr_drift_max_db,
                i2v_image=gates.i2v_image, ssim_floor=gates.ssim_floor, psnr_floor=gates.psnr_floor)]
    return lines


def _add_lines(reasons: list[str], lines: list[str], what: str, limit: int = 5) -> None:
    """The first ``limit`` of ``lines`` into ``reasons``, then one line counting the rest as ``what``."""
    reasons += lines[:limit]
    if len(lines) > limit:
        reasons.append(f"... and {len(lines) - limit} more {what}")


def _worst(reference: torch.Tensor, candidate: torch.Tensor, scores: SeedScores, previous):
    index = min(range(len(scores.ssim)), key=scores.ssim.__getitem__)
    if previous is not None and previous[4] <= scores.ssim[index]:
        return previous
    flat_ref = reference.reshape(-1, *reference.shape[-3:])
    flat_cand = candidate.reshape(-1, *candidate.shape[-3:])
    return (flat_ref[index].clone(), flat_cand[index].clone(), index, scores.seed, scores.ssim[index])


def validate(pipe: Any, call_kwargs: Mapping[str, Any], candidates: Iterable[CandidateLike] = ("high",), *,
             reference: str = "exact", seeds: Sequence[int] = (0,), gates: Optional[Gates | Mapping] = None,
             progress: bool = True, description: str = "",
             references: Optional[ReferenceRuns] = None) -> ValidationReport:
    """Run ``pipe(**call_kwargs)`` under ``reference`` (twice) and each candidate, for each seed, and judge them.

    ``candidates``: tier names (``"high"``), ``"unpatched"``, mappings or :class:`accelpatch.eval.Candidate` objects
    (tier plus ``backend``/``options``). ``gates``: :class:`accelpatch.recipes.Gates` or a mapping of its fields
    (default: every frame SSIM >= 0.92 and PSNR >= 24 dB; with audio, every second's SNR >= 10 dB and correlation
    >= 0.95; over time, the motion ratio within [0.8, 1.25], the flicker score at most 0.01 below the reference's,
    the PSNR falling at most 6 dB from the first quarter of the clip to the last, no degenerate frames, and with an
    ``image`` argument frame 0 against it within what the frame floors allow). ``call_kwargs`` must not hold a
    generator (each run gets one seeded from ``seeds``); the output must be readable as frames
    (``output_type="pt"``), and its audio, if any, is read with :func:`~accelpatch.eval.candidates.audio_of`. Audio
    gates asked for explicitly (an ``audio_*`` threshold
    given, or ``audio="required"``) on a pipeline that returns no audio raise ValueError, before the candidates
    run (at the latest after the first reference call). The pipeline ends in
    the patch state it started in. Everything is checked before the first call: the pipeline (not a transformer),
    the seeds (a list of integers), the call arguments (against the pipeline's ``__call__``), the gates, and that
    every candidate's patch applies. No speed is compared here: see :func:`accelpatch.bench`.
    ``references``: a previous report's :attr:`ValidationReport.references` (same pipeline, call arguments and
    reference tier): the seeds it ran are not run again.
    """
    from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets in a notebook

    require_pipeline(pipe, "validate")
    specs = parse_candidates(candidates)
    reference_spec = CandidateSpec(name=f"reference ({reference})", tier=str(parse_tier(reference)))
    gates = parse_gates(gates)
    check_audio_request(pipe, gates)
    seeds = check_seeds(seeds)
    check_call_arguments(pipe, call_kwargs, "validate")
    switcher = PatchSwitcher(pipe)
    check_candidates(pipe, specs, switcher)
    if references is not None and references.reference != reference_spec.tier:
        raise ValueError(f"the references given were run at {references.reference!r}, this validate's reference is "
                         f"{reference_spec.tier!r}: pass reference={references.reference!r} or no references")
    images = conditioning_images(call_kwargs.get("image"))  # image-to-video: frame 0 against it
    kept = ReferenceRuns(reference=reference_spec.tier)
    if references is not None:  # every seed it holds is kept: one object can serve a whole search
        kept.runs.update(references.runs)
        kept.floor_scores.update(references.floor_scores)
        kept.seconds_per_step.update(references.seconds_per_step)
    calls = 2 * sum(seed not in kept.runs for seed in seeds) + len(seeds) * len(specs)
    conditions = timing_conditions("validate")
    bar = tqdm(total=calls, desc="accelpatch validate", unit="call", disable=not progress)
    try:
        if any(seed not in kept.runs for seed in seeds):
            switcher.enter(reference_spec)
        for seed in seeds:
            if seed in kept.runs:
                first = kept.runs[seed]
            else:
                first = run_call(pipe, call_kwargs, reference_spec, seed)
                bar.update(1)
            if gates.audio_required and first.audio is None:
                refuse_audio_request(pipe, gates, "on the first reference call")
            if seed not in kept.runs:
                second = run_call(pipe, call_kwargs, reference_spec, seed)
                bar.update(1)
                kept.runs[seed] = first
                kept.seconds_per_step[seed] = second.seconds_per_step  # the first run includes warm-up
                kept.floor_scores[seed] = score_seed(seed, first, second, images)
        references = {seed: kept.runs[seed] for seed in seeds}
        reference_times = [kept.seconds_per_step[seed] for seed in seeds]
        floor_scores = [kept.floor_scores[seed] for seed in seeds]
        noise = noise_floor_of(floor_scores)
        results = []
        for spec in specs:
            bar.set_postfix_str(spec.label)
            switcher.enter(spec)
            runs: list[CallResult] = []
            scores, worst = [], None
            for seed in seeds:
                run = run_call(pipe, call_kwargs, spec, seed)
                runs.append(run)
                scores.append(score_seed(seed, references[seed], run, images))
                worst = _worst(references[seed].frames, run.frames, scores[-1], worst)
                bar.update(1)
            result = CandidateResult(
                label=spec.label, spec=spec, scores=scores, seconds_per_step=[r.seconds_per_step for r in runs],
                fast_calls=sum(r.fast_calls for r in runs),
                fast_by_kind=merge_counts(r.fast_by_kind for r in runs),
                fast_by_tier=merge_counts(r.fast_by_tier for r in runs),
                fallbacks=merge_counts(r.fallbacks for r in runs), stats=mean_by_key(r.stats for r in runs),
                worst=worst)
            _judge(result, gates, noise)
            results.append(result)
    finally:
        bar.close()
        switcher.restore()
    return ValidationReport(reference=str(parse_tier(reference)), seeds=seeds, gates=gates, noise_floor=noise,
                            reference_seconds_per_step=reference_times, candidates=results,
                            description=description or describe_pipeline(pipe), conditions=conditions, references=kept)
