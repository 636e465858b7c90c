"""Cost of patching SANA-Video 2.0 on CPU, measured side by side in one run.

1. Per-forward time of a patched transformer at the default (``lossless``) tier against the same transformer
   unpatched (alternating rounds; ratio of medians), on the tiny config and on a medium one with the release's head
   dims (128 linear / 256 anchor); then the patched model under ``quality("high")`` on CPU, where every fast path
   falls back (CUDA-only), which adds the fallback bookkeeping. Target: overhead < 2 %.
2. Time of ``accelpatch.apply()`` / ``remove()`` on the released 5B model built on the meta device.

    python benchmarks/bench_sana_video2_patching.py [--rounds 11] [--forwards 30]
"""
from __future__ import annotations

import argparse

import torch

from _overhead import apply_remove_time, patched_vs_unpatched
from accelpatch.testing import (SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO2_TINY_CONFIG, sana_video2_transformer_inputs,
                                sana_video2_transformer_on_meta, tiny_sana_video2_transformer)


def apply_time(*, repeats: int) -> tuple[float, float]:
    model = sana_video2_transformer_on_meta()
    n_params = sum(p.numel() for p in model.parameters())
    a, r = apply_remove_time(model, repeats=repeats)
    print(f"apply() on the 5B SANA-Video 2.0 on the meta device ({n_params / 1e9:.2f}B parameters, 32 sites): "
          f"{a * 1e3:.2f} ms (median of {repeats}); remove(): {r * 1e3:.2f} ms")
    return a, r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--forwards", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tiny = tiny_sana_video2_transformer(SANA_VIDEO2_TINY_CONFIG)
    patched_vs_unpatched(tiny, sana_video2_transformer_inputs(tiny), rounds=args.rounds, forwards=args.forwards,
                         label="tiny")
    medium = tiny_sana_video2_transformer(SANA_VIDEO2_MEDIUM_CONFIG)
    medium_inputs = sana_video2_transformer_inputs(medium, frames=2, height=8, width=8)
    patched_vs_unpatched(medium, medium_inputs, rounds=args.rounds, forwards=max(args.forwards // 3, 2),
                         label="medium")
    patched_vs_unpatched(medium, medium_inputs, rounds=args.rounds, forwards=max(args.forwards // 3, 2),
                         label="medium", tier="high")
    apply_time(repeats=7)


if __name__ == "__main__":
    main()
