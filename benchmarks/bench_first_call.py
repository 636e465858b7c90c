"""What the first patched call costs on a CPU: the kernel build (empty cache) against a prebuilt cache, side by side.

Each case is a fresh Python process (so nothing is loaded yet) that builds a tiny bf16 SANA-Video transformer,
runs one unpatched forward, applies accelpatch at the default tier, and times the first patched forward and a
second one. Cases:

- ``cold``: an empty kernel cache (``XDG_CACHE_HOME`` a new folder): the first call builds the CPU kernels;
- ``warm``: the cache the ``cold`` run filled: the first call only loads them;
- ``off``: ``ACCELPATCH_CPU_KERNELS=0``: nothing is built or loaded (the reference chains run).

The first-call times include each fused op's first-sight verification and, for ``cold``, the build; the process
prints how long the build itself took. Run on an idle machine: the build uses both cores.

    python benchmarks/bench_first_call.py [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CASE = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
import accelpatch
from accelpatch import testing as t
model = t.tiny_sana_video_transformer(dtype=torch.bfloat16)
inputs = t.sana_video_transformer_inputs(model, batch_size=1, seed=1)
with torch.no_grad():
    start = time.perf_counter(); expected = model(**inputs).sample; unpatched = time.perf_counter() - start
    accelpatch.apply(model)
    start = time.perf_counter(); first = model(**inputs).sample; first_s = time.perf_counter() - start
    start = time.perf_counter(); second = model(**inputs).sample; second_s = time.perf_counter() - start
assert torch.equal(first, expected) and torch.equal(second, expected)
fused = sum(f.fused_calls for f in accelpatch.report(model).models[0].fusions)
print(json.dumps({"unpatched_s": unpatched, "first_s": first_s, "second_s": second_s, "fused_calls": fused}))
"""


def _run(env: dict) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _CASE], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"case failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="cold/warm/off rounds (each a fresh cache)")
    opts = parser.parse_args()
    if opts.repeats < 1:
        parser.error(f"--repeats must be at least 1, not {opts.repeats}")
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    kind = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "other"
    results: dict[str, list[dict]] = {"cold": [], "warm": [], "off": []}
    notes = []
    for _ in range(opts.repeats):
        with tempfile.TemporaryDirectory(prefix="accelpatch-cache-") as cache:
            base = dict(os.environ, XDG_CACHE_HOME=cache, OMP_NUM_THREADS="1")
            base.pop("ACCELPATCH_CPU_KERNELS", None)
            cold, err = _run(base)
            notes += [line for line in err.splitlines() if "built the fused CPU kernels" in line]
            results["cold"].append(cold)
            results["warm"].append(_run(base)[0])
            results["off"].append(_run(dict(base, ACCELPATCH_CPU_KERNELS="0"))[0])
    print(f"CPU: {kind}; tiny bf16 SANA-Video transformer, one thread; medians of {opts.repeats} fresh processes")
    print(f"{'case':<6} {'unpatched':>10} {'1st patched':>12} {'2nd patched':>12} {'fused calls':>12}")
    for case, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{case:<6} {med['unpatched_s'] * 1e3:>8.0f}ms {med['first_s']:>11.2f}s {med['second_s'] * 1e3:>10.0f}ms "
              f"{int(med['fused_calls']):>12}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
