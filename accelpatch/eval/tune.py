"""``accelpatch.tune``: the fastest setting of a patched pipeline that passes every gate on every seed.

The knobs come from what the pipeline is patched with (:mod:`accelpatch.eval.tune_space`), the search from
:mod:`accelpatch.eval.tune_search` (bisection on monotone knobs, then a greedy combination). Quality verdicts are
:func:`accelpatch.validate`'s (several candidates per call share its reference runs), speed is
:func:`accelpatch.bench`'s (interleaved rounds, a ratio interval against the reference). Everything tried is timed
together at the end, in one bench call (so every two settings are paired round by round).

**A winner must be measurably faster** (:func:`_judge_speed`): the 95 % interval of its speed-up over the reference
lies above 1, and so does the interval of its speed-up over every safer passing setting that is itself measurably
faster than the reference (each knob at the same or a safer index: the search space's order; a safer setting that is
no faster than the reference is no competitor), from the same interleaved rounds (:func:`accelpatch.eval.stats.
compare_timings`, the rule bench's "faster" verdict uses). The fastest such setting is validated again on held-out
seeds before it is returned (if it fails there, the next is, and the result says so). When none is measurably
faster, the result says "no setting is measurably faster here" and keeps the safest passing setting, with no
speed-up claimed for it (a median of 1.03x inside 0.77-1.56 is noise, not a reason to loosen a setting). An
impossible gate returns no winner and the failing settings closest to passing. The pipeline ends in the patch
state it started in, also after an interrupt or an error.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence

from accelpatch.recipes import Gates
from accelpatch.eval.machine import timing_conditions
from accelpatch.eval.stats import compare_timings
from accelpatch.eval.tune_oracle import PipelineOracle, TuneSetup, short_label
from accelpatch.eval.tune_result import Trial, TuneResult, finite
from accelpatch.eval.tune_search import Point, SearchLog, search
from accelpatch.eval.tune_space import SearchSpace, derive_space, parse_budget, parse_space

__all__ = ["tune"]


def _default_held_out(seeds: list[int]) -> list[int]:
    return [max(seeds) + 1]


def _dtype_name(pipe: Any) -> tuple[Optional[str], Optional[str]]:
    import torch

    from accelpatch.core.patcher import transformers_of

    parameter = next(transformers_of(pipe, verb="tune")[0].parameters(), None)
    if parameter is None:
        return None, None
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return names.get(parameter.dtype), parameter.device.type


def _plain_call(call_kwargs: Mapping[str, Any]) -> tuple[dict, list[str]]:
    """The call arguments a YAML recipe can hold (numbers, strings, booleans, lists of those), and the others."""
    plain, other = {}, []
    scalar = (str, int, float, bool, type(None))
    for key, value in call_kwargs.items():
        listed = isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value)
        if isinstance(value, scalar) or listed:
            plain[key] = list(value) if isinstance(value, tuple) else value
        else:
            other.append(key)
    return plain, other


def _check_space_values(pipe: Any, space: SearchSpace) -> None:
    """Every knob value applies to this model (each alone, the others at their safest), before any call runs."""
    from accelpatch.eval.preflight import check_candidates

    specs, seen = [], set()
    for k, knob in enumerate(space.knobs):
        for i in range(len(knob.values)):
            point = tuple(i if j == k else 0 for j in range(len(space.knobs)))
            if point not in seen:
                seen.add(point)
                specs.append(space.spec(point).model_copy(update={"name": short_label(space.setting(point))}))
    check_candidates(pipe, specs)


def tune(pipe: Any, call_kwargs: Mapping[str, Any], *, gates: Optional[Gates | Mapping] = None,
         seeds: Sequence[int] = (0,), budget: Any = "30m", space: Any = None,
         held_out_seeds: Optional[Sequence[int]] = None, progress: bool = True, reference: str = "exact",
         rounds: int = 6, warmup: int = 1, orders: Optional[int] = None, explore: bool = False,
         description: str = "",
         _timer: Optional[Callable] = None, _clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Search the settings of the patched ``pipe`` for the fastest one that passes ``gates`` on every seed.

    ``space`` None: the knobs of what ``pipe`` is patched with (step cache, ``sol_attn``, SANA-Video 2.0 anchors;
    see :mod:`accelpatch.eval.tune_space`), else a mapping knob → values. Under ``sol_attn`` that is ``tau``,
    ``dense_steps`` (the current value, 0.3, 0.2, 0.1 of the call's steps and 0, one per step count: at most 5),
    ``dense_last_steps`` (the current value, 1, 0: at most 3), ``dense_layers`` (at most 5) and ``min_tokens`` (a
    floor only where it keeps some but not all of the call's Sol-Attn calls dense, measured by a one-step probe
    call; at most 3): at most 1,350 grid points, of which the search validates a few dozen at most. The progress
    output says what is searched. ``budget``: seconds or ``"30m"``/
    ``"90s"``/``"1h"`` (None: no limit) bounds the whole tune: the search validates a setting only when it and the
    end (timing everything tried, ``rounds`` interleaved rounds after ``warmup``, and the held-out validation) fit,
    at the seconds per call measured so far, so it stops between settings, also inside a level; the notes say what
    was left unexplored and where the time went, and the result is the best of what was validated.
    ``held_out_seeds`` (default: one seed after ``seeds``) must not overlap ``seeds``. ``explore``: after the
    bisections, keep validating untried points (fastest predicted first) until the budget ends: knobs are not always
    monotone on a real model (a guard that moves which steps a cache reuses).
    ``gates`` go to :func:`accelpatch.validate` as they are. The pipeline ends in the patch state it started in, also
    after KeyboardInterrupt or an error. The winner is measurably faster than the reference and every safer passing
    setting that is itself faster than the reference, else the safest passing setting is kept and the result says no setting is measurably faster (module
    docstring). ``_timer(specs) -> {name: seconds per round}`` (with ``REFERENCE_NAME``'s, all from
    the same interleaved rounds) and ``_clock`` replace bench and the clock (tests).
    """
    from tqdm import tqdm

    from accelpatch.eval.candidates import PatchSwitcher, describe_pipeline
    from accelpatch.eval.preflight import check_call_arguments, check_seeds, parse_gates, require_pipeline

    require_pipeline(pipe, "tune")
    budget_s = None if budget is None else parse_budget(budget)
    gates = parse_gates(gates)
    seeds = check_seeds(seeds)
    held_out = _default_held_out(seeds) if held_out_seeds is None else check_seeds(held_out_seeds)
    overlap = sorted(set(seeds) & set(held_out))
    if overlap:
        raise ValueError(f"held_out_seeds must not overlap seeds (a held-out check on a search seed checks nothing); "
                         f"both have {overlap}")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 2:
        raise ValueError(f"rounds must be an integer >= 2 (bench needs two samples; 6 for a 95 % interval), got "
                         f"{rounds!r}")
    if orders is not None and (not isinstance(orders, int) or isinstance(orders, bool) or orders < 1):
        raise ValueError(f"orders must be None (one greedy pass per knob) or an integer >= 1, got {orders!r}")
    check_call_arguments(pipe, call_kwargs, "tune")
    space = derive_space(pipe, call_kwargs) if space is None else parse_space(pipe, space, call_kwargs)
    switcher = PatchSwitcher(pipe)  # the state to end in, whatever happens below
    setup = TuneSetup(pipe=pipe, call_kwargs=call_kwargs, gates=gates, seeds=seeds, reference=reference,
                   rounds=rounds, warmup=warmup)
    conditions = timing_conditions("tune")
    bar = tqdm(desc="accelpatch tune", unit="setting", disable=not progress)
    if progress:
        tqdm.write(searched_text(space, call_kwargs), file=sys.stderr)
    notes: list[str] = []
    caught = warnings.catch_warnings(record=True)  # each validate/bench call warns anew: shown once, at the end
    seen = caught.__enter__()
    warnings.simplefilter("always")
    try:
        _check_space_values(pipe, space)
        oracle = PipelineOracle(setup, space, budget_s=budget_s, clock=_clock, timer=_timer, bar=bar,
                                 orders=orders, held_out=held_out)
        log: SearchLog = search(space.sizes, oracle, orders=orders, explore=explore)
        marks = [oracle.elapsed()]  # the end of the search, of the timing, of the held-out check
        trials = list(oracle.trials.values())
        if log.stopped_by_budget:
            notes.append(_budget_note(log, space, oracle, budget_s, explore))
        if trials and not oracle.fits(oracle.end_seconds(len(trials))):
            notes.append(f"no time left in the budget ({budget_s:.0f} s) to time the {len(trials)} setting(s) "
                         f"tried (about {oracle.timing_seconds(len(trials)):.0f} s): no speed was measured")
        elif trials:
            reference_seconds, timed = oracle.measure([t.point for t in trials])
            for point, seconds in timed.items():
                trial = oracle.trials[point]
                trial.seconds, trial.vs_reference = seconds, compare_timings(reference_seconds, seconds)
                trial.speedup = trial.vs_reference.speedup
                trial.speed_low, trial.speed_high = finite(trial.vs_reference.low), finite(trial.vs_reference.high)
            _judge_speed(trials, reference)
        marks.append(oracle.elapsed())
        winner = _held_out_winner(setup, trials, held_out, notes, bar)
        marks.append(oracle.elapsed())
        elapsed = marks[-1]
        times = {"search": marks[0], "timing": marks[1] - marks[0], "held-out check": marks[2] - marks[1]}
        if budget_s is not None:
            spent = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in times.items())
            notes.append(f"time: {spent} (budget {budget_s:.0f} s" + (
                f"; {elapsed - budget_s:.1f} s over it: the first setting alone, or the end, took longer than "
                "estimated from the calls before)" if elapsed > budget_s else ")"))
        if not log.passing:
            notes.append("no setting tried passed on the search seeds" + (
                " (the safest setting of the space fails: every looser one is taken to fail too)"
                if log.results and not next(iter(log.results.values())) else ""))
    finally:
        bar.close()
        try:
            switcher.restore()
        finally:
            caught.__exit__(None, None, None)
            _warn_once(seen)
    call, omitted = _plain_call(call_kwargs)
    if omitted:
        notes.append(f"call arguments not written to a recipe (not plain values): {', '.join(omitted)}")
    dtype, device = _dtype_name(pipe)
    model = getattr(getattr(pipe, "config", None), "_name_or_path", None) or getattr(pipe, "name_or_path", None)
    return TuneResult(winner=winner, trials=trials, space=space, gates=gates, reference=reference, seeds=seeds,
                      held_out_seeds=held_out, elapsed_s=elapsed, seconds=times, budget_s=budget_s,
                      stopped_by_budget=log.stopped_by_budget, grid_points=space.size(), notes=notes, call=call,
                      model=model or None, dtype=dtype, device=device,
                      description=description or describe_pipeline(pipe), conditions=conditions)


def searched_text(space: SearchSpace, call_kwargs: Mapping[str, Any]) -> str:
    """What a tune searches, for its progress output: each knob's values safe → fast (step counts with the steps
    they keep in this call: ``0.2 (10 of 50)``), the values fixed, and the grid's size."""
    from accelpatch.core.steps import step_count
    from accelpatch.eval.tune_space import STEP_KNOBS, _steps_of

    steps = _steps_of(call_kwargs)

    def shown(name: str, value: Any) -> str:
        if name in STEP_KNOBS and isinstance(value, float):
            return f"{value:g} ({step_count(value).of(steps)} of {steps} steps)"
        return repr(value) if isinstance(value, str) else f"{value}"

    knobs = "; ".join(f"{k.name} [{', '.join(shown(k.name, v) for v in k.values)}]" for k in space.knobs)
    fixed = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in space.options.items())
    return (f"accelpatch tune: searching {knobs} (safe → fast; {space.size()} grid points)"
            + (f"; fixed: {fixed}" if fixed else ""))


def _budget_note(log: SearchLog, space: SearchSpace, oracle: PipelineOracle, budget_s: float,
                 explore: bool) -> str:
    """What a budget stop left unexplored: the stage it stopped in, the settings of that batch not validated, the
    stages not reached, and how many grid points were neither validated nor ruled out."""
    from accelpatch.eval.tune_search import STAGES, EXPLORING, unexplored

    later = [stage for stage in STAGES[STAGES.index(log.stopped_in) + 1:] if explore or stage != EXPLORING]
    skipped = [short_label(space.setting(p)) for p in log.skipped]
    shown = "; ".join(skipped[:4]) + (f" and {len(skipped) - 4} more" if len(skipped) > 4 else "")
    return (f"the budget ({budget_s:.0f} s) stopped the search while {log.stopped_in}, after {len(oracle.trials)} "
            f"setting(s)" + (f"; not validated: {shown}" if skipped else "")
            + (f"; not reached: {', '.join(later)}" if later else "")
            + f"; {len(unexplored(space.sizes, log))} of the grid's {space.size()} settings were neither validated "
            "nor ruled out by a failing safer one. The result is the best of what was validated")


def _warn_once(caught: list) -> None:
    """Show each distinct warning recorded during a tune once."""
    shown = set()
    for warning in caught:
        key = (warning.category, str(warning.message))
        if key not in shown:
            shown.add(key)
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _safer(a: Point, b: Point) -> bool:
    """``a`` is a safer setting than ``b``: every knob at the same or a safer index (the space's order), not equal."""
    return a != b and all(i <= j for i, j in zip(a, b))


def _judge_speed(trials: list[Trial], reference: str) -> None:
    """Set ``faster`` on each passing, timed trial: True when the interval of its speed-up over the reference lies
    above 1 and, for every safer passing trial that is itself measurably faster than the reference, so does the
    interval of its speed-up over that one (paired ratios of the same interleaved rounds, :func:`compare_timings`).

    Both halves of the rule hold: noise is never crowned (a setting whose interval over the reference reaches 1 is
    not faster, nor is one that cannot be told from a safer win: the safer one is as good and is kept), and a
    measured win is never hidden (the safest trial measurably faster than the reference has no safer win to lose to,
    so some trial is faster whenever one beat the reference). A safer setting that is no faster than the reference
    is no competitor: being indistinguishable from it says nothing against a measured win."""
    passing = [t for t in trials if t.passed and t.vs_reference is not None]
    wins = [t for t in passing if t.vs_reference.faster]
    for trial in passing:
        trial.faster, trial.why_not_faster = True, None
        if not trial.vs_reference.faster:
            trial.faster = False
            trial.why_not_faster = f"not measurably faster than {reference}: {trial.speed_text()}"
            continue
        for safer in sorted((t for t in wins if _safer(t.point, trial.point)), key=_safety):
            versus = compare_timings(safer.seconds, trial.seconds)
            if not versus.faster:
                trial.faster = False
                trial.why_not_faster = (f"not measurably faster than the safer passing setting {safer.label} "
                                        f"({safer.speed_text()} against {reference}): {versus.describe()}")
                break


def _safety(trial: Trial) -> tuple:
    """Sort key: safest first (fewest steps from the safe end of the knobs, then by grid position). Index 0 is each
    knob's safest value (:mod:`accelpatch.eval.tune_space`): more dense steps, a dense tail, a higher
    ``min_tokens`` floor, a lower ``tau``, more dense layers, a lower cache threshold."""
    return sum(trial.point), trial.point


def _held_out_winner(setup: TuneSetup, trials: list[Trial], held_out: list[int], notes: list[str],
                     bar: Any) -> Optional[Trial]:
    """The fastest measurably faster passing trial that also passes on the held-out seeds; when none is measurably
    faster (or none of those passes there), the safest passing trial that does, and a note that says so."""
    passing = [t for t in trials if t.passed]
    faster = sorted((t for t in passing if t.faster), key=lambda t: -t.speedup)
    for rank, trial in enumerate(faster + sorted((t for t in passing if not t.faster), key=_safety)):
        bar.set_postfix_str(f"held-out seeds {held_out}: {trial.label}")
        result = setup.validate([trial.spec], held_out).candidates[0]
        trial.held_out_passed = bool(result.passed)
        trial.held_out_min_ssim, trial.held_out_min_psnr = result.min_ssim, result.min_psnr
        trial.held_out_reasons = list(result.reasons)
        if trial.held_out_passed:
            if trial.faster and rank:
                notes.append(f"{rank} faster setting(s) failed on the held-out seeds {held_out}; the winner is the "
                             f"next fastest that passed there: {trial.label}")
            elif not trial.faster:
                notes.append(f"no setting is measurably faster here: kept the safest passing setting, {trial.label}"
                             + (f" ({len(faster)} measurably faster setting(s) failed on the held-out seeds)"
                                if faster else ""))
                best = max((t for t in passing if t.speedup is not None), key=lambda t: t.speedup, default=None)
                if best is not None and best is not trial and best.why_not_faster:
                    notes.append(f"the highest median, {best.label}, is {best.why_not_faster}")
            return trial
        notes.append(f"{trial.label} passed on seeds {setup.seeds} but failed on the held-out seeds {held_out}: "
                     + ("; ".join(trial.held_out_reasons[:2]) or "gate failed"))
    return None
