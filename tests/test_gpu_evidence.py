"""``benchmarks/gpu/run_all.py`` checked on CPU, where no GPU is: the CPU rehearsal (``--cpu``: tiny shapes, same
code) writes every section with finite numbers and bit-identical lossless rows and prints them; a broken section is
recorded while the others run; without ``--dry-run``/``--cpu`` a CPU-only machine gets exit code 2. The dry run
builds every section's GPU-size models on the meta device under a CUDA-like device check and checks the 8-minute
plan; the JSON is rewritten after every section; a section's time limit cannot be swallowed by a fast path's
fallback; an unchecked required lossless model fails the run (issue #31)."""
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
            "sana_video2_step", "sol_attn_vs_flash", "minimax_h3_layers", "wan_step", "step_cache", "compile")
MODELS = ("SANA-Video", "SANA-Video 2.0", "MiniMax-H3")


def run_all(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run the script in a fresh process (one thread, Triton interpreter, as tests/conftest.py sets them)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    env.pop("ACCELPATCH_FUSE_MIN_ELEMENTS", None)  # as on the GPU machine: the default tier's size floor in force
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    return proc, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The CPU rehearsal (``--cpu``): every section's code at tiny shapes, one timed call per measurement (CPU
    timings are not the point, and the suite's time is short)."""
    return run_all(tmp_path_factory.mktemp("gpu_evidence") / "tmp.json", "--cpu", "--repeats", "1")


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
    assert report["cpu"] is True and report["exit_code"] == 0
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
    cache = [row for row in sections["step_cache"]["rows"] if row["setting"].startswith("cache")]
    assert cache and all(0 < row["reuse_fraction"] < 1 for row in cache), cache
    compiled = {row["setting"]: row for row in sections["compile"]["rows"]}
    assert {"eager, unpatched", "compiled, unpatched", "compiled, default tier"} <= set(compiled)


def test_table_names_every_section(dry_run):
    stdout = dry_run[0].stdout
    for name in SECTIONS:
        assert f"== {name}: ok (" in stdout
    assert "exit 0" in stdout.splitlines()[-1]


def test_a_broken_section_is_recorded_and_the_others_still_run(tmp_path):
    proc, report = run_all(tmp_path / "broken.json", "--cpu", "--repeats", "1", "--sections", "sana_video_linear_attention",
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
    lossless = {"status": "ok", "rows": [{"model": m, "required": True, "identical": m != "MiniMax-H3"}
                                         for m in MODELS]}
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "error"}}) == 1
    lossless["rows"][-1]["identical"] = True
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "error"}}) == 3
    assert run_all_module.exit_code({"lossless_bit_identity": lossless, "x": {"status": "skipped"}}) == 0
    speed = {"status": "ok", "rows": [{"model": "SANA-Video", "required": True, "identical": False}]}  # differed
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
    from accelpatch.core.reporting import SiteReport

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


# -- issue #31: the GPU run's own configurations, checked on CPU ----------------------------------------------------


def _gpu_module(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return importlib.import_module(name)


def test_every_section_builds_its_gpu_size_models_on_meta(monkeypatch):
    """Regression (issue #31, 1): nothing on CPU built the GPU configurations, so ``num_layers=4`` (SANA-Video 2.0
    takes ``depth``) and a CPU generator drawing under ``torch.device("cuda")`` only failed on the GPU. Every
    section's builds run here at GPU size on meta (standing for cuda) under the device check, as ``--dry-run``
    does."""
    run_all_module = _gpu_module(monkeypatch, "run_all")
    plan = _gpu_module(monkeypatch, "_plan")
    options = run_all_module.Options(dry_run=False, device="cuda", repeats=1)
    results = plan.timed_plan(run_all_module.SECTIONS, options)
    assert tuple(results) == SECTIONS
    for name, result in results.items():
        assert result["status"] == "ok", (name, result.get("error"))
        assert result["rows"] and all(row["devices"] == "meta" for row in result["rows"]), name
    # GPU sizes, not the rehearsal's tiny ones: the 5B step and release-width lossless models
    assert results["sana_video2_step"]["rows"][0]["params_b"] > 4
    speed = {row["build"]: row for row in results["lossless_speed"]["rows"]}
    assert set(speed) == set(MODELS) and speed["SANA-Video 2.0"]["params_b"] > 0.5


def test_the_device_check_refuses_a_cpu_generator_for_another_device(monkeypatch):
    """CPU and meta tensors accept a CPU generator silently; CUDA does not. The check used by the dry run raises as
    CUDA does, and passes matching generators and draws without one."""
    plan = _gpu_module(monkeypatch, "_plan")
    with plan.DeviceCheck(), torch.device("meta"):
        with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator"):
            torch.randn(4, generator=torch.Generator().manual_seed(0))
        assert torch.randn(4).device.type == "meta"
        assert torch.randn(4, generator=torch.Generator().manual_seed(0), device="cpu").device.type == "cpu"


def test_the_sana_video2_factory_builds_under_a_cuda_like_default_device(monkeypatch):
    """Regression (issue #31, 1): ``tiny_sana_video2_transformer`` under ``build_on("cuda", ...)`` drew its
    Attention Residual weights with a CPU generator on the default (CUDA) device, and built on the CPU first."""
    from accelpatch.testing import SANA_VIDEO2_TINY_CONFIG, tiny_sana_video2_transformer

    plan, accel = _gpu_module(monkeypatch, "_plan"), _gpu_module(monkeypatch, "_accel")
    with plan.DeviceCheck():
        model = accel.build_on("meta", tiny_sana_video2_transformer, SANA_VIDEO2_TINY_CONFIG, depth=4,
                               dtype=torch.bfloat16)
    assert {p.device.type for p in model.parameters()} == {"meta"} and model.config.depth == 4
    # on the CPU the weights are the ones the factory always drew
    first, again = tiny_sana_video2_transformer(), tiny_sana_video2_transformer()
    assert torch.equal(first.attn_res.attn_proj.weight, again.attn_res.attn_proj.weight)


@pytest.mark.parametrize("family", ("sana_video", "sana_video2", "minimax_h3"))
def test_multi_gpu_builds_its_gpu_configurations_on_meta(monkeypatch, family):
    """Regression (issue #31, 1): ``multi_gpu.py`` built SANA-Video 2.0 with ``num_layers=4`` as well."""
    multi_gpu, plan = _gpu_module(monkeypatch, "multi_gpu"), _gpu_module(monkeypatch, "_plan")
    with plan.DeviceCheck():
        model, inputs = multi_gpu._case(family, dry_run=False, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert all(t.device.type == "meta" for t in inputs.values() if isinstance(t, torch.Tensor))


def test_the_json_is_written_after_every_section(monkeypatch, tmp_path):
    """Regression (issue #31, 2): the JSON was written once, after the last section, so a run killed at its limit
    returned nothing. The second section finds the first one's result already on disk."""
    run_all_module = _gpu_module(monkeypatch, "run_all")
    runner = _gpu_module(monkeypatch, "_runner")
    out = tmp_path / "evidence.json"
    seen = {}

    def first(ctx):
        ctx.add(value=1)

    def second(ctx):
        seen.update(json.loads(out.read_text()))
        ctx.add(value=2)
    monkeypatch.setattr(run_all_module, "SECTIONS", (runner.Section("first", 5, first, "one"),
                                                     runner.Section("second", 5, second, "two")))
    monkeypatch.setattr(run_all_module, "REQUIRED_MODELS", ())
    assert run_all_module.main(["--cpu", "--out", str(out)]) == 0
    assert seen["sections"]["first"]["rows"] == [{"value": 1}] and seen["exit_code"] is None
    final = json.loads(out.read_text())
    assert final["exit_code"] == 0 and final["sections"]["second"]["rows"] == [{"value": 2}]
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file and a rename


def test_the_default_out_is_the_output_folder(monkeypatch, tmp_path):
    """Regression (issue #31, 2): the default was the repository root, which does not come back from the lent
    machine; it is ``$OUT`` when set."""
    run_all_module = _gpu_module(monkeypatch, "run_all")
    monkeypatch.setenv("OUT", str(tmp_path))
    assert run_all_module.parse_args([]).out == str(tmp_path / "gpu_evidence.json")
    monkeypatch.delenv("OUT")
    assert Path(run_all_module.parse_args([]).out).parent == REPO / "out"


def test_a_section_timeout_is_not_swallowed_by_a_fast_paths_fallback(monkeypatch):
    """Regression (issue #31, 3): ``SectionTimeout`` was an ``Exception``; raised by the alarm inside a fused op's
    first sight (a cold kernel build), the op's ``except Exception`` declined it and ran the reference on past
    the limit. Now it passes through the fast path, and only the section runner catches it."""
    from accelpatch.lossless import verify
    from accelpatch.lossless.kernels.library import Kernel, KernelLibrary
    from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer

    runner = _gpu_module(monkeypatch, "_runner")
    accel = _gpu_module(monkeypatch, "_accel")

    def alarm(*_args):
        raise runner.SectionTimeout("ran past its hard limit of 1 s")

    stand_in = KernelLibrary("cpu", "CPU", lambda name, check, args: check(*args))
    monkeypatch.setattr(verify.FusedOp, "implementation",
                        lambda self, device: (Kernel(self.name, stand_in, alarm, lambda *a: None), None))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the CPU fused path runs single-threaded only
    model = tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = sana_video_transformer_inputs(model, batch_size=1)
    with accel.patched(model), torch.no_grad():
        with pytest.raises(runner.SectionTimeout):
            model(**inputs)
    for op in verify.ops().values():
        op.forget()

    def slow(ctx):
        ctx.add(started=True)
        alarm()
    result = runner.run_section(runner.Section("slow", 5, slow, "times out"), runner.Options(True, "cpu", 1),
                                time_cap=5)
    assert result["status"] == "error" and result["error"].startswith("SectionTimeout")
    assert result["rows"] == [{"started": True}]
    assert not issubclass(runner.SectionTimeout, Exception)  # no other ``except Exception`` can take it either


def test_is_fatal_lets_any_non_exception_through():
    """A caller's time limit (any ``BaseException`` that is not an ``Exception``) is never a kernel's failure."""
    from accelpatch.core.errors import is_fatal

    class Alarm(BaseException):
        pass
    assert is_fatal(Alarm()) and is_fatal(KeyboardInterrupt()) and not is_fatal(RuntimeError("no kernel"))


def test_an_unchecked_required_lossless_model_fails_the_run(monkeypatch):
    """Regression (issue #31, 4): a budget that skipped SANA-Video 2.0 and MiniMax-H3 in a lossless section left
    exit code 0. Now it is 4 and the summary names them; a section not selected is not required."""
    run_all_module = _gpu_module(monkeypatch, "run_all")
    rows = [{"model": "SANA-Video", "required": True, "identical": True}]
    sections = {"lossless_bit_identity": {"status": "ok", "rows": rows},
                "lossless_speed": {"status": "ok", "rows": [dict(row, model=m) for row in rows for m in MODELS]}}
    assert run_all_module.exit_code(sections) == run_all_module.EXIT_INCOMPLETE == 4
    missing = run_all_module.missing_required(sections)
    assert missing == {"lossless_bit_identity": ["SANA-Video 2.0", "MiniMax-H3"]}
    line = run_all_module.summary_line(4, sections, missing)
    assert "exit 4 (INCOMPLETE)" in line and "SANA-Video 2.0, MiniMax-H3" in line
    assert run_all_module.exit_code(sections, selected=("lossless_speed",)) == 0
    skipped = {"lossless_bit_identity": {"status": "skipped", "rows": []}}  # the time limit came first
    assert run_all_module.exit_code(skipped, selected=("lossless_bit_identity",)) == 4


def test_the_plan_fits_eight_minutes_and_an_overlong_one_is_refused(monkeypatch):
    """The sections' budgets plus start-up fit the default time limit, which is at most 8 minutes; a plan past it
    is named as a problem (the dry run then exits 3)."""
    run_all_module = _gpu_module(monkeypatch, "run_all")
    plan = _gpu_module(monkeypatch, "_plan")
    assert run_all_module.DEFAULT_TIME_LIMIT_S <= 480
    assert plan.plan_check(run_all_module.SECTIONS, run_all_module.DEFAULT_TIME_LIMIT_S) == []
    long = run_all_module.SECTIONS + (run_all_module.SECTIONS[0],)
    assert plan.plan_check(long, 480) and plan.plan_check(run_all_module.SECTIONS, 600)
    runner = _gpu_module(monkeypatch, "_runner")
    assert runner.hard_limit_s(100, time_cap=40) == 40  # a section's hard limit never passes the run's time left


def test_the_dry_run_builds_gpu_sizes_and_checks_the_plan_without_running(tmp_path):
    """Regression (issue #31, 5): ``--dry-run`` ran every section at tiny shapes with a cold C++ build inside the
    first (2-4 minutes). Now it plans: GPU-size builds on meta, the time plan; it prints the table and exits 0."""
    out = tmp_path / "dry.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELPATCH_PYTHON": sys.executable}
    proc = subprocess.run([str(SCRIPT.with_name("run_all.sh")), "--dry-run", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and tuple(report["sections"]) == SECTIONS
    assert all(section["status"] == "ok" for section in report["sections"].values())
    assert report["plan"]["problems"] == [] and report["plan"]["budgets_s"] <= 480
    assert f"plan: {len(SECTIONS)} sections" in proc.stdout and "warm_up" not in report  # no kernel build on a dry run


def test_the_lossless_rows_fused_whatever_the_size_floor(dry_run):
    """#40: with the default tier's size floor the section's small inputs would run the original forward, and the
    bit identity would hold by absence: the section fuses every call, and a lossless row that fused nothing fails."""
    _, report = dry_run
    rows = report["sections"]["lossless_bit_identity"]["rows"]
    default = [row for row in rows if row["check"] == "apply(), default tier"]
    assert [row["model"] for row in default] == list(MODELS) and all(row["fast_calls"] > 0 for row in default)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from _lossless import failed_checks
    finally:
        sys.path.remove(str(SCRIPT.parent))
    absent = {"model": "m", "check": "apply(), default tier", "required": True, "identical": True, "fast_calls": 0}
    assert failed_checks([absent]) == [absent]
    assert failed_checks([{**absent, "fast_calls": 3}]) == []

