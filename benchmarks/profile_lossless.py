"""Where a forward's time goes, unpatched and at the default tier: the profile that says what the lossless fusions
can save on this machine (CPU, one thread, medium test models).

Each aten op's self CPU time (``torch.profiler``, three forwards after a warm-up) is put in one bucket:
convolutions, GEMMs and attention (compute the fusions never touch), norms and reductions (kept eager: their
reduction order sets the bits), element-wise chains (what the fusions replace), and the rest. The fused kernels
themselves are not aten ops: their time is the wall time the profile does not attribute to any op ("outside aten").

    python benchmarks/profile_lossless.py [--models sana_video,sana_video2,minimax_h3] [--dtypes bf16,fp32]
"""
from __future__ import annotations

import argparse
import copy
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import accelpatch
from bench_lossless import DTYPES, _models

BUCKETS = {
    "conv": ("convolution",),
    "gemm/attention": ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "scaled_dot_product", "_flash_attention"),
    "norm/reduction": ("layer_norm", "rms_norm", "sum", "mean", "var", "softmax"),
    "element-wise": ("mul", "add", "sub", "div", "silu", "relu", "sigmoid", "copy_", "_to_copy", "clamp", "pow",
                     "rsqrt", "neg", "cat", "reciprocal", "clone", "contiguous", "index_select", "fill_", "where"),
}


def bucket_of(name: str) -> str:
    op = name.removeprefix("aten::")
    for bucket, keys in BUCKETS.items():
        if any(op == k or op.startswith(k + "_") or k in op and bucket in ("conv", "gemm/attention") for k in keys):
            return bucket
    return "other aten"


def breakdown(model, inputs, forwards: int = 3) -> dict[str, float]:
    """Seconds per forward by bucket, plus the wall time outside any aten op."""
    with torch.no_grad():
        model(**inputs)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(forwards):
                model(**inputs)
        wall = (time.perf_counter() - start) / forwards
    out = {bucket: 0.0 for bucket in list(BUCKETS) + ["other aten"]}
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            out[bucket_of(event.key)] += event.self_cpu_time_total / 1e6 / forwards
    out["outside aten (Python, fused kernels)"] = max(0.0, wall - sum(out.values()))
    out["wall"] = wall
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="sana_video,sana_video2,minimax_h3")
    parser.add_argument("--dtypes", default="bf16,fp32")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for name in [n for n in args.models.split(",") if n]:
        for dtype in [DTYPES[d] for d in args.dtypes.split(",") if d]:
            build, make_inputs = _models()[name]
            model = build(dtype)
            inputs = make_inputs(model)
            patched = copy.deepcopy(model)
            accelpatch.apply(patched)
            rows = {"unpatched": breakdown(model, inputs), "default tier": breakdown(patched, inputs)}
            print(f"{name} {str(dtype).removeprefix('torch.')}: ms per forward (share of the unpatched wall time)")
            for bucket in rows["unpatched"]:
                cells = "  ".join(f"{label} {row[bucket] * 1e3:7.2f} ({row[bucket] / rows['unpatched']['wall']:5.1%})"
                                  for label, row in rows.items())
                print(f"  {bucket:<38} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
