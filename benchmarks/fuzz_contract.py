"""The contract state machine of tests/_contract_machine.py at length: random paths on the tiny models of every
family until ``--examples`` have run, in batches, every failure shrunk to its shortest path and reported.

    python benchmarks/fuzz_contract.py --examples 10000            # the long run (hours on one CPU thread)
    python benchmarks/fuzz_contract.py --examples 200 --steps 10   # a few minutes: shows it works, gives the rate
    python benchmarks/fuzz_contract.py --known-holes               # also check the invariants of open holes

Each batch is one hypothesis run with its own random seed; a failure ends its batch (after shrinking) and the next
batch goes on, so one run can find several holes. An example is one run of the machine along one path, generated
or replayed while shrinking a failure (both exercise the contract; the summary says how many batches failed). Holes already tracked (``KNOWN_HOLES``, each with an xfail
regression test) are left out unless ``--known-holes``. The summary gives examples run, failures (distinct by their
error), time and the rate; exit code 1 when a failure was found.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: tiny models are fastest on one thread
os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples (random paths) to run in all")
    parser.add_argument("--steps", type=int, default=20, help="rules per path (hypothesis' stateful_step_count)")
    parser.add_argument("--batch", type=int, default=500, help="examples per hypothesis run")
    parser.add_argument("--families", default=None, help="comma list of model families (default: all)")
    parser.add_argument("--known-holes", action="store_true", help="also check the invariants of known holes")
    parser.add_argument("--no-shrink", action="store_true", help="report failures as found, without shrinking")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.steps < 1 or args.batch < 1:
        parser.error("--examples, --steps and --batch must be >= 1")

    import torch
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import run_state_machine_as_test

    import _contract_machine as cm

    torch.set_num_threads(1)
    families = tuple(args.families.split(",")) if args.families else tuple(sorted(cm.FAMILIES))
    unknown = sorted(set(families) - set(cm.FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(sorted(cm.FAMILIES))}")

    class Machine(cm.ContractMachine):
        pass

    Machine.families = families
    cm.ContractMachine.check_known_holes = args.known_holes  # checks() reads the base class
    phases = (Phase.generate,) if args.no_shrink else (Phase.generate, Phase.shrink)
    failures: dict[str, tuple[int, str]] = {}  # first line of the error -> (times found, the shortest report)
    batches = failed_batches = 0
    start = time.perf_counter()
    while Machine.examples < args.examples:
        size = min(args.batch, args.examples - Machine.examples)
        lines: list[str] = []
        batches += 1
        batch_settings = settings(max_examples=size, stateful_step_count=args.steps, deadline=None, database=None,
                                  phases=phases, report_multiple_bugs=True, print_blob=False,
                                  suppress_health_check=list(HealthCheck))
        try:
            with with_reporter(lines.append):
                run_state_machine_as_test(Machine, settings=batch_settings)
        except BaseException as error:  # noqa: BLE001 - a hole found (or several, as an ExceptionGroup)
            if isinstance(error, KeyboardInterrupt) and not getattr(error, "__notes__", None):
                raise  # the user's ^C, not one the machine's hooks raised and caught
            failed_batches += 1
            for found in getattr(error, "exceptions", [error]):
                key = f"{type(found).__name__}: {str(found).splitlines()[0] if str(found) else ''}"[:300]
                count, report = failures.get(key, (0, None))
                text = "\n".join([*map(str, lines), *getattr(found, "__notes__", [])])
                failures[key] = (count + 1, text if report is None or len(text) < len(report) else report)
        elapsed = time.perf_counter() - start
        print(f"  batch {batches}: {Machine.examples} examples, {len(failures)} distinct failure(s), {elapsed:.0f} s",
              flush=True)
    elapsed = time.perf_counter() - start
    rate = Machine.examples / elapsed
    print(f"\ncontract state machine: {Machine.examples} examples of up to {args.steps} steps on "
          f"{', '.join(families)}{' (known holes checked too)' if args.known_holes else ''}")
    print(f"  {batches} batch(es), {failed_batches} ended by a failure (its shrinking replays count as examples)")
    print(f"  time: {elapsed:.1f} s, {rate:.2f} examples/s (10,000 examples: about {10_000 / rate / 3600:.1f} h)")
    print(f"  failures found: {len(failures)} distinct")
    for key, (count, report) in failures.items():
        print(f"\n--- found {count}x: {key}\n{report}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
