"""How :func:`accelpatch.tune` asks its questions of a real pipeline: :class:`TuneSetup` (what every validate and
bench call of one tune shares, the reference runs included) and :class:`PipelineOracle` (the search's oracle of
:mod:`accelpatch.eval.tune_search`: validate in batches, bench for speed, the clock for the budget).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from accelpatch.recipes import CandidateSpec, Gates
from accelpatch.eval.stats import compare_timings
from accelpatch.eval.tune_result import Trial
from accelpatch.eval.tune_search import Point
from accelpatch.eval.tune_space import SearchSpace

__all__ = ["REFERENCE_NAME", "TuneSetup", "PipelineOracle", "short_label"]

#: the reference's name among the settings one bench call times
REFERENCE_NAME = "reference"


def short_label(setting: Mapping[str, Any]) -> str:
    """A setting as ``knob=value,...``: the name of its trial and of its candidate in validate and bench."""
    return ",".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in setting.items())


def _scores(result: Any) -> dict:
    """The worst-case scores of one validate CandidateResult (audio ones where validate measures audio)."""
    return {"min_ssim": result.min_ssim, "min_psnr": result.min_psnr,
            "min_audio_snr": getattr(result, "min_audio_snr", None),
            "min_audio_corr": getattr(result, "min_audio_corr", None)}


@dataclass
class TuneSetup:
    """What every validate/bench call of one tune shares."""

    pipe: Any
    call_kwargs: Mapping[str, Any]
    gates: Gates
    seeds: list[int]
    reference: str
    rounds: int
    warmup: int
    #: the reference runs so far (validate's ReferenceRuns), shared by every validate call of this tune
    references: Any = None

    def validate(self, specs: list[CandidateSpec], seeds: Sequence[int]):
        """One validate call for ``specs``; the reference runs of every seed are made once per tune and reused."""
        from accelpatch.eval.validate import validate

        report = validate(self.pipe, self.call_kwargs, specs, reference=self.reference, seeds=list(seeds),
                          gates=self.gates, progress=False, references=self.references)
        self.references = report.references
        return report

    def bench(self, specs: list[CandidateSpec]) -> dict[str, list[float]]:
        """Transformer seconds per step of each spec and of the reference (under ``REFERENCE_NAME``), one value per
        interleaved round of one bench call: any two of them are paired round by round."""
        from accelpatch.eval.bench import bench

        reference = CandidateSpec(name=REFERENCE_NAME, tier=self.reference)
        report = bench(self.pipe, self.call_kwargs, [reference, *specs], baseline=REFERENCE_NAME,
                       rounds=self.rounds, warmup=self.warmup, seed=self.seeds[0], progress=False)
        return {c.label: list(c.seconds_per_step) for c in report.candidates}


class PipelineOracle:
    """The search's oracle on a real pipeline: validate in batches, bench for speed, the clock for the budget.

    The budget bounds the whole tune (search, final timing, held-out check): before validating more settings it
    runs only as many as fit, at the measured seconds per pipeline call, with room left for timing every setting
    tried and the held-out check; so it stops inside a level, between settings. The first setting (the safe point)
    always runs: nothing can be estimated before a call has been timed."""

    def __init__(self, setup: TuneSetup, space: SearchSpace, *, budget_s: Optional[float], clock: Callable[[], float],
                 timer: Optional[Callable], bar: Any, orders: Optional[int], held_out: Sequence[int]) -> None:
        self.setup, self.space, self.budget_s, self.clock, self.bar = setup, space, budget_s, clock, bar
        self.timer = timer
        self.start = clock()
        self.trials: dict[Point, Trial] = {}
        self.orders = orders
        self.held_out = list(held_out)
        # pipeline calls made and the seconds they took: validate's (references included) and bench's
        self.validate_calls, self.validate_seconds = 0, 0.0
        self.bench_calls, self.bench_seconds = 0, 0.0

    # -- quality ------------------------------------------------------------------------------------------------
    def spec(self, point: Point) -> CandidateSpec:
        setting = self.space.setting(point)
        return self.space.spec(point).model_copy(update={"name": short_label(setting)})

    def passes(self, points: list[Point]) -> dict[Point, bool]:
        """Validate ``points`` in order, as many as the budget allows (one validate call for those, after a first
        call of one setting alone when nothing has been timed yet); the answer holds the ones validated."""
        verdicts: dict[Point, bool] = {}
        todo = list(points)
        while todo:
            count = self.affordable(len(todo))
            if not count:
                break
            chunk, todo = todo[:count], todo[count:]
            verdicts.update(self._validate(chunk))
        return verdicts

    def _validate(self, points: list[Point]) -> dict[Point, bool]:
        specs = [self.spec(p) for p in points]
        more = f" (+{len(specs) - 1} more)" if len(specs) > 1 else ""
        self.bar.set_postfix_str(f"validate {specs[0].name}{more}")
        calls = self._validate_calls(len(specs), self.setup.seeds)
        began = self.clock()
        try:
            results = self.setup.validate(specs, self.setup.seeds).candidates
        except Exception as error:  # noqa: BLE001 - a candidate that raises fails; KeyboardInterrupt propagates
            results = self._one_by_one(specs, error)
        self.validate_calls += calls
        self.validate_seconds += self.clock() - began
        for point, spec, result in zip(points, specs, results):
            trial = Trial(point=point, setting=self.space.setting(point), spec=spec, passed=False)
            if isinstance(result, BaseException):
                trial.error = f"{type(result).__name__}: {' '.join(str(result).split())}"
                trial.reasons = [f"raised {trial.error}"]
            else:
                trial.passed = bool(result.passed)
                trial.reasons = list(result.reasons)
                for name, value in _scores(result).items():
                    setattr(trial, name, value)
            self.trials[point] = trial
        self.bar.update(len(points))
        return {p: self.trials[p].passed for p in points}

    def _one_by_one(self, specs: list[CandidateSpec], error: Exception) -> list:
        """A batch raised: validate each candidate alone, so one that raises fails without sinking the others;
        when every one raises (the reference or the call itself is broken), the error propagates."""
        if len(specs) == 1:
            return [error]
        results, errors = [], 0
        for spec in specs:
            try:
                results.append(self.setup.validate([spec], self.setup.seeds).candidates[0])
            except Exception as one:  # noqa: BLE001
                results.append(one)
                errors += 1
        if errors == len(specs):
            raise error
        return results

    # -- speed ----------------------------------------------------------------------------------------------------
    def measure(self, points: list[Point]) -> tuple[list[float], dict[Point, list[float]]]:
        """One interleaved timing of ``points`` and the reference: (the reference's seconds per step per round,
        each point's)."""
        specs = [self.trials[p].spec if p in self.trials else self.spec(p) for p in points]
        self.bar.set_postfix_str(f"bench {len(specs)} setting(s) against the reference")
        began = self.clock()
        raw = self.timer(specs) if self.timer is not None else self.setup.bench(specs)
        self.bench_calls += self._bench_calls(len(specs))
        self.bench_seconds += self.clock() - began
        return list(raw[REFERENCE_NAME]), {p: list(raw[s.name]) for p, s in zip(points, specs)}

    def speed(self, points: list[Point]) -> dict[Point, float]:
        """Speed-ups to order the knobs by; empty when timing them would not leave room for the end."""
        if not self.fits(self.timing_seconds(len(points)) + self.end_seconds(len(self.trials))):
            return {}
        reference, seconds = self.measure(points)
        return {p: compare_timings(reference, s).speedup for p, s in seconds.items()}

    # -- budget ---------------------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.start

    def _validate_calls(self, specs: int, seeds: Sequence[int]) -> int:
        """Pipeline calls of one validate call: each candidate once per seed, the reference twice per seed it has
        not run yet."""
        known = self.setup.references.runs if self.setup.references is not None else {}
        return len(seeds) * specs + 2 * sum(seed not in known for seed in seeds)

    def _bench_calls(self, specs: int) -> int:
        return (self.setup.rounds + self.setup.warmup) * (specs + 1)  # the reference is timed too

    def per_call(self, kind: str = "validate") -> Optional[float]:
        """Measured seconds per pipeline call (bench's falls back on validate's until bench has run)."""
        if kind == "bench" and self.bench_calls:
            return self.bench_seconds / self.bench_calls
        return self.validate_seconds / self.validate_calls if self.validate_calls else None

    def timing_seconds(self, settings: int) -> float:
        """Estimated seconds to time ``settings`` settings against the reference."""
        return (self.per_call("bench") or 0.0) * self._bench_calls(settings)

    def held_out_seconds(self) -> float:
        """Estimated seconds of the held-out check of one setting (its reference runs included)."""
        return (self.per_call() or 0.0) * self._validate_calls(1, self.held_out)

    def end_seconds(self, settings: int) -> float:
        """Estimated seconds of the end after a search that tried ``settings``: timing them, the held-out check."""
        return self.timing_seconds(settings) + self.held_out_seconds()

    def fits(self, seconds: float) -> bool:
        return self.budget_s is None or self.elapsed() + seconds <= self.budget_s

    def affordable(self, wanted: int) -> int:
        """How many of ``wanted`` more settings to validate now: all without a budget; one when no call has been
        timed yet; else the most whose validation, and then the end with them tried, fit in the budget."""
        per_call = self.per_call()
        if self.budget_s is None:
            return wanted
        if per_call is None:
            return 1
        tried = len(self.trials)
        for count in range(wanted, 0, -1):
            validation = per_call * self._validate_calls(count, self.setup.seeds)
            if self.fits(validation + self.end_seconds(tried + count)):
                return count
        return 0

