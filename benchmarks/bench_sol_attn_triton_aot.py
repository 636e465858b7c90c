"""What the compiler makes of the Sol-Attn Triton kernel, per GPU target, on a machine without a GPU.

For each (target, dtype, head dim) the package's own host code picks the tiles (resources.py) and the launch is
captured under a stand-in driver and compiled ahead of time (accelpatch.sol_attn.op.aot): the table shows the
tiles (BLOCK_N keys per sub-tile, num_stages, route GROUP, warps), the shared memory the model predicts, what the
compiled kernel asks for, the chip's per-block limit, registers and stack (spills) per thread from cuobjdump, the
blocks one SM holds at once (from shared memory and registers), and the cp.async / wgmma instructions in the PTX.
Refused configurations print the reason. Compile-time facts only: nothing here measures speed. Triton's on-disk
cache makes a rerun take seconds (the first run compiles each kernel: 1-25 s each on 2 cores, fp32 the slowest).
Run:  python benchmarks/bench_sol_attn_triton_aot.py [--targets 80 90] [--dtypes bf16 fp32]
      [--head-dims 64 128 256 512] [--kv-splits 1]
"""
from __future__ import annotations

import argparse
import os

os.environ.pop("TRITON_INTERPRET", None)  # the JIT kernel, not the interpreter's stand-in
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, nargs="+", default=[80, 90],
                    help="compute capabilities (80 = sm_80, 90 = sm_90a)")
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--kv-splits", type=int, default=1, choices=[1, 2, 4])
    args = ap.parse_args(argv)

    import torch  # noqa: PLC0415

    from accelpatch.sol_attn.op import aot, resources  # noqa: PLC0415

    head = (f"{'target':>6} {'dtype':>5} {'D':>4} {'BLOCK_N':>7} {'stages':>6} {'GROUP':>5} {'warps':>5} "
            f"{'model_B':>8} {'shared_B':>8} {'limit_B':>8} {'regs':>4} {'stack_B':>7} {'blk/SM':>6} {'cp.async':>8} "
            f"{'wgmma':>5} {'compile_s':>9}")
    print(head)
    for arch in args.targets:
        for name in args.dtypes:
            dtype = getattr(torch, DTYPES[name])
            for d in args.head_dims:
                try:
                    launch = aot.capture_launch(arch, dtype, d, kv_splits=args.kv_splits)
                except resources.TilesDoNotFit as error:
                    print(f"{'sm_' + str(arch):>6} {name:>5} {d:>4}  refused: {error}", flush=True)
                    continue
                use = aot.inspect_launch(launch)
                tiles = resources.choose_tiles(dtype, d, arch)
                model = resources.shared_bytes(arch, dtype, tiles.block_d, tiles.block_n, tiles.num_stages,
                                               tiles.group)
                limit = resources.shared_limit(arch)
                flag = "" if use.shared <= limit else "  OVER THE LIMIT"
                blocks = resources.blocks_per_sm(arch, use.shared, use.registers, tiles.num_warps)
                print(f"{'sm_' + str(arch):>6} {name:>5} {d:>4} {tiles.block_n:>7} {tiles.num_stages:>6} "
                      f"{tiles.group:>5} {tiles.num_warps:>5} {model:>8} {use.shared:>8} {limit:>8} {use.registers:>4} "
                      f"{use.stack:>7} {blocks:>6} {use.cp_async:>8} "
                      f"{use.wgmma:>5} {use.compile_s:>9.1f}{flag}", flush=True)


if __name__ == "__main__":
    main()
