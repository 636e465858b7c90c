"""GPU evidence in one command: accelpatch's fast paths on one GPU (an H200), random weights at real layer shapes,
no downloads; one JSON file and a plain-text table. It replaces the separate scripts ``gpu_sol_attn.py``,
``gpu_sana_video2_forward.py`` and ``gpu_minimax_h3_sol_attn.py``.

Sections, in the order they run (each is one function with its own time budget; one that fails is recorded with
status "error" and its message, and the others still run):

  lossless_bit_identity        per model, the default tier and quality("lossless") equal unpatched bit for bit
                               (run first: a later section that wedges the GPU cannot take this evidence with it)
  lossless_speed               per model at release layer shapes: the default tier's fused kernels against
                               unpatched, timed, SHA-256 of both outputs (required to be equal)
  sana_video_linear_attention  SANA-Video's linear-attention site at 480p: unpatched vs exact vs high
  sana_video2_anchor           one SANA-Video 2.0 anchor at 720p: FP32 vs BF16 anchors vs Sol-Attn over tau
  sana_video2_step             one 5B SANA-Video 2.0 step at 480p: exact vs the high settings
  sol_attn_vs_flash            the Sol-Attn Triton kernel vs SDPA flash at MiniMax-H3 / SANA-Video 2.0 shapes
  minimax_h3_layers            6 release-shaped MiniMax-H3 layers, dense vs backend="sol_attn" over tau
  wan_step                     one Wan2.1-1.3B-shaped step at 480p (32,760 tokens), dense vs backend="sol_attn"

The default run is sized for 8.5 minutes: the budgets add up to 480 s, and ``--time-limit`` (490 s) caps the whole
run (a section's budget and hard limit shrink to what is left; sections that cannot start are "skipped").
Repeats are small (one warm-up, then the median of ``--repeats`` timed calls); the shapes are the real ones.

Exit codes: 0 every selected section ran and every required lossless check is bit-identical; 1 a lossless
bit-identity check failed (this wins over 3); 2 bad arguments, or no CUDA device without --dry-run; 3 a section
ended in "error" (see its message in the table and the JSON).

    benchmarks/gpu/run_all.sh                                   # every section -> gpu_evidence.json
    benchmarks/gpu/run_all.sh --sections sol_attn_vs_flash --out sol.json
    benchmarks/gpu/run_all.sh --dry-run --out /tmp/dry.json    # tiny shapes on CPU in < 60 s: checks the script

JSON: {"device", "torch", "accelpatch", "started", "dry_run", "arguments", "exit_code",
"sections": {name: {"status": "ok"|"error"|"skipped", "seconds", "rows": [...], "error", "setup", "notes", ...}}};
infinite values (the PSNR of identical outputs) are written as null. ``speedup`` is against the section's
reference row (unpatched, FP32, exact, flash or dense); ``fast_calls`` counts fast-path calls per forward, from
``accelpatch.report``, with ``fallbacks`` naming the reasons where a fast path did not run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(1, str(REPO_ROOT))  # run from a checkout: this tree's accelpatch

import torch  # noqa: E402

import accelpatch  # noqa: E402
from _lossless import failed_checks, lossless_bit_identity  # noqa: E402
from _lossless_speed import lossless_speed  # noqa: E402
from _runner import Options, Section, format_table, json_safe, run_section, skipped  # noqa: E402
from _sana import sana_video2_anchor, sana_video2_step, sana_video_linear_attention  # noqa: E402
from _sol import minimax_h3_layers, sol_attn_vs_flash  # noqa: E402
from _wan import wan_step  # noqa: E402

EXIT_OK, EXIT_LOSSLESS_MISMATCH, EXIT_USAGE, EXIT_SECTION_ERROR = 0, 1, 2, 3
DEFAULT_TIME_LIMIT_S = 490.0

SECTIONS = (
    Section("lossless_bit_identity", 45, lossless_bit_identity,
            "default tier / quality('lossless') bit-identical to unpatched, per model"),
    Section("lossless_speed", 60, lossless_speed,
            "default tier (bit-exact fused kernels) vs unpatched at release layer shapes, SHA-256 equal"),
    Section("sana_video_linear_attention", 45, sana_video_linear_attention,
            "SANA-Video linear-attention site at 480p: exact (FP32 GEMMs) vs high (BF16-operand GEMM)"),
    Section("sana_video2_anchor", 70, sana_video2_anchor,
            "SANA-Video 2.0 anchor at 720p: FP32 vs BF16 anchors vs Sol-Attn over tau"),
    Section("sana_video2_step", 70, sana_video2_step,
            "one 5B SANA-Video 2.0 step at 480p: exact vs the high settings"),
    Section("sol_attn_vs_flash", 65, sol_attn_vs_flash,
            "Sol-Attn Triton kernel vs SDPA flash at MiniMax-H3 / SANA-Video 2.0 shapes over tau"),
    Section("minimax_h3_layers", 75, minimax_h3_layers,
            "6 release-shaped MiniMax-H3 layers: dense vs backend='sol_attn' over tau"),
    Section("wan_step", 50, wan_step,
            "one Wan2.1-1.3B-shaped step at 480p: dense vs backend='sol_attn' (dense layers 0, 1) over tau"),
)
SECTION_NAMES = tuple(section.name for section in SECTIONS)
#: sections whose "required" rows must be bit-identical (exit code 1 otherwise)
LOSSLESS_SECTIONS = ("lossless_bit_identity", "lossless_speed")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="run_all.py", description=__doc__.split("\n\n")[0], epilog="exit codes: 0 ok, 1 a lossless "
        "bit-identity check failed, 2 usage or no CUDA (use --dry-run), 3 a section errored")
    parser.add_argument("--out", default="gpu_evidence.json", help="JSON file to write (default: %(default)s)")
    parser.add_argument("--sections", nargs="+", choices=SECTION_NAMES, metavar="SECTION",
                        help=f"run only these sections (default: all): {', '.join(SECTION_NAMES)}")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on CPU (fp32 where the bf16 kernels do not exist there): checks the logic")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per measurement, after one warm-up")
    parser.add_argument("--taus", type=float, nargs="+", help="override every tau sweep")
    parser.add_argument("--kv-splits", type=int, nargs="+", default=[1], choices=(1, 2, 4),
                        help="Sol-Attn kv_splits values in sol_attn_vs_flash (default: 1)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                        help="seconds for the whole run; sections that cannot start in time are skipped")
    parser.add_argument("--inject-failure", action="append", default=[], choices=SECTION_NAMES,
                        help=argparse.SUPPRESS)  # tests: make a section raise, to check the others still run
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def device_name(dry_run: bool) -> str:
    if dry_run:
        return "cpu (dry run)"
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (sm_{major}{minor})"


def run_sections(args: argparse.Namespace, options: Options) -> dict[str, dict]:
    """Every section's JSON entry, in order: run, or skipped (not selected, or no time left)."""
    selected = set(args.sections or SECTION_NAMES)
    started = time.perf_counter()
    results = {}
    for section in SECTIONS:
        left = args.time_limit - (time.perf_counter() - started)
        if section.name not in selected:
            results[section.name] = skipped(section, "not selected (--sections)")
        elif left <= 0:
            results[section.name] = skipped(section, f"the run's time limit ({args.time_limit:.0f} s) was reached")
        else:
            results[section.name] = run_section(section, options, time_cap=left,
                                                inject_failure=section.name in args.inject_failure)
    return results


def exit_code(sections: dict[str, dict]) -> int:
    if any(failed_checks(sections.get(name, {}).get("rows", [])) for name in LOSSLESS_SECTIONS):
        return EXIT_LOSSLESS_MISMATCH
    if any(result["status"] == "error" for result in sections.values()):
        return EXIT_SECTION_ERROR
    return EXIT_OK


def _cpu_fast_paths(dry_run: bool):
    """On a dry run, let the CUDA-only fast paths run their exact CPU emulations, so that the dry run goes through
    the same fast-path code (and counts) as the GPU run; a GPU run never uses this test switch."""
    if not dry_run:
        return contextlib.nullcontext()
    from accelpatch.sites.base import run_fast_paths_on_cpu

    return run_fast_paths_on_cpu()


def write_json(path: str, report: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")


def summary_line(code: int, sections: dict[str, dict]) -> str:
    counts = {status: sum(r["status"] == status for r in sections.values()) for status in ("ok", "error", "skipped")}
    verdict = {EXIT_OK: "ok", EXIT_LOSSLESS_MISMATCH: "LOSSLESS BIT-IDENTITY FAILED",
               EXIT_SECTION_ERROR: "some sections errored"}[code]
    return (f"sections: {counts['ok']} ok, {counts['error']} error, {counts['skipped']} skipped; "
            f"exit {code} ({verdict})")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(f"run_all.py: no CUDA device is visible (torch {torch.__version__}, CUDA build {torch.version.cuda}): "
              "this run needs one GPU. Use --dry-run to check the script on CPU at tiny shapes.", file=sys.stderr)
        return EXIT_USAGE
    options = Options(dry_run=args.dry_run, device="cpu" if args.dry_run else "cuda", repeats=args.repeats,
                      taus=tuple(args.taus) if args.taus else None, kv_splits=tuple(args.kv_splits))
    report = {"device": device_name(args.dry_run), "torch": torch.__version__, "accelpatch": accelpatch.__version__,
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "dry_run": args.dry_run, "arguments": sys.argv[1:] if argv is None else list(argv)}
    print(f"GPU evidence on {report['device']}: torch {report['torch']}, accelpatch {report['accelpatch']}",
          flush=True)
    with _cpu_fast_paths(args.dry_run):
        sections = run_sections(args, options)
    code = exit_code(sections)
    report.update(exit_code=code, sections=sections)
    write_json(args.out, report)
    print("\n" + format_table(sections))
    print(f"{summary_line(code, sections)}; wrote {args.out}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
