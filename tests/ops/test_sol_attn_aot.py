"""The Triton Sol-Attn kernel compiled ahead of time for sm_80 (A100) and sm_90a (H100/H200) on a CPU-only machine,
at the configurations the package launches (its own host code picks the tiles; accelpatch.sol_attn.op.aot): every
launch must fit its chip's per-block shared memory (else its first launch raises OutOfResources), the resource
model must bound the compiled allocation tightly, pipelined tiles must really pipeline their loads (cp.async), and
what the model refuses must be refused before any compile. One subprocess (the test process runs the interpreter);
Triton's on-disk cache makes repeat runs fast (the first run compiles 18 kernels, 1-3 minutes on 2 busy cores)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from accelpatch.sol_attn.op import resources  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# (arch, dtype, head dim, kv_splits): the head dims of the models accelpatch patches (MiniMax-H3 128, SANA-Video
# 2.0's anchors 256; bf16 also 64) in the dtypes they run (bf16, and fp32 for FP32 anchors); fp16 and the
# partial-output epilogue (kv_splits > 1) once each; head dims 512 and 1024 where some tiles fit (smaller key
# tiles, route groups, no pipelining); two smaller-memory targets. fp32 compiles are the slow ones (10-25 s).
LAUNCHES = [(arch, "bfloat16", d, 1) for arch in (80, 90) for d in (64, 128, 256)]
LAUNCHES += [(arch, "float32", d, 1) for arch in (80, 90) for d in (128, 256)]
LAUNCHES += [(80, "float16", 128, 1), (90, "bfloat16", 128, 2), (90, "float32", 512, 1), (80, "bfloat16", 512, 1),
             (90, "bfloat16", 512, 1), (90, "bfloat16", 1024, 1),
             (86, "bfloat16", 256, 1), (120, "bfloat16", 256, 1)]  # RTX 30xx / 50xx: ~99 KiB per block
REFUSED = [(80, "float32", 512), (90, "float32", 1024), (80, "bfloat16", 1024)]

_SCRIPT = r'''
import json, sys
import torch
from accelpatch.sol_attn.op import aot, resources
for arch, dtype, d, splits in json.loads(sys.argv[1]):
    launch = aot.capture_launch(arch, getattr(torch, dtype), d, kv_splits=splits)
    usage = aot.inspect_launch(launch)
    print(json.dumps(dict(arch=arch, dtype=dtype, d=d, splits=splits, block_n=launch.constexpr("BLOCK_N"),
                          group=launch.constexpr("GROUP"), partial=launch.constexpr("PARTIAL"),
                          stages=launch.options.num_stages, warps=launch.options.num_warps, **usage.__dict__)),
          flush=True)
for arch, dtype, d in json.loads(sys.argv[2]):
    try:
        aot.capture_launch(arch, getattr(torch, dtype), d)
    except resources.TilesDoNotFit as error:
        print(json.dumps(dict(refused=[arch, dtype, d], reason=str(error))), flush=True)
'''


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(LAUNCHES), json.dumps(REFUSED)],
                         capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return [r for r in rows if "refused" not in r], [r for r in rows if "refused" in r]


def _where(r):
    return (f"sm_{r['arch']} {r['dtype']} D={r['d']} kv_splits={r['splits']} (BLOCK_N={r['block_n']}, "
            f"num_stages={r['stages']}, GROUP={r['group']}): compiled shared {r['shared']:,} B")


@pytest.mark.timeout(900)  # the module fixture compiles every kernel for two chips: ~2 min here, more on a busy box
def test_every_launch_fits_its_chip_and_the_model_bounds_it(compiled):
    rows, _ = compiled
    assert [(r["arch"], r["dtype"], r["d"], r["splits"]) for r in rows] == [tuple(x) for x in LAUNCHES]
    over = [f"{_where(r)} > {resources.SHARED_LIMIT[r['arch']]:,} B" for r in rows
            if r["shared"] > resources.SHARED_LIMIT[r["arch"]]]
    assert not over, over  # each would raise OutOfResources at its first launch
    for r in rows:
        model = resources.shared_bytes(r["arch"], getattr(torch, r["dtype"]), resources.block_d_of(r["d"]),
                                       r["block_n"], r["stages"], r["group"])
        assert r["shared"] <= model <= r["shared"] + resources._SLACK, f"{_where(r)}, model {model:,} B"
        assert r["partial"] == (r["splits"] > 1)


def test_pipelined_tiles_issue_async_copies(compiled):
    """num_stages >= 2 must mean cp.async in the PTX (the loop over exact blocks is what the pipeliner takes);
    bf16/fp16 use tensor cores (wgmma on sm_90a)."""
    rows, _ = compiled
    for r in rows:
        if r["stages"] >= 2:
            assert r["cp_async"] > 0, r
        if r["arch"] == 90 and r["dtype"] != "float32":
            assert r["wgmma"] > 0, r


def test_what_cannot_fit_is_refused_with_the_numbers(compiled):
    _, refused = compiled
    assert [tuple(r["refused"]) for r in refused] == [tuple(x) for x in REFUSED]
    for r in refused:
        arch, dtype, d = r["refused"]
        assert f"head dim {d}" in r["reason"] and f"sm_{arch}" in r["reason"]
        assert f"{resources.SHARED_LIMIT[arch]:,} B" in r["reason"] and "impl='torch'" in r["reason"]
