"""What :func:`accelpatch.tune` returns: every setting tried (:class:`Trial`, its verdict, worst-case quality and
speed against the reference) and the :class:`TuneResult` around them (the table, JSON, the winner as a recipe, the
plot). Built by :mod:`accelpatch.eval.tune`; the plot is :mod:`accelpatch.eval.tune_plot`'s, which takes the result
it draws.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from accelpatch.recipes import CandidateSpec, Gates, Recipe
from accelpatch.eval._report_text import TextReport, format_table
from accelpatch.eval.machine import TimingConditions
from accelpatch.eval.stats import TimingComparison
from accelpatch.eval.tune_search import Point
from accelpatch.eval.tune_space import SearchSpace

__all__ = ["TuneResult", "Trial", "NoPassingSetting", "finite"]


class NoPassingSetting(ValueError):
    """``save_recipe`` on a result without a winner: no setting passed every gate (on the held-out seeds too)."""


def finite(value: Optional[float]) -> Optional[float]:
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
    #: itself measurably faster than the reference (:func:`accelpatch.eval.tune._judge_speed`), and why not when it
    #: is not
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
                "min_ssim": finite(self.min_ssim), "min_psnr": finite(self.min_psnr),
                "min_audio_snr": finite(self.min_audio_snr), "min_audio_corr": finite(self.min_audio_corr),
                "reasons": self.reasons, "error": self.error, "speedup": self.speedup,
                "speedup_interval": [finite(self.speed_low), finite(self.speed_high)],
                "seconds_per_step": self.seconds, "measurably_faster": self.faster,
                "why_not_faster": self.why_not_faster,
                "held_out_passed": self.held_out_passed, "held_out_min_ssim": finite(self.held_out_min_ssim),
                "held_out_min_psnr": finite(self.held_out_min_psnr), "held_out_reasons": self.held_out_reasons}



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
        """Whether the winner is measurably faster (:func:`accelpatch.eval.tune._judge_speed`); False when tune kept
        the safest passing setting because no setting was."""
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
                    "speedup_interval": [finite(w.speed_low), finite(w.speed_high)], "versus": self.reference,
                    "speed": w.speed_text() + ("" if self.faster else "; no setting was measurably faster"),
                    "min_ssim": finite(w.min_ssim), "min_psnr": finite(w.min_psnr),
                    "seeds": self.seeds, "held_out_seeds": self.held_out_seeds,
                    "held_out_min_ssim": finite(w.held_out_min_ssim),
                    "held_out_min_psnr": finite(w.held_out_min_psnr),
                    "tried": len(self.trials), "passing": len(self.passing), "grid_points": self.grid_points,
                    "device": self.device, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if self.conditions is not None:
            measured["timed_with"] = self.conditions.describe()
        for audio in ("min_audio_snr", "min_audio_corr"):
            if getattr(w, audio) is not None:
                measured[audio] = finite(getattr(w, audio))
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

