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
  step_cache                   the step cache on a SANA-Video pipeline over thresholds: time, reuse, PSNR
  compile                      torch.compile of one release-width SANA-Video block, unpatched and patched

The default run is sized for 8 minutes: the budgets add up to 460 s plus 20 s of start-up, and ``--time-limit``
(480 s) caps the whole run (a section's budget and hard limit shrink to what is left; sections that cannot start
are "skipped"). Repeats are small (one warm-up, then the median of ``--repeats`` timed calls); the shapes are the
real ones. The JSON is rewritten (atomically) after every section, so a run killed at its limit keeps what it
measured; ``--out`` defaults to ``$OUT/gpu_evidence.json`` when ``$OUT`` is set (the lent machine's output
folder), else ``out/gpu_evidence.json`` in the checkout.

Exit codes: 0 every selected section ran and every required lossless check is bit-identical; 1 a lossless
bit-identity check failed (this wins over the others); 2 bad arguments, or no CUDA device without --dry-run/--cpu;
3 a section ended in "error" (see its message in the table and the JSON); 4 a selected lossless section did not
check every required model (its budget or the run's time limit skipped one: the evidence is incomplete); on
--dry-run, 3 also when a section's GPU-size build fails or the time plan does not fit.

    benchmarks/gpu/run_all.sh                        # every section -> $OUT/gpu_evidence.json
    benchmarks/gpu/run_all.sh --sections sol_attn_vs_flash --out sol.json
    benchmarks/gpu/run_all.sh --dry-run              # seconds, no GPU: GPU-size builds on meta, the time plan
    benchmarks/gpu/run_all.sh --cpu                  # every section's code at tiny shapes on CPU (about a minute)

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
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(1, str(REPO_ROOT))  # run from a checkout: this tree's accelpatch

import torch  # noqa: E402

import accelpatch  # noqa: E402
from _lossless import CASES, failed_checks, lossless_bit_identity, lossless_bit_identity_builds  # noqa: E402
from _lossless_speed import lossless_speed, lossless_speed_builds  # noqa: E402
from _later import compile_builds, compile_section, step_cache, step_cache_builds  # noqa: E402
from _plan import PLAN_LIMIT_S, plan_check, timed_plan  # noqa: E402
from _runner import Options, Section, format_table, json_safe, run_section, skipped  # noqa: E402
from _sana import (sana_video2_anchor, sana_video2_anchor_builds, sana_video2_step, sana_video2_step_builds,  # noqa
                   sana_video_linear_attention, sana_video_linear_attention_builds)
from _sol import minimax_h3_layers, minimax_h3_layers_builds, sol_attn_vs_flash, sol_attn_vs_flash_builds  # noqa
from _wan import wan_step, wan_step_builds  # noqa: E402

EXIT_OK, EXIT_LOSSLESS_MISMATCH, EXIT_USAGE, EXIT_SECTION_ERROR, EXIT_INCOMPLETE = 0, 1, 2, 3, 4
DEFAULT_TIME_LIMIT_S = PLAN_LIMIT_S

#: in priority order: the lossless evidence first (a later section that wedges the GPU cannot take it along)
SECTIONS = (
    Section("lossless_bit_identity", 40, lossless_bit_identity,
            "default tier / quality('lossless') bit-identical to unpatched, per model", lossless_bit_identity_builds),
    Section("lossless_speed", 55, lossless_speed,
            "default tier (bit-exact fused kernels) vs unpatched at release layer shapes, SHA-256 equal",
            lossless_speed_builds),
    Section("sana_video_linear_attention", 35, sana_video_linear_attention,
            "SANA-Video linear-attention site at 480p: exact (FP32 GEMMs) vs high (BF16-operand GEMM)",
            sana_video_linear_attention_builds),
    Section("sana_video2_anchor", 55, sana_video2_anchor,
            "SANA-Video 2.0 anchor at 720p: FP32 vs BF16 anchors vs Sol-Attn over tau", sana_video2_anchor_builds),
    Section("sana_video2_step", 55, sana_video2_step,
            "one 5B SANA-Video 2.0 step at 480p: exact vs the high settings", sana_video2_step_builds),
    Section("sol_attn_vs_flash", 55, sol_attn_vs_flash,
            "Sol-Attn Triton kernel vs SDPA flash at MiniMax-H3 / SANA-Video 2.0 shapes over tau",
            sol_attn_vs_flash_builds),
    Section("minimax_h3_layers", 60, minimax_h3_layers,
            "6 release-shaped MiniMax-H3 layers: dense vs backend='sol_attn' over tau", minimax_h3_layers_builds),
    Section("wan_step", 40, wan_step,
            "one Wan2.1-1.3B-shaped step at 480p: dense vs backend='sol_attn' (dense layers 0, 1) over tau",
            wan_step_builds),
    Section("step_cache", 25, step_cache,
            "step cache (first_block, tier high) on a SANA-Video pipeline: time, reuse, PSNR over thresholds",
            step_cache_builds),
    Section("compile", 40, compile_section,
            "torch.compile of one release-width SANA-Video block, unpatched and patched: compile s, ms",
            compile_builds),
)
SECTION_NAMES = tuple(section.name for section in SECTIONS)
#: sections whose "required" rows must be bit-identical (exit code 1 otherwise)
LOSSLESS_SECTIONS = ("lossless_bit_identity", "lossless_speed")
#: every lossless section must check each of these models (exit code 4 otherwise)
REQUIRED_MODELS = tuple(case.name for case in CASES)


def default_out() -> str:
    """``$OUT/gpu_evidence.json`` where ``$OUT`` is set (only that folder comes back from the lent machine), else
    ``out/gpu_evidence.json`` in the checkout (ignored by git)."""
    folder = os.environ.get("OUT")
    return str(Path(folder) / "gpu_evidence.json") if folder else str(REPO_ROOT / "out" / "gpu_evidence.json")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="run_all.py", description=__doc__.split("\n\n")[0], epilog="exit codes: 0 ok, 1 a lossless "
        "bit-identity check failed, 2 usage or no CUDA (use --dry-run), 3 a section errored")
    parser.add_argument("--out", default=None,
                        help="JSON file, rewritten after every section (default: $OUT/gpu_evidence.json when $OUT is "
                             "set, else out/gpu_evidence.json in the checkout)")
    parser.add_argument("--sections", nargs="+", choices=SECTION_NAMES, metavar="SECTION",
                        help=f"run only these sections (default: all): {', '.join(SECTION_NAMES)}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="seconds, no GPU: every section's GPU-size models and inputs built on the meta device "
                           "(generator placement checked as CUDA does) and the time plan checked; runs nothing")
    mode.add_argument("--cpu", action="store_true",
                      help="every section's code at tiny shapes on CPU (fp32 where the bf16 kernels do not exist "
                           "there): checks the logic, about a minute")
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
    if args.out is None:
        args.out = default_out()
    return args


def device_name(args: argparse.Namespace) -> str:
    if args.dry_run:
        return "meta (dry run: GPU sizes, nothing runs)"
    if args.cpu:
        return "cpu (tiny shapes)"
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (sm_{major}{minor})"


def selected_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The sections to run: ``--sections``, else all of :data:`SECTIONS`."""
    return tuple(args.sections or (section.name for section in SECTIONS))


def run_sections(args: argparse.Namespace, options: Options, report: dict) -> dict[str, dict]:
    """Every section's JSON entry, in order: run, or skipped (not selected, or no time left); the report is
    rewritten to ``--out`` after each one."""
    selected = set(selected_names(args))
    started = time.perf_counter()
    results = report["sections"] = {}
    for section in SECTIONS:
        left = args.time_limit - (time.perf_counter() - started)
        if section.name not in selected:
            results[section.name] = skipped(section, "not selected (--sections)")
        elif left <= 0:
            results[section.name] = skipped(section, f"the run's time limit ({args.time_limit:.0f} s) was reached")
        else:
            results[section.name] = run_section(section, options, time_cap=left,
                                                inject_failure=section.name in args.inject_failure)
            write_json(args.out, report)
    return results


def missing_required(sections: dict[str, dict], selected=SECTION_NAMES) -> dict[str, list[str]]:
    """Per selected lossless section, the required models it has no row for (skipped by a budget or the limit)."""
    missing = {}
    for name in LOSSLESS_SECTIONS:
        if name in selected and name in sections:
            seen = {row.get("model") for row in sections[name].get("rows", [])}
            lacking = [model for model in REQUIRED_MODELS if model not in seen]
            if lacking:
                missing[name] = lacking
    return missing


def exit_code(sections: dict[str, dict], selected=None) -> int:
    if any(failed_checks(sections.get(name, {}).get("rows", [])) for name in LOSSLESS_SECTIONS):
        return EXIT_LOSSLESS_MISMATCH
    if any(result["status"] == "error" for result in sections.values()):
        return EXIT_SECTION_ERROR
    if missing_required(sections, SECTION_NAMES if selected is None else selected):
        return EXIT_INCOMPLETE
    return EXIT_OK


def _cpu_fast_paths(cpu: bool):
    """On a CPU rehearsal, let the CUDA-only fast paths run their exact CPU emulations, so that it goes through the
    same fast-path code (and counts) as the GPU run: the test suite's helper (tests/_cpu_fast_paths.py, loaded by
    its path from this checkout; accelpatch has no such switch). A GPU run never uses it."""
    if not cpu:
        return contextlib.nullcontext()
    import importlib.util

    spec = importlib.util.spec_from_file_location("_cpu_fast_paths", REPO_ROOT / "tests" / "_cpu_fast_paths.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    return helper.run_fast_paths_on_cpu()


def write_json(path: str, report: dict) -> None:
    """Write ``report`` to ``path`` atomically (a temporary file, then a rename): a run killed mid-write leaves the
    previous section's complete file, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    os.replace(temporary, target)


def summary_line(code: int, sections: dict[str, dict], missing: dict[str, list[str]] | None = None) -> str:
    counts = {status: sum(r["status"] == status for r in sections.values()) for status in ("ok", "error", "skipped")}
    verdict = {EXIT_OK: "ok", EXIT_LOSSLESS_MISMATCH: "LOSSLESS BIT-IDENTITY FAILED",
               EXIT_SECTION_ERROR: "some sections errored", EXIT_INCOMPLETE: "INCOMPLETE"}[code]
    line = (f"sections: {counts['ok']} ok, {counts['error']} error, {counts['skipped']} skipped; "
            f"exit {code} ({verdict})")
    if missing:
        line += "; required lossless models not checked: " + "; ".join(
            f"{name}: {', '.join(models)}" for name, models in missing.items())
    return line


def warm_up_cpu_kernels() -> dict:
    """Build (or load) the fused CPU kernels before the first section: a cold C++ build takes minutes on a small
    machine and, inside a section, would be charged to its hard limit."""
    from accelpatch.lossless.kernels import cpu_build

    started = time.perf_counter()
    _, reason = cpu_build.load()
    seconds = round(time.perf_counter() - started, 1)
    print(f"fused CPU kernels: {'not available: ' + reason if reason else 'ready'} ({seconds} s, before the sections)",
          flush=True)
    return {"cpu_kernels_s": seconds, "cpu_kernels": reason or "ready"}


def dry_run(args: argparse.Namespace, options: Options, report: dict) -> int:
    """The plan: each selected section's GPU-size builds on meta, the time plan; a table, the JSON; 0 or 3."""
    selected = [section for section in SECTIONS if section.name in selected_names(args)]
    sections = timed_plan(selected, options)
    problems = plan_check(selected, args.time_limit)
    total = sum(section.budget_s for section in selected)
    code = EXIT_SECTION_ERROR if problems or any(r["status"] != "ok" for r in sections.values()) else EXIT_OK
    report.update(exit_code=code, sections=sections,
                  plan={"budgets_s": total, "time_limit_s": args.time_limit, "plan_limit_s": PLAN_LIMIT_S,
                        "problems": problems})
    write_json(args.out, report)
    print("\n" + format_table(sections))
    print(f"plan: {len(selected)} sections, budgets {total:g} s + start-up, limit {args.time_limit:g} s "
          f"(at most {PLAN_LIMIT_S:g} s)" + "".join(f"\nPLAN PROBLEM: {p}" for p in problems))
    print(f"{summary_line(code, sections)}; wrote {args.out}", flush=True)
    return code


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.dry_run or args.cpu) and not torch.cuda.is_available():
        print(f"run_all.py: no CUDA device is visible (torch {torch.__version__}, CUDA build {torch.version.cuda}): "
              "this run needs one GPU. Use --dry-run to check the plan, or --cpu to run the sections at tiny shapes "
              "on CPU.", file=sys.stderr)
        return EXIT_USAGE
    options = Options(dry_run=args.cpu, device="cpu" if args.cpu else "cuda", repeats=args.repeats,
                      taus=tuple(args.taus) if args.taus else None, kv_splits=tuple(args.kv_splits))
    report = {"device": device_name(args), "torch": torch.__version__, "accelpatch": accelpatch.__version__,
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "dry_run": args.dry_run, "cpu": args.cpu, "arguments": sys.argv[1:] if argv is None else list(argv),
              "exit_code": None}
    print(f"GPU evidence on {report['device']}: torch {report['torch']}, accelpatch {report['accelpatch']}",
          flush=True)
    if args.dry_run:
        return dry_run(args, options, report)
    if args.cpu:
        report["warm_up"] = warm_up_cpu_kernels()
    with _cpu_fast_paths(args.cpu):
        sections = run_sections(args, options, report)
    selected = selected_names(args)
    code, missing = exit_code(sections, selected), missing_required(sections, selected)
    report.update(exit_code=code, missing_required=missing)
    write_json(args.out, report)
    print("\n" + format_table(sections))
    print(f"{summary_line(code, sections, missing)}; wrote {args.out}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
