"""Cost of patching, shared by the per-model patching benchmarks: per-forward time measured side by side (patched and
unpatched rounds of the same model alternate, apply/remove between rounds, the order flipping every round; the
ratio of the medians is the overhead), and the time of apply()/remove() themselves."""
from __future__ import annotations

import contextlib
import statistics
import time
import warnings

import torch

import accelpatch


def patched_vs_unpatched(model, inputs: dict, *, rounds: int, forwards: int, label: str,
                         tier: str | None = None) -> tuple[float, float, float]:
    """(unpatched s/forward, patched s/forward, overhead fraction); prints one line. ``tier``: the patched
    forwards run inside ``quality(tier)`` (default: the model's default tier)."""
    times = {"unpatched": [], "patched": []}
    context = (lambda: accelpatch.quality(tier)) if tier else contextlib.nullcontext
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply() warns about rejected sites every time it re-applies
        for _ in range(3):
            model(**inputs)
        for r in range(rounds):
            order = ("unpatched", "patched") if r % 2 == 0 else ("patched", "unpatched")
            for state in order:
                (accelpatch.apply if state == "patched" else accelpatch.remove)(model)
                with context() if state == "patched" else contextlib.nullcontext():
                    start = time.perf_counter()
                    for _ in range(forwards):
                        model(**inputs)
                    times[state].append((time.perf_counter() - start) / forwards)
    accelpatch.remove(model)
    base, patched = statistics.median(times["unpatched"]), statistics.median(times["patched"])
    print(f"{label:<8} unpatched {base * 1e3:8.3f} ms/forward   patched({tier or 'default'}) {patched * 1e3:8.3f} "
          f"ms/forward   "
          f"overhead {100 * (patched / base - 1):+6.2f} %   ({rounds} alternating rounds × {forwards} forwards)")
    return base, patched, patched / base - 1


def apply_remove_time(model, *, repeats: int) -> tuple[float, float]:
    """Median seconds of ``accelpatch.apply(model)`` and of ``remove(model)`` (warnings about rejected sites off)."""
    apply_s, remove_s = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            start = time.perf_counter()
            accelpatch.apply(model)
            apply_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            accelpatch.remove(model)
            remove_s.append(time.perf_counter() - start)
    return statistics.median(apply_s), statistics.median(remove_s)
