"""The frame of the GPU evidence run: sections with time budgets, the context a section runs in, failure capture,
the plain-text table and the JSON file.

A section is one function ``run(ctx)`` that appends rows through ``ctx.add``, and one function ``builds(ctx)`` that
names the models and inputs it runs on (so that ``--dry-run`` can build them on the meta device, at GPU sizes, in
seconds). It has a soft budget (its sweeps stop starting new points once the budget is spent, and say so in the
notes) and a hard limit (an alarm interrupts it). Any exception, the hard limit included, marks that section
``"error"`` with its message; the rows it had already added are kept, and the next section runs. Warnings raised
inside a section are kept with it.
"""
from __future__ import annotations

import contextlib
import gc
import math
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

#: the hard limit of a section: its budget times this (at most the run's time left) plus HARD_LIMIT_SLACK_S
HARD_LIMIT_FACTOR = 1.5
HARD_LIMIT_SLACK_S = 30.0
MAX_CELL = 46


class SectionTimeout(BaseException):
    """The section ran past its hard limit. A ``BaseException`` (like ``KeyboardInterrupt``), not an ``Exception``:
    the alarm can fire anywhere, also inside a fast path whose ``except Exception`` would record it as that fast
    path's failure and run the reference on past the limit; only :func:`run_section` catches it."""


@dataclass(frozen=True)
class Options:
    """What every section reads: where to run, how often to repeat, and sweep overrides from the command line."""

    dry_run: bool
    device: str
    repeats: int
    taus: Optional[tuple[float, ...]] = None
    kv_splits: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class Section:
    name: str
    budget_s: float
    run: Callable[["Context"], None]
    summary: str
    #: ``builds(ctx)``: [(label, thunk)], each thunk building one model and its inputs as ``run`` does
    builds: Optional[Callable[["Context"], list[tuple[str, Callable[[], Any]]]]] = None


@dataclass
class Context:
    """One section's run: its options, budget, rows, notes and the facts about the shapes it used."""

    section: str
    options: Options
    budget_s: float
    started: float = field(default_factory=time.perf_counter)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def dry_run(self) -> bool:
        return self.options.dry_run

    @property
    def device(self) -> str:
        return self.options.device

    @property
    def repeats(self) -> int:
        return self.options.repeats

    def taus(self, default: Iterable[float]) -> tuple[float, ...]:
        """The tau sweep: ``--taus`` when given, else the section's default."""
        return tuple(self.options.taus) if self.options.taus else tuple(default)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def time_left(self) -> float:
        return self.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[{self.section} {self.elapsed():7.1f} s] {message}", flush=True)

    def describe(self, **facts: Any) -> None:
        """Record what was run (shapes, dtypes, configs): kept under ``setup`` in the JSON and logged."""
        self.setup.update(facts)
        for key, value in facts.items():
            self.log(f"{key}: {value}")

    def add(self, **row: Any) -> None:
        self.rows.append(row)
        self.log("  ".join(f"{key}={cell(value)}" for key, value in row.items()))

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.log(f"note: {text}")

    def sweep(self, values: Iterable[Any], what: str) -> Iterator[Any]:
        """Yield ``values`` while the budget lasts; the first is always run, the skipped rest are noted."""
        values = list(values)
        for index, value in enumerate(values):
            if index and self.time_left() <= 0:
                self.note(f"time budget ({self.budget_s:.0f} s) spent: skipped {what} {values[index:]}")
                return
            yield value


@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`SectionTimeout` in the main thread after ``seconds`` (no-op where SIGALRM is unavailable)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum, _frame):
        raise SectionTimeout(f"ran past its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def hard_limit_s(budget_s: float, time_cap: float) -> float:
    """A section's hard limit: its budget times HARD_LIMIT_FACTOR plus HARD_LIMIT_SLACK_S, never past the run's
    time left (``time_cap``), so that the run as a whole keeps to ``--time-limit``."""
    return max(1.0, min(budget_s * HARD_LIMIT_FACTOR + HARD_LIMIT_SLACK_S, time_cap))


def _release_memory(device: str) -> Optional[float]:
    """Free what the section left behind; the section's peak GPU memory in GiB (None off CUDA)."""
    gc.collect()
    if torch.device(device).type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated() / 2 ** 30
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return peak


def _injected_failure(ctx: Context) -> None:
    raise RuntimeError(f"injected failure (--inject-failure {ctx.section})")


def _warning_texts(caught: list) -> list[str]:
    texts = []
    for item in caught:
        text = f"{item.category.__name__}: {item.message}"
        if text not in texts:
            texts.append(text)
    return texts


def run_section(section: Section, options: Options, *, time_cap: float, inject_failure: bool = False) -> dict:
    """Run one section within ``min(its budget, time_cap)`` and return its JSON entry; never raises an
    ``Exception`` (a KeyboardInterrupt still stops the run)."""
    ctx = Context(section.name, options, budget_s=max(1.0, min(section.budget_s, time_cap)))
    ctx.log(f"start, budget {ctx.budget_s:.0f} s: {section.summary}")
    run = _injected_failure if inject_failure else section.run
    result: dict[str, Any] = {"status": "ok", "summary": section.summary}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            with hard_limit(hard_limit_s(ctx.budget_s, time_cap)):
                run(ctx)
        except (Exception, SectionTimeout) as error:  # noqa: BLE001 - one section's failure must not stop the others
            result.update(status="error", error=f"{type(error).__name__}: {error}",
                          traceback=traceback.format_exc(limit=-6).splitlines()[-12:])
            ctx.log(f"ERROR {result['error']}")
    if result["status"] == "ok" and not ctx.rows:
        result.update(status="error", error="the section finished without a single row")
    result.update(seconds=round(ctx.elapsed(), 3), budget_s=ctx.budget_s, setup=ctx.setup, rows=ctx.rows)
    if ctx.notes:
        result["notes"] = ctx.notes
    if caught:
        result["warnings"] = _warning_texts(caught)
    peak = _release_memory(options.device)
    if peak is not None:
        result["peak_gib"] = round(peak, 2)
    ctx.log(f"{result['status']} in {result['seconds']:.1f} s")
    return result


def skipped(section: Section, reason: str) -> dict:
    return {"status": "skipped", "summary": section.summary, "seconds": 0.0, "reason": reason, "rows": []}


# -- output ------------------------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    """A value as a table cell: 4 significant digits, yes/no, '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for row in rows:
        keys.extend(key for key in row if key not in keys)
    table = [keys] + [[cell(row.get(key)) for key in keys] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(keys))]
    return ["  " + "  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in table]


def format_table(sections: dict[str, dict]) -> str:
    """Every section: a header with its status and time, its rows as aligned columns, its error or notes."""
    lines = []
    for name, result in sections.items():
        lines.append(f"== {name}: {result['status']} ({result['seconds']:.1f} s) ==")
        if result.get("reason"):
            lines.append(f"  {result['reason']}")
        if result["rows"]:
            lines.extend(_columns(result["rows"]))
        for note in result.get("notes", ()):
            lines.append(f"  note: {note}")
        if result.get("warnings"):
            lines.append(f"  warnings: {len(result['warnings'])} (listed in the JSON)")
        if result.get("error"):
            lines.append(f"  ERROR: {result['error']}")
        lines.append("")
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """``value`` with infinite or NaN floats as None (strict JSON has no inf: a PSNR of identical outputs), tuples
    as lists and anything else JSON cannot hold as its string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
