"""What ``apply(pipe, memory="low")`` costs in time and saves in memory at medium size, against the default tier,
measured side by side in one run (CPU, one thread; issue #44 part 3).

For each family whose site table chunks (Wan, LTX-2, MiniMax-H3, HunyuanVideo 1.5), the medium transformer of
``tests/test_memory_plan.py`` in bf16 is patched at the default tier and with ``memory="low"`` (chunks of
``--chunks`` tokens) as two copies of one model; their steady forwards alternate in interleaved rounds (the ratio of
paired medians with a 95 % interval: above 1 is slower), the live-bytes peak of one steady forward is measured for
each (:class:`accelpatch.memory.LiveBytes`), and the outputs must be ``torch.equal`` (exit 1 if not).

    python benchmarks/bench_low_memory.py [--rounds 9] [--chunks 256,1024]
                                          [--models wan,ltx2,minimax_h3,hunyuan_video15]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
import warnings

import torch

import accelpatch
from accelpatch.eval.stats import compare_timings
from accelpatch.memory import LiveBytes
from accelpatch.memory.plan import TransformerCase
from accelpatch.testing import hunyuan_video15, ltx2, minimax_h3, wan

#: the medium cases of tests/test_memory_plan.py (2,000-4,000 video tokens), in bf16
CASES = {
    "wan": TransformerCase("wan", wan.WAN_SOL_CONFIG, 4, 64, 64, 32),
    "ltx2": TransformerCase("ltx2", ltx2.LTX2_TINY_CONFIG, 4, 16, 32, 32, audio=128),
    "minimax_h3": TransformerCase("minimax_h3", minimax_h3.MINIMAX_H3_MEDIUM_CONFIG, 2, 32, 64, 32, audio=64),
    "hunyuan_video15": TransformerCase("hunyuan_video15", hunyuan_video15.HUNYUAN_VIDEO15_SOL_CONFIG, 4, 16, 32, 32,
                                       glyph_tokens=16, image_tokens=16),
}


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _peak(model, inputs) -> int:
    with torch.no_grad(), LiveBytes() as live:
        model(**inputs, return_dict=False)
    return live.peak


def bench(name: str, chunk: int, rounds: int) -> bool:
    case = dataclasses.replace(CASES[name], dtype="bfloat16")
    default = case.build()
    inputs = case.inputs(default)
    inputs.pop("return_dict", None)
    low = copy.deepcopy(default)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        accelpatch.apply(default)
        accelpatch.apply(low, memory="low", memory_chunk_tokens=chunk)
        first = time.perf_counter()
        same = torch.equal(_forward(low, inputs), _forward(default, inputs))
        first = time.perf_counter() - first
        peaks = {"default": _peak(default, inputs), "low": _peak(low, inputs)}
        times = {"default": [], "low": []}
        for r in range(rounds):
            for label in (("default", "low") if r % 2 == 0 else ("low", "default")):
                model = default if label == "default" else low
                start = time.perf_counter()
                out = _forward(model, inputs)
                times[label].append(time.perf_counter() - start)
                same = same and torch.equal(out, _forward(default, inputs)) if label == "low" else same
    # the paired ratio low time / default time (compare_timings' "speed-up" of the second over the first)
    cmp = compare_timings(times["low"], times["default"])
    tokens = case.frames * case.height * case.width
    ran = "chunked_tokens" in str(accelpatch.report(low))
    print(f"{name:<16} chunks of {chunk:>5} ({tokens:,} latent pixels): time x{cmp.speedup:.3f} "
          f"[{cmp.low:.3f}, {cmp.high:.3f}] of the default tier's ({1e3 * cmp.baseline.median:.1f} vs "
          f"{1e3 * cmp.candidate.median:.1f} ms/forward); peak {peaks['low'] / 2**20:.2f} vs "
          f"{peaks['default'] / 2**20:.2f} MiB ({peaks['low'] / peaks['default']:.2f}x); equal outputs: {same}; "
          f"first call (with the checks) {first:.2f} s{'' if ran else '; NOTHING CHUNKED'}", flush=True)
    return same


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--chunks", default="256,1024", help="memory_chunk_tokens values, comma-separated")
    parser.add_argument("--models", default=",".join(CASES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ok = True
    for name in args.models.split(","):
        for chunk in (int(c) for c in args.chunks.split(",")):
            ok = bench(name, chunk, args.rounds) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
