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

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from accelpatch.recipes import CandidateSpec, Gates, Recipe
from accelpatch.eval._report_text import TextReport, format_table
from accelpatch.eval.machine import TimingConditions, timing_conditions
from accelpatch.eval.stats import TimingComparison, compare_timings
from accelpatch.eval.tune_search import Point, SearchLog, search
from accelpatch.eval.tune_space import SearchSpace, derive_space, parse_budget, parse_space

__all__ = ["tune", "TuneResult", "Trial", "NoPassingSetting"]

REFERENCE_NAME = "reference"


class NoPassingSetting(ValueError):
    """``save_recipe`` on a result without a winner: no setting passed every gate (on the held-out seeds too)."""


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


@dataclass
class Trial:
    """One validated setting: its knob values, verdict, worst-case quality, and speed against the reference."""

    point: Point
    setting: dict
    spec: CandidateSpec
    passed: bool
    min_ssim: Optional[float] = None
    min_psnr: Optional[float] = None
    min_audio_snr: Optional[float] = None
    min_audio_corr: Optional[float] = None
    reasons: list[str] = field(default_factory=list)
    error: Optional[str] = None
    speedup: Optional[float] = None
    speed_low: Optional[float] = None
    speed_high: Optional[float] = None
    held_out_passed: Optional[bool] = None
    held_out_min_ssim: Optional[float] = None
    held_out_min_psnr: Optional[float] = None
    held_out_reasons: list[str] = field(default_factory=list)
    #: the final timing: transformer seconds per step per interleaved round, and the comparison with the reference
    seconds: list[float] = field(default_factory=list)
    vs_reference: Optional[TimingComparison] = None
    #: passing settings only: measurably faster than the reference and than every safer passing setting that is
    #: itself measurably faster than the reference (:func:`_judge_speed`), and why not when it is not
    faster: Optional[bool] = None
    why_not_faster: Optional[str] = None

    @property
    def label(self) -> str:
        return self.spec.name or self.spec.label

    def speed_text(self) -> str:
        """``"1.13x (1.01-1.22) faster"``, ``"1.03x (0.77-1.56) noise"`` or ``"0.90x (0.85-0.95) slower"``: the
        words are bench's (faster only when the interval lies above 1)."""
        if self.speedup is None:
            return "-"
        if self.speed_low is None or self.speed_high is None:
            return f"{self.speedup:.2f}x (interval: too few rounds) noise"
        word = "faster" if self.speed_low > 1.0 else "slower" if self.speed_high < 1.0 else "noise"
        return f"{self.speedup:.2f}x ({self.speed_low:.2f}-{self.speed_high:.2f}) {word}"

    def to_dict(self) -> dict:
        return {"label": self.label, "setting": self.setting, "spec": self.spec.model_dump(), "passed": self.passed,
                "min_ssim": _finite(self.min_ssim), "min_psnr": _finite(self.min_psnr),
                "min_audio_snr": _finite(self.min_audio_snr), "min_audio_corr": _finite(self.min_audio_corr),
                "reasons": self.reasons, "error": self.error, "speedup": self.speedup,
                "speedup_interval": [_finite(self.speed_low), _finite(self.speed_high)],
                "seconds_per_step": self.seconds, "measurably_faster": self.faster,
                "why_not_faster": self.why_not_faster,
                "held_out_passed": self.held_out_passed, "held_out_min_ssim": _finite(self.held_out_min_ssim),
                "held_out_min_psnr": _finite(self.held_out_min_psnr), "held_out_reasons": self.held_out_reasons}


def _short_label(setting: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in setting.items())


def _scores(result: Any) -> dict:
    """The worst-case scores of one validate CandidateResult (audio ones where validate measures audio)."""
    return {"min_ssim": result.min_ssim, "min_psnr": result.min_psnr,
            "min_audio_snr": getattr(result, "min_audio_snr", None),
            "min_audio_corr": getattr(result, "min_audio_corr", None)}


@dataclass
class _Setup:
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


class _PipelineOracle:
    """The search's oracle on a real pipeline: validate in batches, bench for speed, the clock for the budget.

    The budget bounds the whole tune (search, final timing, held-out check): before validating more settings it
    runs only as many as fit, at the measured seconds per pipeline call, with room left for timing every setting
    tried and the held-out check; so it stops inside a level, between settings. The first setting (the safe point)
    always runs: nothing can be estimated before a call has been timed."""

    def __init__(self, setup: _Setup, space: SearchSpace, *, budget_s: Optional[float], clock: Callable[[], float],
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
        return self.space.spec(point).model_copy(update={"name": _short_label(setting)})

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


@dataclass(repr=False)  # repr is the table (TextReport)
class TuneResult(TextReport):
    """The result of :func:`tune`: ``winner`` (None when nothing passed), every ``trials`` entry, ``to_dict()``/
    ``to_json()``, ``save_recipe(path)`` and ``plot(path)`` (speed against worst quality)."""

    winner: Optional[Trial]
    trials: list[Trial]
    space: SearchSpace
    gates: Gates
    reference: str
    seeds: list[int]
    held_out_seeds: list[int]
    elapsed_s: float
    budget_s: Optional[float]
    stopped_by_budget: bool
    grid_points: int
    notes: list[str] = field(default_factory=list)
    #: where the time went: "search", "timing" (every setting tried, against the reference), "held-out check"
    seconds: dict = field(default_factory=dict)
    call: dict = field(default_factory=dict)
    model: Optional[str] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    description: str = ""
    #: torch's threads, the cores, the load when the tune started (accelpatch.eval.machine)
    conditions: Optional[TimingConditions] = None

    @property
    def passed(self) -> bool:
        return self.winner is not None

    @property
    def faster(self) -> bool:
        """Whether the winner is measurably faster (:func:`_judge_speed`); False when tune kept the safest passing
        setting because no setting was."""
        return self.winner is not None and bool(self.winner.faster)

    @property
    def passing(self) -> list[Trial]:
        return [t for t in self.trials if t.passed]

    @property
    def best_failing(self) -> list[Trial]:
        """The failing settings closest to passing (highest worst SSIM, then PSNR), at most three."""
        failing = [t for t in self.trials if not t.passed and t.error is None]
        key = lambda t: (t.min_ssim if t.min_ssim is not None else -1.0,  # noqa: E731
                         t.min_psnr if t.min_psnr is not None else -1.0)
        return sorted(failing, key=key, reverse=True)[:3]

    def to_dict(self) -> dict:
        return {"kind": "accelpatch.tune", "version": 1, "description": self.description, "passed": self.passed,
                "winner": None if self.winner is None else self.winner.to_dict(), "measurably_faster": self.faster,
                "reference": self.reference,
                "seeds": self.seeds, "held_out_seeds": self.held_out_seeds, "gates": self.gates.model_dump(),
                "space": self.space.to_dict(), "grid_points": self.grid_points, "tried": len(self.trials),
                "elapsed_s": self.elapsed_s, "seconds": self.seconds, "budget_s": self.budget_s,
                "stopped_by_budget": self.stopped_by_budget,
                "conditions": None if self.conditions is None else self.conditions.to_dict(),
                "notes": self.notes, "trials": [t.to_dict() for t in self.trials],
                "best_failing": [t.label for t in self.best_failing] if self.winner is None else []}

    def __str__(self) -> str:
        knobs = ", ".join(f"{k.name} {list(k.values)}" for k in self.space.knobs)
        head = (f"accelpatch tune: {self.description or 'pipeline'}; {len(self.trials)} of {self.grid_points} grid "
                f"points validated on seeds {self.seeds} in {self.elapsed_s:.1f} s"
                + (f" (budget {self.budget_s:.0f} s{', reached' if self.stopped_by_budget else ''})"
                   if self.budget_s is not None else ""))
        rows = [("setting", "verdict", "min SSIM", "min PSNR", "audio SNR", "speed vs reference", "held out")]
        for t in sorted(self.trials, key=lambda t: -(t.speedup or 0.0)):
            held = "-" if t.held_out_passed is None else ("PASS" if t.held_out_passed else "FAIL")
            rows.append((t.label + (" *" if t is self.winner else ""), "PASS" if t.passed else "FAIL",
                         "-" if t.min_ssim is None else f"{t.min_ssim:.4f}",
                         "-" if t.min_psnr is None else ("inf" if t.min_psnr == math.inf else f"{t.min_psnr:.2f}"),
                         "-" if t.min_audio_snr is None else f"{t.min_audio_snr:.1f}", t.speed_text(), held))
        timed = [] if self.conditions is None else [f"  timed with {self.conditions.describe()}",
                                                     *self.conditions.header_lines()]
        lines = [head, *timed, f"  knobs (safe → fast): {knobs}"] + format_table(rows)
        lines += [f"  note: {note}" for note in self.notes]
        if self.faster:
            lines.append(f"winner: {self.winner.label} ({self.winner.speed_text()} vs {self.reference})")
        elif self.winner is not None:
            lines.append(f"no setting is measurably faster here: kept the safest passing setting, {self.winner.label} "
                         f"({self.winner.speed_text()} vs {self.reference})")
        else:
            closest = ", ".join(t.label for t in self.best_failing) or "none"
            lines.append(f"no passing setting; closest failing: {closest}")
        return "\n".join(lines)

    def recipe(self, *, template: Optional[Recipe] = None, name: Optional[str] = None,
               model: Optional[str] = None) -> Recipe:
        """The winner as a :class:`Recipe`: ``template`` (the recipe tune ran from) gives the model, call and the
        rest; else ``model``, the pipeline's own name, and the call arguments that fit a YAML file. Raises
        :class:`NoPassingSetting` without a winner. ``measured`` holds ``speedup`` only for a measurably faster
        winner; a kept safest setting gets its interval and ``measurably_faster: false``, no speed-up."""
        if self.winner is None:
            raise NoPassingSetting("tune found no passing setting, so there is no recipe to write; closest failing: "
                                   + (", ".join(t.label for t in self.best_failing) or "none")
                                   + " (loosen the gates, or widen the space towards safer values)")
        w = self.winner
        speed = {"speedup": w.speedup} if self.faster else {}
        measured = {"by": "accelpatch tune", "measurably_faster": self.faster, **speed,
                    "speedup_interval": [_finite(w.speed_low), _finite(w.speed_high)], "versus": self.reference,
                    "speed": w.speed_text() + ("" if self.faster else "; no setting was measurably faster"),
                    "min_ssim": _finite(w.min_ssim), "min_psnr": _finite(w.min_psnr),
                    "seeds": self.seeds, "held_out_seeds": self.held_out_seeds,
                    "held_out_min_ssim": _finite(w.held_out_min_ssim),
                    "held_out_min_psnr": _finite(w.held_out_min_psnr),
                    "tried": len(self.trials), "passing": len(self.passing), "grid_points": self.grid_points,
                    "device": self.device, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if self.conditions is not None:
            measured["timed_with"] = self.conditions.describe()
        for audio in ("min_audio_snr", "min_audio_corr"):
            if getattr(w, audio) is not None:
                measured[audio] = _finite(getattr(w, audio))
        options = {k: v for k, v in w.spec.options.items()}
        speed_words = (f"{w.speed_text()} vs {self.reference}" if self.faster else
                       f"no setting measurably faster than {self.reference}: the safest passing one")
        description = f"tuned by accelpatch tune: {w.label}; {speed_words}" + (
            f", worst SSIM {w.min_ssim:.4f}" if w.min_ssim is not None else "")
        fields: dict[str, Any] = {"name": name or (f"{template.name}-tuned" if template is not None else "tuned"),
                                  "description": description, "tier": "high", "backend": w.spec.backend,
                                  "options": options, "reference": self.reference, "gates": self.gates,
                                  "seeds": self.seeds, "measured": measured, "candidates": None}
        if template is not None:
            return template.model_copy(update=fields)
        model = model or self.model
        if not model:
            raise ValueError("the recipe needs the model it is for: save_recipe(path, model='org/name' or a folder)")
        extra = {"model": model, "call": self.call}
        if self.dtype:
            extra["dtype"] = self.dtype
        if self.device:
            extra["device"] = self.device
        return Recipe.model_validate({**fields, **extra, "gates": self.gates.model_dump()})

    def save_recipe(self, path: str, *, template: Optional[Recipe] = None, name: Optional[str] = None,
                    model: Optional[str] = None) -> Recipe:
        """Write the winner as a recipe YAML file that ``accelpatch.apply(pipe, recipe=path)`` loads; the speed and
        worst-case quality measured go in its ``measured`` block. Raises :class:`NoPassingSetting` without a
        winner."""
        import yaml

        recipe = self.recipe(template=template, name=name, model=model)
        data = recipe.model_dump(exclude_none=True, exclude={"name"})
        data = {k: v for k, v in data.items() if k != "candidates"}
        what = ("the fastest measurably faster setting" if self.faster else
                "no setting was measurably faster: the safest setting")
        text = (f"# written by accelpatch tune: {what} that passed every gate on seeds {self.seeds} "
                f"(and held-out seeds {self.held_out_seeds}) of {len(self.trials)} tried\n")
        text += yaml.safe_dump(data, sort_keys=False)
        with open(path, "w") as handle:
            handle.write(text)
        return recipe

    def plot(self, path: Optional[str] = None):
        """Speed-up against worst SSIM (and audio SNR when measured) of every setting tried (matplotlib figure)."""
        from accelpatch.eval.tune_plot import plot_tune

        return plot_tune(self, path)


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
                specs.append(space.spec(point).model_copy(update={"name": _short_label(space.setting(point))}))
    check_candidates(pipe, specs)


def tune(pipe: Any, call_kwargs: Mapping[str, Any], *, gates: Optional[Gates | Mapping] = None,
         seeds: Sequence[int] = (0,), budget: Any = "30m", space: Any = None,
         held_out_seeds: Optional[Sequence[int]] = None, progress: bool = True, reference: str = "exact",
         rounds: int = 6, warmup: int = 1, orders: Optional[int] = None, explore: bool = False,
         description: str = "",
         _timer: Optional[Callable] = None, _clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Search the settings of the patched ``pipe`` for the fastest one that passes ``gates`` on every seed.

    ``space`` None: the knobs of what ``pipe`` is patched with (step cache, ``sol_attn``, SANA-Video 2.0 anchors;
    see :mod:`accelpatch.eval.tune_space`), else a mapping knob → values. ``budget``: seconds or ``"30m"``/
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
    space = derive_space(pipe, call_kwargs) if space is None else parse_space(pipe, space)
    switcher = PatchSwitcher(pipe)  # the state to end in, whatever happens below
    setup = _Setup(pipe=pipe, call_kwargs=call_kwargs, gates=gates, seeds=seeds, reference=reference,
                   rounds=rounds, warmup=warmup)
    conditions = timing_conditions("tune")
    bar = tqdm(desc="accelpatch tune", unit="setting", disable=not progress)
    notes: list[str] = []
    caught = warnings.catch_warnings(record=True)  # each validate/bench call warns anew: shown once, at the end
    seen = caught.__enter__()
    warnings.simplefilter("always")
    try:
        _check_space_values(pipe, space)
        oracle = _PipelineOracle(setup, space, budget_s=budget_s, clock=_clock, timer=_timer, bar=bar,
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
                trial.speed_low, trial.speed_high = _finite(trial.vs_reference.low), _finite(trial.vs_reference.high)
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


def _budget_note(log: SearchLog, space: SearchSpace, oracle: _PipelineOracle, budget_s: float,
                 explore: bool) -> str:
    """What a budget stop left unexplored: the stage it stopped in, the settings of that batch not validated, the
    stages not reached, and how many grid points were neither validated nor ruled out."""
    from accelpatch.eval.tune_search import STAGES, EXPLORING, unexplored

    later = [stage for stage in STAGES[STAGES.index(log.stopped_in) + 1:] if explore or stage != EXPLORING]
    skipped = [_short_label(space.setting(p)) for p in log.skipped]
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
    """Sort key: safest first (fewest steps from the safe end of the knobs, then by grid position)."""
    return sum(trial.point), trial.point


def _held_out_winner(setup: _Setup, trials: list[Trial], held_out: list[int], notes: list[str],
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
