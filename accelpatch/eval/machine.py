"""The conditions a timing ran under, stated with every bench, validate and tune: torch's threads, the cores this
process may use, the processes sharing them, the machine's load.

Timings on a CPU depend on them more than on anything accelpatch does: with torch's default threads on a busy 2-core
machine one setting timed 0.389 s/step ±59 % where one thread gave 0.019, and bench's verdict flipped. So each
report carries them (header and JSON), and an oversubscribed machine (the load above the cores, or torch's threads
times this machine's processes above the cores) is warned about when the timing starts, with what to do.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass
from typing import Optional

import torch

#: how to time on a CPU (the docs say the same: docs/validate.md, "How to time")
ADVICE = ("time on an otherwise idle machine with torch.set_num_threads(1) (or OMP_NUM_THREADS=1), or with at most "
          "the cores divided by the processes sharing them")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _local_processes() -> int:
    """Processes of this job on this machine (torchrun's LOCAL_WORLD_SIZE; else 1)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _load() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class TimingConditions:
    """torch's intra-op threads, the cores this process may run on, this job's processes on the machine, and the
    machine's 1-minute load average when the timing started (None where the platform has none)."""

    threads: int
    cores: int
    processes: int
    load: Optional[float]

    @classmethod
    def now(cls) -> "TimingConditions":
        return cls(threads=torch.get_num_threads(), cores=_cores(), processes=_local_processes(), load=_load())

    @property
    def oversubscribed(self) -> Optional[str]:
        """Why the timing's cores are oversubscribed (None when they are not)."""
        why = []
        if self.threads * self.processes > self.cores:
            why.append(f"torch runs {self.threads} threads" + (
                f" in each of {self.processes} processes" if self.processes > 1 else "") + f" on {self.cores} cores")
        if self.load is not None and self.load > self.cores:
            why.append(f"the machine's load average ({self.load:g}) is above its {self.cores} cores: other work "
                       "competes for them")
        return "; ".join(why) or None

    def describe(self) -> str:
        """``"torch threads 1 on 2 cores, load 0.31"``."""
        text = f"torch threads {self.threads}" + (f" x {self.processes} processes" if self.processes > 1 else "")
        return text + f" on {self.cores} cores" + ("" if self.load is None else f", load {self.load:g}")

    def header_lines(self) -> list[str]:
        """The report lines: a warning line when oversubscribed, else none (the header states :meth:`describe`)."""
        why = self.oversubscribed
        return [] if why is None else [f"  warning: oversubscribed, timings are unreliable: {why}; {ADVICE}"]

    def to_dict(self) -> dict:
        return {**asdict(self), "oversubscribed": self.oversubscribed}


def timing_conditions(what: str) -> TimingConditions:
    """The conditions now; warns (RuntimeWarning) when they are oversubscribed, naming ``what`` is being timed."""
    conditions = TimingConditions.now()
    why = conditions.oversubscribed
    if why is not None:
        warnings.warn(f"accelpatch {what}: the machine is oversubscribed, so its timings are unreliable: {why}. "
                      f"{ADVICE[0].upper()}{ADVICE[1:]}.", RuntimeWarning, stacklevel=3)
    return conditions
