"""``python -m accelpatch build-kernels``: build the fused CPU kernels now, not inside the first patched call.

Useful before timing anything, in a Docker image build, or on a login node with a compiler. The build is cached
per machine, torch version and CPU (see :mod:`accelpatch.lossless.kernels.cpu_build`); a second run only loads it.
Exit code 0 with the cache folder printed; 1 with the reason and what to do when the kernels cannot be built.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--self-check", action="store_true",
                        help="also run the kernels' known-answer self-check (a few seconds)")


def main(args: argparse.Namespace) -> int:
    import time

    import accelpatch.lossless.ops  # noqa: F401 - each op registers its known-answer runs for the self-check
    from accelpatch.lossless.kernels import cpu, cpu_build

    start = time.perf_counter()
    off = cpu_build.switched_off()
    if off:
        print(f"the fused CPU kernels are {off}: unset {cpu_build.SWITCH} to build them")
        return 1
    library, reason = cpu_build.build()
    if library is None:
        print(f"the fused CPU kernels could not be built: {reason}")
        return 1
    print(f"the fused CPU kernels are ready ({time.perf_counter() - start:.1f} s): torch.ops.{cpu_build.NAMESPACE}, "
          f"cached in {cpu_build.default_folder()}")
    if args.self_check:
        cpu_build._RESULT = (library, None)
        problem = cpu._self_check(library)
        if problem:
            print(f"but they fail their self-check: {problem}")
            return 1
        print("known-answer self-check: passed")
    return 0
