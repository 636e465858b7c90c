"""Resource table of the fused Triton kernels compiled ahead of time (no GPU needed).

Each launch the fused ops' CUDA kernels make (accelpatch.lossless.aot.CASES) is captured
under a stand-in driver and compiled for each target with Triton's bundled ptxas: shared memory, registers, stack
and spilled bytes per thread, fused multiply-adds / .ftz / approximate instructions (all must be 0), compile time;
then the complex RoPE case once more with the complex multiply contracted (aot.CONTRACTED: its own fmas only).
Run:  TRITON_INTERPRET= python benchmarks/bench_fused_triton_aot.py [--targets 80 90]
"""
from __future__ import annotations

import argparse
import os


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, nargs="+", default=[80, 90], help="compute capabilities")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)

    from accelpatch.core import triton_aot  # noqa: PLC0415
    from accelpatch.lossless import aot  # noqa: PLC0415

    print(f"{'target':>6} {'case':<52} {'kernel':<27} {'BLOCK':>5} {'shared_B':>8} {'limit_B':>8} {'regs':>4} "
          f"{'stack_B':>7} {'spill_B':>7} {'fma':>3} {'ftz':>3} {'approx':>6} {'compile_s':>9}")
    for arch in args.targets:
        for label, modes in [(label, None) for label in aot.CASES] + [(label, (1, 1)) for label in aot.CONTRACTED]:
            c = aot.capture_case(arch, label, complex_modes=modes)
            u = triton_aot.inspect(c, spills=True)
            label = label if modes is None else label + ", fma"
            print(f"{'sm_' + str(arch):>6} {label:<52} {c.name:<27} {c.constexpr('BLOCK'):>5} {u.shared:>8} "
                  f"{triton_aot.SHARED_LIMIT.get(arch, 0):>8} {u.registers:>4} {u.stack:>7} "
                  f"{u.spill_stores + u.spill_loads:>7} {u.fma:>3} {u.ftz:>3} {u.approx:>6} {u.compile_s:>9.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
