"""``accelpatch.bench``: per-denoising-step time of each candidate, with a verdict that knows about noise.

Each candidate first gets untimed warm-up calls (kernel selection, compilation, caches). Then the timed rounds are
interleaved: every round runs each candidate once, the starting candidate rotating from round to round, so slow
drift of a shared machine hits all candidates alike. The time per step is the time spent inside the transformer
divided by the denoising steps (CUDA events on a GPU); the whole call is timed too. Each candidate's speed-up over
the baseline is the median of the per-round ratios with a distribution-free 95 % interval (6 rounds at least), and is
called noise when the interval contains 1.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

import torch

from accelpatch.recipes import CandidateSpec
from accelpatch.core.reporting import merge_counts
from accelpatch.eval.candidates import (CandidateLike, PatchSwitcher, describe_pipeline, device_of, parse_candidates,
                                       run_call)
from accelpatch.eval.preflight import check_call_arguments, check_candidates, check_seed, require_pipeline
from accelpatch.eval._report_text import TextReport, format_table
from accelpatch.eval.machine import TimingConditions, timing_conditions
from accelpatch.eval.stats import TimingComparison, TimingSummary, compare_timings, summarize

__all__ = ["bench", "BenchReport", "BenchCandidate"]


@dataclass
class BenchCandidate:
    """One candidate's timed rounds and what ran in them."""

    label: str
    spec: CandidateSpec
    seconds_per_step: list[float] = field(default_factory=list)
    call_seconds: list[float] = field(default_factory=list)
    steps: int = 0
    fast_calls: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    vs_baseline: Optional[TimingComparison] = None

    @property
    def summary(self) -> TimingSummary:
        return summarize(self.seconds_per_step)

    def to_dict(self) -> dict:
        return {"label": self.label, "spec": self.spec.model_dump(), "seconds_per_step": self.seconds_per_step,
                "call_seconds": self.call_seconds, "steps_per_call": self.steps, "summary": self.summary.to_dict(),
                "fast_calls": self.fast_calls, "fallbacks": self.fallbacks,
                "vs_baseline": None if self.vs_baseline is None else self.vs_baseline.to_dict()}


@dataclass(repr=False)  # repr is the table (TextReport)
class BenchReport(TextReport):
    """The result of :func:`bench`: a table (``str()``), ``to_dict()``/``to_json()`` (schema ``accelpatch.bench``
    version 1)."""

    baseline: str
    rounds: int
    warmup: int
    device: str
    candidates: list[BenchCandidate]
    description: str = ""
    #: the transformer's parameter dtype ("bfloat16"; "" when unknown)
    dtype: str = ""
    #: torch's threads, the cores, the load when the rounds started (accelpatch.eval.machine)
    conditions: Optional[TimingConditions] = None

    def candidate(self, label: str) -> BenchCandidate:
        for c in self.candidates:
            if c.label == label:
                return c
        raise KeyError(f"no candidate {label!r}; candidates: {', '.join(c.label for c in self.candidates)}")

    def to_dict(self) -> dict:
        return {"kind": "accelpatch.bench", "version": 1, "description": self.description, "device": self.device,
                "dtype": self.dtype, "host": platform.node(), "torch": torch.__version__, "baseline": self.baseline,
                "rounds": self.rounds, "warmup": self.warmup, "timing": "transformer seconds per denoising step",
                "conditions": None if self.conditions is None else self.conditions.to_dict(),
                "candidates": [c.to_dict() for c in self.candidates]}

    def __str__(self) -> str:
        where = self.device + (f", {self.dtype}" if self.dtype else "")
        if self.conditions is not None:
            where += f", {self.conditions.describe()}"
        head = (f"accelpatch bench: {self.description or 'pipeline'} on {where}; {self.rounds} interleaved "
                f"rounds after {self.warmup} warm-up call(s) per candidate; time inside the transformer per "
                "denoising step")
        rows = [("candidate", "median s/step", "spread (p25-p75)", "fast calls", f"vs {self.baseline}")]
        for c in self.candidates:
            s = c.summary
            verdict = "baseline" if c.vs_baseline is None else c.vs_baseline.describe()
            rows.append((c.label, f"{s.median:.4g}", f"{s.p25:.4g}-{s.p75:.4g} (±{s.relative_spread / 2:.1%})",
                         str(c.fast_calls), verdict))
        lines = [head] + ([] if self.conditions is None else self.conditions.header_lines()) + format_table(rows)
        for c in self.candidates:
            lines += [f"  {c.label}: fell back x{n}: {reason}" for reason, n in sorted(c.fallbacks.items())]
        return "\n".join(lines)


def bench(pipe: Any, call_kwargs: Mapping[str, Any], candidates: Iterable[CandidateLike] = ("exact", "high"), *,
          baseline: Optional[str] = None, rounds: int = 7, warmup: int = 1, seed: int = 0, progress: bool = True,
          description: str = "") -> BenchReport:
    """Time ``pipe(**call_kwargs)`` under each candidate (see :func:`accelpatch.validate` for the forms) in
    ``rounds`` interleaved rounds after ``warmup`` untimed calls each; ``baseline`` is a candidate label (default:
    the first). Every call uses the same ``seed``. The pipeline ends in the patch state it started in. Arguments,
    call arguments and every candidate's patch are checked before the first call (as :func:`accelpatch.validate`
    does)."""
    from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets in a notebook

    require_pipeline(pipe, "bench")
    specs = parse_candidates(candidates)
    if not isinstance(rounds, int) or rounds < 2:
        raise ValueError(f"rounds must be an integer >= 2 (a spread needs two samples), got {rounds!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    labels = [s.label for s in specs]
    baseline = labels[0] if baseline is None else baseline
    if baseline not in labels:
        raise ValueError(f"baseline {baseline!r} is not a candidate; candidates: {', '.join(labels)}")
    seed = check_seed(seed)
    check_call_arguments(pipe, call_kwargs, "bench")
    results = {s.label: BenchCandidate(label=s.label, spec=s) for s in specs}
    switcher = PatchSwitcher(pipe)
    check_candidates(pipe, specs, switcher)
    conditions = timing_conditions("bench")
    bar = tqdm(total=len(specs) * (warmup + rounds), desc="accelpatch bench", unit="call", disable=not progress)
    try:
        for spec in specs:
            bar.set_postfix_str(f"warm-up {spec.label}")
            switcher.enter(spec)
            for _ in range(warmup):
                run_call(pipe, call_kwargs, spec, seed)
                bar.update(1)
        for round_index in range(rounds):
            start = round_index % len(specs)
            for spec in specs[start:] + specs[:start]:
                bar.set_postfix_str(f"round {round_index + 1}/{rounds} {spec.label}")
                switcher.enter(spec)
                run = run_call(pipe, call_kwargs, spec, seed)
                entry = results[spec.label]
                entry.seconds_per_step.append(run.seconds_per_step)
                entry.call_seconds.append(run.call_seconds)
                entry.steps = run.steps
                entry.fast_calls += run.fast_calls
                entry.fallbacks = merge_counts([entry.fallbacks, run.fallbacks])
                bar.update(1)
    finally:
        bar.close()
        switcher.restore()
    base = results[baseline]
    for entry in results.values():
        if entry is not base:
            entry.vs_baseline = compare_timings(base.seconds_per_step, entry.seconds_per_step)
    device, dtype = hardware(pipe, switcher.models)
    return BenchReport(baseline=baseline, rounds=rounds, warmup=warmup, device=device, dtype=dtype,
                       candidates=list(results.values()), description=description or describe_pipeline(pipe),
                       conditions=conditions)


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor()), or "" when unknown."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor().strip()


def hardware(pipe: Any, models: list) -> tuple[str, str]:
    """(where ``pipe`` runs, its transformer's dtype), each said once: ``("cuda:0 (NVIDIA H200)", "bfloat16")``,
    ``("cpu (Intel(R) Xeon(R) ...)", "float32")``, ``("cpu", ...)`` when the CPU does not say its name."""
    device = device_of(pipe, models)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    where = f"{device} ({name})" if name and name != device.type else str(device)
    parameter = next(models[0].parameters(), None) if models else None
    dtype = str(parameter.dtype).removeprefix("torch.") if parameter is not None else ""
    return where, dtype
