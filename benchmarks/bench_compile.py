"""torch.compile of patched models on CPU, side by side: per-forward time eager vs compiled, unpatched vs patched
(default tier), plus the number of graphs and the compile time (the first call).

Rounds alternate between the four variants after each has compiled; medians are reported. Inductor on CPU compiles
for tens of seconds per model: ``--backend eager`` checks the graph structure only (no speed-up expected).

    python benchmarks/bench_compile.py [--model sana-video|sana-video2] [--backend inductor] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch._dynamo.utils import counters

import accelpatch
from accelpatch.testing import (SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO_MEDIUM_CONFIG, sana_video2_transformer_inputs,
                                sana_video_transformer_inputs, tiny_sana_video2_transformer,
                                tiny_sana_video_transformer)

MODELS = {
    "sana-video": lambda: (lambda m: (m, sana_video_transformer_inputs(m, batch_size=2)))(
        tiny_sana_video_transformer(SANA_VIDEO_MEDIUM_CONFIG)),
    "sana-video2": lambda: (lambda m: (m, sana_video2_transformer_inputs(m, frames=2, height=8, width=8)))(
        tiny_sana_video2_transformer(SANA_VIDEO2_MEDIUM_CONFIG)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="sana-video")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forwards", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    variants = {}
    for patched in (False, True):
        model, inputs = MODELS[args.model]()
        if patched:
            accelpatch.apply(model)
        variants[("patched" if patched else "unpatched", "eager")] = (model, inputs)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(model, backend=args.backend, fullgraph=True)
        start = time.perf_counter()
        with torch.no_grad():
            compiled(**inputs)
        print(f"{'patched' if patched else 'unpatched':<10} compile: {time.perf_counter() - start:6.1f} s, "
              f"{counters['stats']['unique_graphs']} graph(s)")
        variants[("patched" if patched else "unpatched", "compiled")] = (compiled, inputs)
    times = {key: [] for key in variants}
    with torch.no_grad():
        for r in range(args.rounds):
            for key in (list(variants) if r % 2 == 0 else list(reversed(list(variants)))):
                model, inputs = variants[key]
                start = time.perf_counter()
                for _ in range(args.forwards):
                    model(**inputs)
                times[key].append((time.perf_counter() - start) / args.forwards)
    base = statistics.median(times[("unpatched", "eager")])
    print(f"\n{args.model} ({args.backend}), median of {args.rounds} alternating rounds x {args.forwards} forwards:")
    for key, values in times.items():
        t = statistics.median(values)
        print(f"  {key[0]:<10} {key[1]:<9} {t * 1e3:9.2f} ms/forward  {base / t:6.2f}x vs unpatched eager")


if __name__ == "__main__":
    main()
