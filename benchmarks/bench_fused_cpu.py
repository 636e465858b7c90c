"""CPU benchmark: each lossless fused op's CPU kernel (accelpatch.lossless.ops) against its reference chain, one thread.

Shapes are the medium SANA-Video test model's (accelpatch.testing.SANA_VIDEO_MEDIUM_CONFIG: 5 frames of 16x16
latents -> 320 tokens, hidden 448, 4 heads x 112; GLUMB hidden 1120, conv_inverted 2240 channels on
[5, C, 8, 8] channels_last) and 4x the tokens ("big"), bf16 and fp32. Each case first checks that the two outputs
are bit-identical, then runs interleaved rounds (each round times a batch of fused and a batch of reference calls
back to back, the order alternating) and prints the median of the per-round ratios reference/fused (> 1: the fused
op is faster) with a 95 % distribution-free interval of that median (order statistics of the rounds).
Run:  OMP_NUM_THREADS=1 python benchmarks/bench_fused_cpu.py [--rounds 31] [--clock wall|cpu] [--only rope ...]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import accelpatch.lossless.ops  # noqa: F401 - registers the ops
from accelpatch.lossless.kernels import cpu_build
from accelpatch.lossless.verify import ops
from accelpatch.testing import SANA_VIDEO_MEDIUM_CONFIG

BF16, F32 = torch.bfloat16, torch.float32


def _cases(scale: int):
    """(name, op, args) at the medium model's shapes, tokens (and frames, for the convs) times ``scale``."""
    cfg = SANA_VIDEO_MEDIUM_CONFIG
    heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
    hidden = heads * head_dim
    tokens, frames = 320 * scale, 5 * scale
    glumb = int(hidden * 2.5)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=BF16):
        return torch.randn(*shape, generator=g).to(dtype)

    out = []
    for qd, td in ((BF16, F32), (BF16, BF16), (F32, F32)):
        q, k = rnd(1, tokens, heads, head_dim, dtype=qd), rnd(1, tokens, heads, head_dim, dtype=qd)
        cos, sin = rnd(1, tokens, 1, head_dim, dtype=td), rnd(1, tokens, 1, head_dim, dtype=td)
        out.append((f"relu_rope_pair q {_n(qd)} table {_n(td)}", "relu_rope_pair", (q, k, cos, sin)))
    for dt in (BF16, F32):
        x, rows = rnd(1, tokens, hidden, dtype=dt), rnd(1, 1, 6 * hidden, dtype=dt)
        out.append((f"modulate {_n(dt)} [1,{tokens},{hidden}] x [1,1,C]", "modulate",
                    (x, rows[..., :hidden], rows[..., hidden:2 * hidden])))
        residual = rnd(1, tokens, hidden, dtype=dt)
        out.append((f"gated_residual {_n(dt)} [1,{tokens},{hidden}]", "gated_residual",
                    (residual, rows[..., 2 * hidden:3 * hidden], x)))
        patches = rnd(1, hidden, tokens, dtype=dt).transpose(1, 2)  # block 0: the patch embedding's N-minor view
        out.append((f"gated_residual {_n(dt)} transposed residual", "gated_residual",
                    (patches, rows[..., 2 * hidden:3 * hidden], x)))
    side = 8
    conv = rnd(frames, 2 * glumb, side, side).contiguous(memory_format=torch.channels_last)
    out.append((f"silu bf16 [{frames},{2 * glumb},8,8] channels_last", "silu", (conv,)))
    out.append((f"glu_gate bf16 [{frames},{glumb},8,8] chunks", "glu_gate", tuple(conv.chunk(2, dim=1))))
    x, z = rnd(1, heads, head_dim, tokens, dtype=F32), rnd(1, heads, 1, tokens, dtype=F32)
    out.append((f"scale_to_tokens f32->bf16 [1,{heads},{head_dim},{tokens}]", "scale_to_tokens", (x, z, BF16)))
    out.append((f"scale_to_tokens z bf16 [1,{heads},{head_dim},{tokens}]", "scale_to_tokens", (x, z.to(BF16), BF16)))
    for qd in (BF16, F32):  # MiniMax-H3's head: D 128, rotary dim 96, float32 [S, R] tables
        q, k = rnd(1, tokens, heads, 128, dtype=qd), rnd(1, tokens, heads, 128, dtype=qd)
        cos, sin = rnd(tokens, 96, dtype=F32), rnd(tokens, 96, dtype=F32)
        out.append((f"rotate_half_pair {_n(qd)} [1,{tokens},{heads},128] R 96", "rotate_half_pair", (q, k, cos, sin)))
    for qd in (BF16, F32):  # SANA-Video 2.0: q, k chunks of a fused qkv projection, complex128 [N, D/2] table
        qkv = rnd(1, tokens, 3 * hidden, dtype=qd)
        q, k, _ = (t.unflatten(-1, (heads, head_dim)) for t in qkv.chunk(3, dim=-1))
        freqs = torch.polar(torch.ones(tokens, head_dim // 2, dtype=torch.float64),
                            torch.randn(tokens, head_dim // 2, generator=g, dtype=torch.float64))
        out.append((f"rotary_complex_pair {_n(qd)} qkv chunks", "rotary_complex_pair", (q, k, freqs)))
    return out


def _n(dtype):
    return {BF16: "bf16", F32: "f32"}[dtype]


def _bits_equal(a, b):
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b):
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        if x.stride() != y.stride() or not torch.equal(x.isnan(), y.isnan()):
            return False
        keep = ~x.isnan()
        if not torch.equal(x.view(view)[keep], y.view(view)[keep]):
            return False
    return True


def _median_interval(values):
    """Median and a 95 % interval for it from order statistics (binomial, distribution-free)."""
    v = sorted(values)
    n = len(v)
    lo = 0
    total = 0.0
    for j in range(n + 1):  # largest lo with P(Binomial(n, 1/2) < lo) <= 2.5 %
        total += math.comb(n, j) / 2 ** n
        if total > 0.025:
            lo = j
            break
    lo = max(0, min(lo, n - 1))
    return statistics.median(v), v[max(0, lo - 1)], v[min(n - 1, n - lo)]


def _time_batch(fn, args, calls, clock):
    start = clock()
    for _ in range(calls):
        fn(*args)
    return (clock() - start) / calls


def bench(name, op, args, rounds, clock):
    kernel = ops()[op].kernels["cpu"]
    fused, eager = kernel.run, ops()[op].reference
    reason = kernel.unsupported(*args)
    if reason:
        print(f"{name:<52} skipped: {reason}")
        return None
    same = _bits_equal(fused(*args), eager(*args))
    once = _time_batch(eager, args, 3, time.perf_counter)
    calls = max(2, min(200, int(0.01 / max(once, 1e-6))))
    ratios, t_fused, t_eager = [], [], []
    for r in range(rounds):
        order = ((fused, t_fused), (eager, t_eager)) if r % 2 else ((eager, t_eager), (fused, t_fused))
        for fn, sink in order:
            sink.append(_time_batch(fn, args, calls, clock))
        ratios.append(t_eager[-1] / t_fused[-1])
    med, lo, hi = _median_interval(ratios)
    print(f"{name:<52} eager {statistics.median(t_eager) * 1e6:8.1f} us  fused {statistics.median(t_fused) * 1e6:8.1f}"
          f" us  ratio {med:5.2f}x [{lo:4.2f}, {hi:4.2f}]  bit-identical {same}")
    return med


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--only", nargs="*", default=None, help="substrings of case names to run")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    library, reason = cpu_build.load()
    if library is None:
        raise SystemExit(f"CPU kernels unavailable: {reason}")
    clock = time.perf_counter if opts.clock == "wall" else time.process_time
    print(f"torch {torch.__version__}, 1 thread, {opts.rounds} interleaved rounds; ratio = eager / fused "
          "(median, 95 % interval)")
    with torch.no_grad():
        for label, scale in (("medium", 1), ("big (4x tokens)", 4)):
            print(f"-- {label}")
            for name, op, args in _cases(scale):
                if opts.only is None or any(s in name for s in opts.only):
                    bench(name, op, args, opts.rounds, clock)


if __name__ == "__main__":
    main()
