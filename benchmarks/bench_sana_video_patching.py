"""Cost of patching SANA-Video on CPU, measured side by side in one run.

1. Per-forward time of a patched transformer at the default (``lossless``) tier against the same transformer
   unpatched, on the tiny and a medium config. Patched and unpatched rounds alternate (apply/remove between
   rounds), and the ratio of medians is reported. Target: overhead < 2 %.
2. Time of ``accelpatch.apply()`` (and ``remove()``) on a release-sized 20-layer transformer built on the meta
   device. Target: < 100 ms.
3. The per-call cost of the gate itself: one attention module called directly, patched against unpatched
   (interleaved ``timeit`` rounds, best of each).

    python benchmarks/bench_sana_video_patching.py [--rounds 11] [--forwards 60]
"""
from __future__ import annotations

import argparse

import torch

import accelpatch
from _overhead import apply_remove_time, patched_vs_unpatched
from accelpatch.testing import (SANA_VIDEO_MEDIUM_CONFIG, SANA_VIDEO_TINY_CONFIG, sana_video_transformer_inputs,
                                sana_video_transformer_on_meta, tiny_sana_video_transformer)


def forward_overhead(config, *, rounds: int, forwards: int, label: str, **input_kwargs) -> tuple[float, float, float]:
    model = tiny_sana_video_transformer(config)
    inputs = sana_video_transformer_inputs(model, batch_size=2, **input_kwargs)
    return patched_vs_unpatched(model, inputs, rounds=rounds, forwards=forwards, label=label)


def apply_time(*, repeats: int) -> tuple[float, float]:
    model = sana_video_transformer_on_meta(num_layers=20)
    a, r = apply_remove_time(model, repeats=repeats)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"apply() on a 20-layer meta-device SANA-Video ({n_params / 1e9:.2f}B parameters): "
          f"{a * 1e3:.2f} ms (median of {repeats}); remove(): {r * 1e3:.2f} ms")
    return a, r


def gate_cost_per_call(*, rounds: int = 7, number: int = 300) -> float:
    import timeit

    model = tiny_sana_video_transformer()
    attn = model.transformer_blocks[0].attn1
    hidden = torch.randn(2, 48, model.config.num_attention_heads * model.config.attention_head_dim)
    rope = model.rope(torch.zeros(2, model.config.in_channels, 3, 8, 8))
    best = {"unpatched": float("inf"), "patched": float("inf")}
    with torch.no_grad():
        for _ in range(rounds):
            for state in ("unpatched", "patched"):
                (accelpatch.apply if state == "patched" else accelpatch.remove)(model)
                t = min(timeit.repeat(lambda: attn(hidden, rotary_emb=rope), number=number, repeat=3)) / number
                best[state] = min(best[state], t)
    accelpatch.remove(model)
    delta = best["patched"] - best["unpatched"]
    print(f"gate cost per attention call: {delta * 1e6:+.2f} µs (unpatched {best['unpatched'] * 1e6:.1f} µs, "
          f"patched {best['patched'] * 1e6:.1f} µs; best of {rounds}×3 rounds)")
    return delta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--forwards", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    forward_overhead(SANA_VIDEO_TINY_CONFIG, rounds=args.rounds, forwards=args.forwards, label="tiny")
    forward_overhead(SANA_VIDEO_MEDIUM_CONFIG, rounds=args.rounds, forwards=max(args.forwards // 3, 2),
                     label="medium", height=16, width=16)
    apply_time(repeats=7)
    gate_cost_per_call()


if __name__ == "__main__":
    main()
