"""``benchmarks/gpu/run_all.py`` checked on CPU, where no GPU is: the dry run (tiny shapes, same code) writes every
section with finite numbers and bit-identical lossless rows and prints them; a broken section is recorded while the
others run; without ``--dry-run`` a CPU-only machine gets exit code 2 and a pointer to ``--dry-run``."""
from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "run_all.py"
SECTIONS = ("lossless_bit_identity", "lossless_speed", "sana_video_linear_attention", "sana_video2_anchor",
            "sana_video2_step", "sol_attn_vs_flash", "minimax_h3_layers", "wan_step")
MODELS = ("SANA-Video", "SANA-Video 2.0", "MiniMax-H3")


def run_all(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run the script in a fresh process (one thread, Triton interpreter, as tests/conftest.py sets them)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    return proc, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    return run_all(tmp_path_factory.mktemp("gpu_evidence") / "tmp.json", "--dry-run")


def numbers(value):
    """Every int or float (not bool) inside a JSON value."""
    if isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_dry_run_exits_0_with_every_section_ok(dry_run):
    proc, report = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {"device", "torch", "accelpatch", "started", "sections"} <= set(report)
    assert report["dry_run"] is True and report["exit_code"] == 0
    assert tuple(report["sections"]) == SECTIONS
    for name, section in report["sections"].items():
        assert section["status"] == "ok", (name, section.get("error"))
        assert section["rows"], name
        assert isinstance(section["seconds"], float) and "error" not in section


def test_dry_run_numbers_are_finite(dry_run):
    _, report = dry_run
    values = list(numbers(report["sections"]))
    assert values and all(math.isfinite(v) for v in values)


def test_lossless_rows_are_bit_identical_and_the_control_ran_fast_paths(dry_run):
    rows = dry_run[1]["sections"]["lossless_bit_identity"]["rows"]
    assert {row["model"] for row in rows} == set(MODELS)
    required = [row for row in rows if row["required"]]
    assert required and all(row["identical"] for row in required)
    for model in MODELS:
        checks = {row["check"]: row for row in rows if row["model"] == model}
        assert {"apply(), default tier", "apply(), quality('lossless')", "after remove()"} <= set(checks)
        assert len({checks[c]["sha256"] for c in checks if checks[c]["required"]}) == 1
        # the lower tiers are identical by gating: the approximate paths ran in the control and nowhere else
        assert checks["control: quality('high')"]["high_calls"] > 0
        assert all(checks[c]["high_calls"] == 0 for c in checks if checks[c]["required"] and "high_calls" in checks[c])
        # while the default tier ran the lossless fused kernels and still matched bit for bit
        assert checks["apply(), default tier"]["fast_calls"] > 0


def test_the_lossless_speed_rows_are_bit_identical_and_name_the_fused_ops_that_ran(dry_run):
    rows = dry_run[1]["sections"]["lossless_speed"]["rows"]
    assert {row["model"] for row in rows} == set(MODELS)
    for model in MODELS:
        unpatched, fused = [row for row in rows if row["model"] == model]
        assert unpatched["check"] == "unpatched" and fused["required"] and fused["identical"]
        assert fused["sha256"] == unpatched["sha256"] and fused["speedup"] > 0
        assert fused["fused"] != "none" and fused["declined"] is None, fused


def test_sections_report_their_fast_paths(dry_run):
    sections = dry_run[1]["sections"]
    high = [row for row in sections["sana_video_linear_attention"]["rows"] if row["setting"] == "quality('high')"]
    assert high and all(row["fast_calls"] >= 1 for row in high)  # the high sites' own calls, not the lossless ones
    exact = [row for row in sections["sana_video_linear_attention"]["rows"] if row["setting"] == "quality('exact')"]
    assert exact and all(row["fast_calls"] == 0 and "lossless_calls" not in row for row in exact)
    sol = [row for row in sections["sana_video2_anchor"]["rows"] if row["setting"].startswith("Sol-Attn")]
    assert sol and all(0 < row["exact_fraction"] <= 1 for row in sol)
    assert {row["shape"] for row in sections["sol_attn_vs_flash"]["rows"]} == {"minimax_h3", "sana_video2_anchor"}
    wan = [row for row in sections["wan_step"]["rows"] if row["setting"].startswith("sol_attn")]
    assert wan and all(row["fast_calls"] >= 1 and 0 < row["exact_fraction"] < 1 for row in wan), wan


def test_table_names_every_section(dry_run):
    stdout = dry_run[0].stdout
    for name in SECTIONS:
        assert f"== {name}: ok (" in stdout
    assert "exit 0" in stdout.splitlines()[-1]


def test_a_broken_section_is_recorded_and_the_others_still_run(tmp_path):
    proc, report = run_all(tmp_path / "broken.json", "--dry-run", "--sections", "sana_video_linear_attention",
                           "minimax_h3_layers", "--inject-failure", "sana_video_linear_attention")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    sections = report["sections"]
    broken = sections["sana_video_linear_attention"]
    assert broken["status"] == "error" and "injected failure" in broken["error"]
    assert sections["minimax_h3_layers"]["status"] == "ok" and sections["minimax_h3_layers"]["rows"]
    selected = {"sana_video_linear_attention", "minimax_h3_layers"}
    assert {name: sections[name]["status"] for name in SECTIONS if name not in selected} == \
        {name: "skipped" for name in SECTIONS if name not in selected}
    assert "== sana_video_linear_attention: error" in proc.stdout and "injected failure" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_exits_2_and_points_to_dry_run(tmp_path):
    proc, report = run_all(tmp_path / "none.json")
    assert proc.returncode == 2
    assert "--dry-run" in proc.stderr and "CUDA" in proc.stderr
    assert report is None


def test_a_failed_lossless_check_wins_over_section_errors(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    run_all_module = importlib.import_module("run_all")
    lossless = {"status": "ok", "rows": [{"required": True, "identical": False}]}
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "error"}}) == 1
    lossless["rows"][0]["identical"] = True
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "error"}}) == 3
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "skipped"}}) == 0
    speed = {"status": "ok", "rows": [{"required": True, "identical": False}]}  # the fused forward differed
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "lossless_speed": speed}) == 1


def test_budgets_stop_sweeps_and_the_hard_limit_interrupts(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    runner = importlib.import_module("_runner")
    ctx = runner.Context("demo", runner.Options(dry_run=True, device="cpu", repeats=1), budget_s=0.0)
    assert list(ctx.sweep([1, 2, 3], "taus")) == [1]  # the first point always runs
    assert ctx.notes and "skipped taus [2, 3]" in ctx.notes[0]
    with pytest.raises(runner.SectionTimeout):
        with runner.hard_limit(0.05):
            while True:
                pass


def test_a_high_row_whose_high_path_fell_back_shows_no_fast_calls(monkeypatch):
    """Regression (issue #17): the lossless sites' calls once counted as a high row's fast calls, so a high path
    that fell back still showed fast_calls > 0 next to the reference's time."""
    from accelpatch.reporting import SiteReport

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    accel = importlib.import_module("_accel")

    def site(kind, tier, fast, reference=None):
        return SiteReport(path="transformer_blocks.0.attn1", kind=kind, tier=tier, mounted=True, reason=None,
                          fast_calls=fast, reference_calls=reference or {}, fallback_calls={})
    fell_back = type("R", (), {"sites": (site("sana_video_linear_attention", "high", 0, {"fell back": 2}),
                                         site("sana_video_fused_linear_attention", "lossless", 2)),
                               "fallback_calls": {"fell back": 2}})()
    assert accel.fast_path_counts(fell_back, 2, "high") == {"fast_calls": 0, "lossless_calls": 1,
                                                            "fallbacks": "fell back (2)"}
    assert accel.fast_path_counts(fell_back, 2, "lossless") == {"fast_calls": 1, "fallbacks": "fell back (2)"}
