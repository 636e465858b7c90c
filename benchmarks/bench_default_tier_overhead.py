"""What the default tier costs on the tiny pipelines, side by side in one run: unpatched, the default tier (its size
floor on: tiny calls run the original forward), the default tier fusing every call (the floor at 0, as before
issue #40), and tier exact (the gate's routing alone). Interleaved rounds, one thread, CPU time per pipeline call;
each setting's median per-round ratio to unpatched, and the ratio of the fastest fifth of each (what interference
from other work on the machine did not slow).

    OMP_NUM_THREADS=1 python benchmarks/bench_default_tier_overhead.py [--models sana_video,sana_video2] [--rounds 100]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import accelpatch
import accelpatch.testing as T
from accelpatch.core import sites


def measure(family: str, rounds: int) -> None:
    build = getattr(T, f"tiny_{family}_pipeline")
    call_kwargs = getattr(T, f"{family}_pipeline_call_kwargs")
    pipes = {"unpatched": build(), "default": build(), "fuse-every-call": build(), "exact": build()}
    accelpatch.apply(pipes["default"])
    accelpatch.apply(pipes["fuse-every-call"])
    accelpatch.apply(pipes["exact"], tier="exact")
    floor = sites.MIN_ELEMENTS

    def call(name: str) -> float:
        sites.MIN_ELEMENTS = 0 if name == "fuse-every-call" else floor
        try:
            kwargs = call_kwargs()
            start = time.process_time()
            pipes[name](**kwargs)
            return time.process_time() - start
        finally:
            sites.MIN_ELEMENTS = floor

    names = list(pipes)
    for name in names:  # warm-up: first sights, the kernels' load
        call(name), call(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(call(name))

    def fastest_fifth(values):
        return statistics.mean(sorted(values)[:max(1, len(values) // 5)])

    base = times["unpatched"]
    print(f"{family}: {rounds} interleaved rounds, torch threads {torch.get_num_threads()}, CPU time per pipeline "
          f"call; unpatched median {statistics.median(base) * 1e3:.2f} ms (size floor {floor:,} elements)")
    for name in names[1:]:
        ratios = sorted(b / a for a, b in zip(base, times[name]))
        q = len(ratios) // 4
        print(f"  {name:16s} median ratio {statistics.median(ratios):.3f} (p25 {ratios[q]:.3f}, p75 {ratios[-q - 1]:.3f}); "
              f"fastest fifth {fastest_fifth(times[name]) / fastest_fifth(base):.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="sana_video,sana_video2")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the CPU box's "not mounted: CUDA" notes
    for family in args.models.split(","):
        measure(family.strip(), args.rounds)


if __name__ == "__main__":
    main()
