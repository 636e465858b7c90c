"""MiniMax-H3 transformer forward on CPU (one thread): dense against ``backend="sol_attn"``, side by side.

A medium H3 config at a long packed sequence (default 8,256 rows). The sparse run uses the default options
(tau=1, diag, dense layers 0,1) with ``dense_steps=0``, so every other layer runs sparse. Forward hooks time each
attention module, so the table shows where the time goes: the attention share of a sparse layer should shrink in
proportion to its exact-block fraction.

    python benchmarks/bench_minimax_h3_sol_attn.py [--rows 8192] [--repeats 2] [--tau 1.0]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

import accelpatch
from accelpatch.testing import MINIMAX_H3_MEDIUM_CONFIG, minimax_h3_transformer_inputs, tiny_minimax_h3_transformer


def timed_forward(model, inputs, attention_modules):
    per_module: dict[str, float] = defaultdict(float)
    starts: dict[str, float] = {}
    handles = []
    for name, module in attention_modules:
        handles.append(module.register_forward_pre_hook(lambda m, a, n=name: starts.__setitem__(n, time.perf_counter())))
        handles.append(module.register_forward_hook(
            lambda m, a, o, n=name: per_module.__setitem__(n, per_module[n] + time.perf_counter() - starts[n])))
    start = time.perf_counter()
    with torch.no_grad():
        model(**inputs)
    total = time.perf_counter() - start
    for h in handles:
        h.remove()
    return total, dict(per_module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8192, help="video rows (text and audio rows come on top)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dense-layers", default="0,1", help="sol_attn dense_layers (default '0,1'; '' for none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = tiny_minimax_h3_transformer(MINIMAX_H3_MEDIUM_CONFIG)
    inputs = minimax_h3_transformer_inputs(model, num_video=args.rows)
    seq = inputs["token_tags"].shape[0]
    attention = [(n, m) for n, m in model.named_modules() if n.startswith("transformer_blocks.") and n.endswith(".attn")]
    print(f"MiniMax-H3 medium: {model.config.num_layers} layers, {model.config.num_attention_heads} heads × "
          f"{model.config.attention_head_dim}, packed sequence {seq} rows, fp32, {args.threads} thread(s)")

    runs = {"dense": [], "sol_attn": []}
    fractions: dict[str, float] = {}
    for r in range(args.repeats):
        for state in (("dense", "sol_attn") if r % 2 == 0 else ("sol_attn", "dense")):
            if state == "sol_attn":
                accelpatch.apply(model, backend="sol_attn", tau=args.tau, dense_steps=0, min_tokens=0,
                                 dense_layers=args.dense_layers)
            else:
                accelpatch.remove(model)
            runs[state].append(timed_forward(model, inputs, attention))
            if state == "sol_attn":
                rep = accelpatch.report(model)
                fractions = {s.path: s.stats["exact_fraction"] for s in rep.sites if "exact_fraction" in s.stats}
    accelpatch.remove(model)

    def med_total(state):
        return statistics.median(t for t, _ in runs[state])

    def med_layer(state, name):
        return statistics.median(p[name] for _, p in runs[state])

    print(f"{'layer':<28}{'dense s':>10}{'sol s':>10}{'ratio':>8}{'exact frac':>12}")
    for name, _ in attention:
        d, s = med_layer("dense", name), med_layer("sol_attn", name)
        frac = fractions.get(name)
        print(f"{name:<28}{d:>10.3f}{s:>10.3f}{s / d:>8.3f}{'dense' if frac is None else f'{frac:.3f}':>12}")
    dense_total, sol_total = med_total("dense"), med_total("sol_attn")
    dense_attn = sum(med_layer("dense", n) for n, _ in attention)
    sol_attn = sum(med_layer("sol_attn", n) for n, _ in attention)
    sparse_layers = [n for n, _ in attention if fractions.get(n) is not None]
    mean_frac = statistics.mean(fractions[n] for n in sparse_layers) if sparse_layers else float("nan")
    print(f"forward: dense {dense_total:.2f} s, sol_attn {sol_total:.2f} s → {dense_total / sol_total:.2f}× "
          f"(step-time ratio {sol_total / dense_total:.3f})")
    print(f"attention share of the forward: dense {dense_attn / dense_total:.1%}, sol_attn {sol_attn / sol_total:.1%}")
    sparse_ratio = statistics.mean(med_layer("sol_attn", n) / med_layer("dense", n) for n in sparse_layers)
    print(f"sparse layers: mean exact fraction {mean_frac:.3f}, mean attention-time ratio {sparse_ratio:.3f}")


if __name__ == "__main__":
    main()
